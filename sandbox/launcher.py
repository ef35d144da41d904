"""Host side of the launcher: start it once per process, ask it for jails.

Requests from any number of threads go over one seqpacket socket; each carries its own reply
socket, so there is no lock on the request path and no reader thread.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import threading

from .errors import SandboxSetupError
from .floor import boot, wire

REPLY_TIMEOUT = 60.0
REMOVE_TIMEOUT = 3600.0
"""How long a caller waits for the removal of a tree owned by subordinate ids: a huge tree takes long,
and the removing process is the launcher's child, not the launcher, so no other request waits for it."""


class Launcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._pid = 0

    def _ensure(self) -> socket.socket:
        with self._lock:
            alive = self._proc is not None and self._proc.poll() is None
            if self._sock is None or not alive or self._pid != os.getpid():
                self._start()
            assert self._sock is not None
            return self._sock

    def _start(self) -> None:
        _raise_nofile_limit()
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        mine, theirs = wire.seqpacket_pair()
        self._proc = subprocess.Popen(
            boot.command("sandbox.child.zygote", str(theirs.fileno()), str(os.getpid())),
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
        theirs.close()
        self._sock = mine
        self._pid = os.getpid()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def request(self, req: dict, max_fds: int = 2, timeout: float = REPLY_TIMEOUT) -> tuple[dict, list[int]]:
        sock = self._ensure()
        mine, theirs = wire.seqpacket_pair()
        with mine:
            try:
                wire.send(sock, req, [theirs.fileno()])
            except OSError as exc:
                raise SandboxSetupError(f"the jailbox launcher is gone: {exc}") from exc
            finally:
                theirs.close()
            if not wire.wait_readable(mine, timeout):
                raise SandboxSetupError("the jailbox launcher did not answer in time")
            try:
                msg = wire.recv(mine, max_fds=max_fds)
            except wire.WireError as exc:
                raise SandboxSetupError(f"bad reply from the jailbox launcher: {exc}") from exc
        if msg is None:
            raise SandboxSetupError("the jailbox launcher closed the request without an answer")
        return msg


def _raise_nofile_limit() -> None:
    """Each open sandbox holds two or three descriptors in this process (control socket, pidfd, and
    the sock_diag socket the watcher counts its sockets through): lift the soft limit to the hard one
    (as Go's runtime does) so hundreds of sandboxes fit under a default soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


LAUNCHER = Launcher()
