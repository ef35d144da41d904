"""Host side of the launcher: start it once per process, ask it for jails.

Requests from any number of threads go over one seqpacket socket; each carries its own reply
socket, so there is no lock on the request path and no reader thread.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import threading

from .child.protocol import LauncherUp, decode
from .errors import SandboxSetupError
from .floor import boot, wire

REPLY_TIMEOUT = 60.0
REMOVE_TIMEOUT = 3600.0
"""How long a caller waits for the removal of a tree owned by subordinate ids: a huge tree takes long,
and the removing process is the launcher's child, not the launcher, so no other request waits for it."""


class Launcher:
    """The launcher is not this process's child: its first process forks it and ends (``LauncherUp``),
    in a session of its own, so that what kills this process's children or its process group when it
    ends leaves alive the one that cleans up after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None  # of the launcher: readable once it has ended
        self._launcher = 0  # its pid
        self._pid = 0  # this process's, when it started it (a forked child starts its own)

    def _ensure(self) -> socket.socket:
        with self._lock:
            if self._sock is None or self._pid != os.getpid() or self._ended():
                self._start()
            assert self._sock is not None
            return self._sock

    def _ended(self) -> bool:
        return self._pidfd is None or wire.wait_readable(self._pidfd, 0)

    def _start(self) -> None:
        _raise_nofile_limit()
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
            if self._pidfd is not None:
                os.close(self._pidfd)
        self._sock = self._pidfd = None
        mine, theirs = wire.seqpacket_pair()
        with theirs:
            first = subprocess.Popen(
                boot.command("sandbox.child.zygote", str(theirs.fileno()), str(os.getpid())),
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,  # `kill -9 -PGID` of this process's group leaves it out
            )
        try:
            self._launcher, self._pidfd = _hello(mine)
        except BaseException:
            mine.close()
            raise
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                first.wait(REPLY_TIMEOUT)  # it ends as soon as it has forked the launcher
        self._sock, self._pid = mine, os.getpid()

    @property
    def pid(self) -> int | None:
        return self._launcher or None

    def request(
        self, req: dict, max_fds: int = 2, timeout: float = REPLY_TIMEOUT, fds: tuple[int, ...] = ()
    ) -> tuple[dict, list[int]]:
        """Send ``req`` with a reply socket and ``fds`` (which stay the caller's); its answer."""
        sock = self._ensure()
        mine, theirs = wire.seqpacket_pair()
        with mine:
            try:
                wire.send(sock, req, [theirs.fileno(), *fds])
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


def _hello(sock: socket.socket) -> tuple[int, int]:
    """The launcher's pid and pidfd, from its first message."""
    if not wire.wait_readable(sock, REPLY_TIMEOUT):
        raise SandboxSetupError("the jailbox launcher did not start in time")
    fds: list[int] = []
    try:
        msg = wire.recv(sock, max_fds=1)
        if msg is None:
            raise SandboxSetupError("the jailbox launcher ended as it started (what it printed is above)")
        fds = msg[1]
        up = decode(msg[0], LauncherUp)
        if not isinstance(up, LauncherUp) or len(fds) != 1:
            raise wire.WireError(f"{msg[0]!r} with {len(fds)} descriptors")
        return up.pid, fds[0]
    except wire.WireError as exc:
        for fd in fds:
            os.close(fd)
        raise SandboxSetupError(f"bad first message from the jailbox launcher: {exc}") from exc


def _raise_nofile_limit() -> None:
    """Each open sandbox holds three or four descriptors in this process (control socket, pidfd, its
    writable layer's directory, and the sock_diag socket the watcher counts its sockets through):
    lift the soft limit to the hard one (as Go's runtime does) so hundreds of sandboxes fit under a
    default soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


LAUNCHER = Launcher()
