"""Who listens on a service socket, as the kernel tells a client (runs in the test process)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path


def listener_pid(path: Path) -> int | None:
    """The pid of the process listening on the seqpacket socket at ``path`` (SO_PEERCRED); None when none listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]
