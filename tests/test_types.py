"""The code base stays mypy-clean (the configuration in pyproject.toml): part of the one test command.

mypy names modules after directories, so it runs in a temporary directory holding a symlink named
``jailbox`` to the checkout: module names resolve whatever the checkout's directory is called.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # mypy reads the same source whoever runs it

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mypy(tmp_path):
    (tmp_path / "jailbox").symlink_to(ROOT, target_is_directory=True)
    # every module of the package: the top level's (__init__, console, extras) and its packages
    targets = [f"jailbox/{f.name}" for f in sorted(ROOT.glob("*.py"))] + [
        "jailbox/sandbox",
        "jailbox/agent",
        "jailbox/cli",
    ]
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".cache"),
            *targets,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
