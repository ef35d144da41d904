"""``pip install .`` puts one name in site-packages, ``jailbox``, and a user's own ``sandbox.py``,
``agent.py`` or ``cli.py`` next to their script cannot take the place of jailbox's modules."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "tests")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
    return done


def _can_build_here() -> bool:
    """Can this environment build a wheel itself (setuptools with bdist_wheel, i.e. >= 70.1 or the
    wheel package)? Then no build environment is made, so no index is needed."""
    try:
        version = tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return version >= (70, 1) or (version >= (68, 0) and importlib.util.find_spec("wheel") is not None)


def _site_packages(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)


@pytest.mark.slow
def test_pip_install_adds_only_jailbox(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to the sources
    shutil.copytree(ROOT, source, ignore=LEFT_OUT)
    wheels = tmp_path / "wheels"
    isolation = ["--no-build-isolation", "--no-index"] if _can_build_here() else []  # else pip's index gives setuptools
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(wheels), str(source)])
    (wheel,) = wheels.glob("jailbox-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = _site_packages(venv)
    before = set(p.name for p in site.iterdir())
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
          "--no-index", "-q", str(wheel)])  # fmt: skip
    added = set(p.name for p in site.iterdir()) - before
    assert {name for name in added if not name.startswith("jailbox-")} == {"jailbox"}, added
    assert all(name == "jailbox" or name.endswith(".dist-info") for name in added), added

    # every module of the checkout is installed, at the path its import name says
    wanted = {p.relative_to(ROOT) for p in [ROOT / "__init__.py", ROOT / "cli.py"]}
    wanted |= {p.relative_to(ROOT) for package in ("sandbox", "agent") for p in (ROOT / package).rglob("*.py")}
    installed = {p.relative_to(site / "jailbox") for p in (site / "jailbox").rglob("*.py")}
    assert wanted <= installed, sorted(map(str, wanted - installed))

    # importing the package costs nothing (its names are lazy), so it works without its dependencies
    where = _run([str(venv / "bin" / "python"), "-c", "import jailbox; print(jailbox.__file__)"]).stdout
    assert where.strip() == str(site / "jailbox" / "__init__.py")


SCRIPT = """\
from jailbox import Sandbox
import jailbox.agent, jailbox.cli

with Sandbox() as sb:
    result = sb.exec("echo from the jail")
assert result.exit_code == 0 and result.stdout == "from the jail\\n", result
print("ok")
"""


def test_a_users_own_sandbox_agent_and_cli_modules_do_not_shadow_jailbox(tmp_path):
    for name in ("sandbox", "agent", "cli"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    (tmp_path / "main.py").write_text(SCRIPT)
    done = _run([sys.executable, "main.py"], cwd=tmp_path, timeout=120)  # its directory is sys.path[0]
    assert done.stdout.strip() == "ok"
