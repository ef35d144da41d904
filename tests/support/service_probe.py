"""Who listens on a service socket, as the kernel tells a client, and when that process has ended;
a per-user service of a test's own and the CLI run against it (runs in the test process)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

from support.cli import JAILBOX
from support.waits import wait_until

HANG = 120  # seconds: a hang guard only, never a measure


@contextlib.contextmanager
def own_service() -> Iterator[dict[str, str]]:
    """The environment of a state directory (so a per-user service) of the test's own; every sandbox
    in it stopped and the service ended after."""
    base = tempfile.mkdtemp(prefix="jbp-", dir="/tmp")  # short: a UNIX socket's path has at most 107 bytes
    env = {**os.environ, "JAILBOX_STATE_DIR": base, "JAILBOX_SERVICE_IDLE": "600"}
    try:
        yield env
    finally:
        subprocess.run([*JAILBOX, "stop", "--all"], env=env, capture_output=True, timeout=HANG)
        pid_file = Path(base) / "service.sock"
        if pid_file.exists():
            pid = listener_pid(pid_file)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
                assert ended(pid, HANG)
        shutil.rmtree(base, ignore_errors=True)


def jailbox(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with ``args`` in ``env``, its output as text."""
    return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, env=env, timeout=HANG)


def listener_pid(path: Path) -> int | None:
    """The pid of the process listening on the seqpacket socket at ``path`` (SO_PEERCRED); None when none listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]


def ended(pid: int, timeout: float) -> bool:
    """That ``pid`` ended within ``timeout`` seconds: true, or the test fails. A zombie has ended: a service
    outlives the client that started it, so its parent is the host's init, which reaps when it likes (this
    VM's, 1-2 s late)."""
    return wait_until(lambda: _ended(pid), f"pid {pid} to end", timeout, every=0.02)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
