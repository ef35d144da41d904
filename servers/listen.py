"""A server's command-line value it cannot serve with, and an address it cannot listen on, as one line.

Runs in the serving host process (``jailbox serve``, ``jailbox mcp --http``, ``jailbox openenv``). They
bind the address their ``--host`` and ``--port`` give; when the kernel refuses, the user learns which flag to
change and how, instead of an errno: the usual cause is a port another server (often another
``jailbox serve`` of the same user) already holds.
"""

from __future__ import annotations

import errno
import socket

from ..sandbox.errors import ServerError


class BadFlag(ServerError, ValueError):
    """A command-line value a server cannot serve with; ``flag`` names the option."""

    def __init__(self, flag: str, text: str) -> None:
        super().__init__(text)
        self.flag = flag


def refused(host: str, port: int, exc: OSError) -> BadFlag:
    """Why ``host:port`` cannot be listened on, naming the flag that would fix it."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        reason = exc.strerror or str(exc)
        return BadFlag("--host", f"cannot listen on {host}: {reason} (not an address of this machine)")
    if exc.errno == errno.EADDRINUSE:
        return BadFlag("--port", f"{shown} is in use by another program (perhaps another jailbox server)")
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return BadFlag("--port", f"cannot listen on {shown}: ports below 1024 need privileges")
    return BadFlag("--port", f"cannot listen on {shown}: {exc.strerror or exc}")


def bound(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), or ``BadFlag`` naming what to change."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise refused(host, port, exc) from None
    return sock
