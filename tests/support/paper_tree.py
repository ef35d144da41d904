"""The default recipe's tree (the paper's environment), built once and kept between test runs.

Building it compiles CPython, which takes many minutes on a small machine, so the tests that need
it share one build: a store of its own under ``JAILBOX_TEST_TREES`` (default
``~/.cache/jailbox-test-trees``, per user), in a
folder named by a hash of the recipe file, so editing the recipe builds anew and drops the old tree.
The build is the CLI's, with no arguments, as docs/rootfs.md tells a user to run it. The tests that
use it are marked ``root``: CI builds it in its root pass only, to stay within its time budget (the
rootless build path is the custom recipe test's, which runs in both passes).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

from conftest import need, require

from jailbox.sandbox.rootfs import shipped
from jailbox.sandbox.rootfs.store import Store
from support.cli import JAILBOX

NAME = "default"
SOURCES = ("http://deb.debian.org/debian/dists/trixie/Release", "https://pypi.org/simple/numpy/")
BUILD_TIMEOUT = 3 * 3600  # a hang guard: two loaded cores take about half an hour


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=20):
            return True
    except OSError:
        return False


_outcome: list[Path | BaseException] = []  # this process's one try: a failed build is not retried per test


def paper_store() -> Path:
    """The store holding the default recipe's current tree as ``default``, built if it is missing
    (one build at a time across processes: the others wait for it and use it). Under pytest-xdist the
    tests that use it are one group, on one worker (``conftest``), which waits for the build in each
    test's setup, before it counts as running beside a test marked ``alone``."""
    if not _outcome:
        try:
            _outcome.append(_build())
        except BaseException as exc:  # a skip or a failure: each test that needs the tree raises it
            _outcome.append(exc)
    outcome = _outcome[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _build() -> Path:
    need("mmdebstrap")
    need("subids")
    recipe = (shipped.directory() / f"{NAME}.yaml").read_bytes()
    base = Path(os.environ.get("JAILBOX_TEST_TREES") or Path.home() / ".cache" / "jailbox-test-trees")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    base.chmod(0o700)  # the store refuses a folder others can read: trees hold setuid files
    root = base / hashlib.sha256(recipe).hexdigest()[:16]
    with open(base / "lock", "w") as lock:  # one build at a time, whoever else is testing
        fcntl.flock(lock, fcntl.LOCK_EX)
        if Store(root).get(NAME) is not None:
            return root
        unreachable = [url for url in SOURCES if not _reachable(url)]
        require(
            not unreachable,
            f"Debian's archive and PyPI to build the default recipe once (unreachable: {', '.join(unreachable)})",
            "allow this machine to reach deb.debian.org and pypi.org, or set JAILBOX_TEST_TREES to a folder "
            "holding a build of this recipe",
        )
        for old in base.iterdir():
            if old.is_dir() and old != root:
                stale = Store(old)
                for entry in stale.list():
                    stale.remove(entry.name, force=True)
                shutil.rmtree(old)
        root.mkdir(mode=0o700, exist_ok=True)
        env = {**os.environ, "JAILBOX_CACHE_DIR": str(root)}
        # at the scheduler's usual priority: the tests that wait for it are the last of a pass to end
        argv = [*JAILBOX, "rootfs", "build", "--quiet"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            _, stderr = proc.communicate(timeout=BUILD_TIMEOUT)
        except BaseException:  # a test's timeout, Ctrl-C: the build removes what it half made
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        assert proc.returncode == 0, stderr[-4000:]
        return root
