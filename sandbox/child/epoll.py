"""Child side, in the jail's init: every epoll instance of the jail is made under one id that is not
its root's, so the watches the jail adds never count against its root's host uid.

The kernel charges an epoll watch to the user who made the instance it is added to (``ep->user``,
taken at ``epoll_create``), per host uid whatever the user namespace, up to
``fs.epoll.max_user_watches`` (about 4% of memory). A rootless jail's root is its caller's uid: one
jail that filled its watches left its user's own programs with ENOSPC. And each id a jail switches
to has a count of its own, so a jail could hold that much kernel memory once per id.

So the seccomp program sends ``epoll_create`` and ``epoll_create1`` to the init's listener
(``SeccompSpec.epoll_create1``), the init asks the maker for an instance, and installs the one it
gets back in the caller as the call's result (``SECCOMP_IOCTL_NOTIF_ADDFD`` with
``SECCOMP_ADDFD_FLAG_SEND``, Linux 5.14). The maker is a child of the init running as an id of
the jail that no other live jail's maker runs as (``SeccompSpec.epoll_maker``, a subordinate id on
the host; ``idmap.claim_maker``), started at the first call.
Its own calls are let through (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``), told apart by its pid, which
no other process can have before the init has reaped it. Every watch of the jail then counts
against that one host uid, and all of them together stay within one uid's ``max_user_watches``.

The maker lives in the jail, under the same filter, as an id any jail root may switch to, with no
descriptor but its socket: taking it over gives nothing a command does not have. A jail that kills
or stops its maker hurts only itself: the init never waits on it (a request it cannot send, or a
maker that is gone, answers ENOMEM), and starts another once the last is reaped. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import socket
import struct
from typing import NoReturn

from ..floor import linux as L

NOTIF_ADDFD = 0x40182103  # SECCOMP_IOCTL_NOTIF_ADDFD: _IOW('!', 3, struct seccomp_notif_addfd)
ADDFD_FLAG_SEND = 1 << 1  # the descriptor is also the call's result: one ioctl answers it
USER_NOTIF_FLAG_CONTINUE = 1  # let the call run as made (the maker's own)
EPOLL_CLOEXEC = os.O_CLOEXEC  # the one flag epoll_create1 takes
REQUEST = struct.Struct("Q")  # init -> maker: the notification's id
REPLY = struct.Struct("Qi")  # maker -> init: the id, and 0 with the instance attached, or an errno
NAME = b"jailbox-epoll"


class EpollMaker:
    """The init's side: answers the listener's epoll calls through the maker, never blocking on it."""

    def __init__(
        self, listener: int, poll: select.poll, create1: int, create: int, ids: int, slack: int, base: int
    ) -> None:
        self.listener = listener
        self.poll = poll  # the init's: the maker's socket is served with its requests
        self.create1 = create1  # the syscall numbers routed here; create is -1 where the arch has none
        self.create = create
        self.ids = ids  # the jail uid and gid the maker runs as
        self.slack = slack  # the init's timer-slack file: the maker must carry no command's tag
        self.base = base
        self.pid = 0  # the maker, until the init has reaped it
        self.sock: socket.socket | None = None
        self.pending: dict[int, int] = {}  # notification id -> the new descriptor's flags (O_CLOEXEC or 0)

    def routes(self, nr: int) -> bool:
        return nr in (self.create1, self.create)

    def notified(self, notif_id: int, pid: int, nr: int, arg0: int) -> None:
        """A jail process is blocked in ``epoll_create`` or ``epoll_create1``: make its instance."""
        if self.pid and pid == self.pid:
            self._respond(notif_id, 0, USER_NOTIF_FLAG_CONTINUE)
            return
        if nr == self.create:
            invalid, flags = struct.unpack("i", struct.pack("I", arg0 & 0xFFFFFFFF))[0] <= 0, 0
        else:
            flags = arg0 & 0xFFFFFFFF
            invalid = bool(flags & ~EPOLL_CLOEXEC)
        if invalid:
            self._respond(notif_id, -errno.EINVAL)
            return
        sock = self._maker()
        try:
            if sock is None:
                raise OSError(errno.ENOMEM, "no maker")
            sock.send(REQUEST.pack(notif_id))
        except OSError:  # gone, stopped with a full queue, or not to be started
            self._respond(notif_id, -errno.ENOMEM)
            return
        self.pending[notif_id] = os.O_CLOEXEC if flags else 0

    @property
    def fileno(self) -> int:
        return -1 if self.sock is None else self.sock.fileno()

    def made(self) -> None:
        """The maker answered: install its instance in the caller, or pass its error on."""
        assert self.sock is not None
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, REPLY.size + 1, 1)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._lost()
            return
        try:
            if len(data) != REPLY.size:
                return
            notif_id, error = REPLY.unpack(data)
            flags = self.pending.pop(notif_id, None)
            if flags is None:
                return
            if error or not fds:
                self._respond(notif_id, -(error if 0 < error < 4096 else errno.ENOMEM))
                return
            addfd = bytearray(struct.pack("QIIII", notif_id, ADDFD_FLAG_SEND, fds[0], 0, flags))
            try:
                fcntl.ioctl(self.listener, NOTIF_ADDFD, addfd, True)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the caller went (a signal, its end)
                    self._respond(notif_id, -(exc.errno or errno.ENOMEM))  # EMFILE: its descriptors are full
        finally:
            for fd in fds:
                os.close(fd)

    def reaped(self, pid: int) -> bool:
        """Whether ``pid`` was the maker; from now on its pid may be another process's."""
        if not self.pid or pid != self.pid:
            return False
        self._lost()
        self.pid = 0
        return True

    def _lost(self) -> None:
        """The maker is gone or broke its protocol: fail what it was asked, until the next is started."""
        if self.sock is not None:
            self.poll.unregister(self.sock)
            self.sock.close()
            self.sock = None
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        for notif_id in self.pending:
            self._respond(notif_id, -errno.ENOMEM)
        self.pending.clear()

    def _maker(self) -> socket.socket | None:
        if self.sock is not None or self.pid:  # a maker, or the last one still to be reaped
            return self.sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        os.write(self.slack, str(self.base).encode())  # the maker belongs to no command
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            _serve(theirs.fileno(), self.ids)
        theirs.close()
        ours.setblocking(False)
        self.poll.register(ours, select.POLLIN)
        self.pid, self.sock = pid, ours
        return ours

    def _respond(self, notif_id: int, error: int, flags: int = 0) -> None:
        with contextlib.suppress(OSError):  # the caller went meanwhile
            fcntl.ioctl(self.listener, L.SECCOMP_IOCTL_NOTIF_SEND, struct.pack("QqiI", notif_id, 0, error, flags))


def _serve(sock: int, ids: int) -> NoReturn:
    """The maker: keeps nothing of the init's but its socket, becomes ``ids``, and makes instances."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        L.set_comm(NAME)
        os.closerange(0, sock)
        os.closerange(sock + 1, 1 << 20)  # the listener above all: with it, answers for every call
        os.setgroups([])
        os.setresgid(ids, ids, ids)
        os.setresuid(ids, ids, ids)
        init = socket.socket(fileno=sock)
        while True:
            request = init.recv(REQUEST.size + 1)
            if len(request) != REQUEST.size:
                break
            (notif_id,) = REQUEST.unpack(request)
            try:
                made = select.epoll()
            except OSError as exc:
                init.send(REPLY.pack(notif_id, exc.errno or errno.ENOMEM))
                continue
            try:
                socket.send_fds(init, [REPLY.pack(notif_id, 0)], [made.fileno()])
            finally:
                made.close()
    finally:
        os._exit(0)
