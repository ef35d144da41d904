"""jailbox as ``pip install .`` installs it: a wheel built from a copy of the checkout, and a venv of its own
(not this one, which holds the test extra) to install it into."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "tests")


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
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


def build_wheel(tmp: Path) -> Path:
    """jailbox's wheel, built in ``tmp`` from a copy of the checkout (building writes build/ and *.egg-info
    next to the sources)."""
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=LEFT_OUT)
    wheels = tmp / "wheels"
    isolation = ["--no-build-isolation", "--no-index"] if _can_build_here() else []  # else pip's index gives setuptools
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(wheels), str(source)])
    (wheel,) = wheels.glob("jailbox-*.whl")
    return wheel


def new_venv(path: Path) -> Path:
    """An empty venv (no pip: this interpreter's pip installs into it); its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> None:
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *args])


def site_packages(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)
