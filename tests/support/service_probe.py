"""Who listens on a service socket, as the kernel tells a client, and when that process has ended
(runs in the test process)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import psutil

from support.waits import wait_until


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
