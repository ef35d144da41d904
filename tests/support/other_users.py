"""Running this test's Python as other local users (root's tests only): the command prefix, a home
each user owns outside pytest's root-only temporary directories, and the check that they can start
this Python at all."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from conftest import require

OTHERS = ("jailbox-ci", "jbfresh")  # the accounts CI makes (.ci/run)


def as_user(user: str | None, home: Path) -> list[str]:
    """The prefix that runs a command as ``user`` with a clean environment (None: as this process)."""
    if user is None:
        return []
    return ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"]


def require_users(users: tuple[str, ...] = OTHERS) -> None:
    """Skip (naming the fix) unless each of ``users`` exists and can run this test's Python with
    jailbox: one under a directory only root may enter (pyenv's in /root, say) cannot start for them."""
    present = []
    for user in users:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            present.append(user)
    require(
        len(present) == len(users) and shutil.which("runuser") is not None,
        f"local users {', '.join(users)} and runuser",
        " && ".join(f"sudo useradd -m -s /bin/bash {user}" for user in users),
    )
    for user in users:
        probe = subprocess.run([*as_user(user, Path("/")), sys.executable, "-c", "import jailbox"], cwd="/")
        require(
            probe.returncode == 0,
            f"this test's Python ({sys.executable}) and jailbox, runnable by {user}",
            "make the virtual environment from a Python every user can run: /usr/bin/python3 -m venv .venv",
        )


@contextlib.contextmanager
def homes(users: tuple[str, ...] = OTHERS) -> Iterator[dict[str, Path]]:
    """A home (and with it a state directory and a store) for each user that exists, theirs, removed after."""
    base = Path(tempfile.mkdtemp(prefix="jbx-users-"))
    base.chmod(0o755)
    made = {}
    try:
        for user in users:
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(user)
                made[user] = base / user
                made[user].mkdir()
                os.chown(made[user], entry.pw_uid, entry.pw_gid)
        yield made
    finally:
        shutil.rmtree(base, ignore_errors=True)
