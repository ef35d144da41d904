"""``pip install .`` puts one name in site-packages, ``jailbox``, and a user's own ``sandbox.py``,
``agent.py`` or ``cli.py`` next to their script cannot take the place of jailbox's modules."""

from __future__ import annotations

import sys

import pytest
from support.wheels import ROOT, build_wheel, new_venv, pip_install, run, site_packages

pytestmark = pytest.mark.once  # the built package is the same whoever builds it


@pytest.mark.slow
def test_pip_install_adds_only_jailbox(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    python = new_venv(venv)
    site = site_packages(venv)
    before = set(p.name for p in site.iterdir())
    pip_install(python, "--no-deps", "--no-index", str(wheel))
    added = set(p.name for p in site.iterdir()) - before
    assert {name for name in added if not name.startswith("jailbox-")} == {"jailbox"}, added
    assert all(name == "jailbox" or name.endswith(".dist-info") for name in added), added

    # every module of the checkout is installed, at the path its import name says
    wanted = {p.relative_to(ROOT) for p in ROOT.glob("*.py")}  # __init__, cli, console, extras
    wanted |= {p.relative_to(ROOT) for package in ("sandbox", "agent") for p in (ROOT / package).rglob("*.py")}
    installed = {p.relative_to(site / "jailbox") for p in (site / "jailbox").rglob("*.py")}
    assert wanted <= installed, sorted(map(str, wanted - installed))

    # importing the package costs nothing (its names are lazy), so it works without its dependencies
    where = run([str(python), "-c", "import jailbox; print(jailbox.__file__)"]).stdout
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
    done = run([sys.executable, "main.py"], cwd=tmp_path, timeout=120)  # its directory is sys.path[0]
    assert done.stdout.strip() == "ok"
