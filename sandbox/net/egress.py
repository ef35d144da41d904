"""Where a ``full`` jail's traffic meets the host: slirp4netns's own calls, checked by a thread of
the host process (one per jail) through a seccomp listener.

The jail's routes cannot hold the promise of ``full`` ("anywhere but the host's loopback or LAN"):
its root may hold CAP_NET_RAW in its own namespaces and write frames on its tap device through a
packet or raw socket, past any route, and slirp4netns opens a host socket for whatever destination
a frame names. So slirp4netns runs under a filter (loaded before it starts, ``slirp_exec.py``) that
sends every ``connect``, every ``sendto`` naming an address, and every ``sendmsg``/``sendmmsg`` to
this thread, which reads the address from slirp4netns's memory once, checks it
(``policy.full_refuses``) and, for an IPv4 or IPv6 socket, makes the call itself on a duplicate of
slirp4netns's socket (``pidfd_getfd``) with the bytes it checked: a copy changed after the check
(slirp4netns is the jail's parser, so think of it as reachable) is never the one the kernel uses.
Calls on other sockets (its Unix socketpair with its own child) run as made: a socket's family is
not in memory the caller can change. ``sendmsg``/``sendmmsg`` on IP sockets are refused: slirp4netns
sends datagrams with ``sendto``. ``send()`` (``sendto`` without an address, TCP's data) never stops
here. ``io_uring_setup`` is ENOSYS under the filter (its calls would bypass seccomp).

Fails closed: the thread holds the only listener; when it ends, however, the kernel fails every call
the filter traps (ENOSYS). It never waits on the network: a connect must be non-blocking (slirp4netns's
are) and a datagram goes with MSG_DONTWAIT. Bounds: an address of at most ``SOCKADDR_MAX`` bytes, a
datagram of at most ``DATAGRAM_MAX``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import ipaddress
import os
import select
import socket
import struct
import threading

from ..floor import linux as L
from ..seccomp.bpf import _JEQ, _JSET, _LD_W_ABS, _NR, _RET, RET_ALLOW, RET_ERRNO, RET_NOTIFY, X32_BIT, _Program
from ..seccomp.syscalls import AUDIT_ARCH, arch, syscall_table
from .policy import IPNetwork, full_refuses

_ARCH_OFF, _ARG4 = 4, 48  # seccomp_data: arch; args[4] (sendto's address), low word first
NOTIF = struct.Struct("QIIiIQ6Q")  # struct seccomp_notif: id, pid, flags, data {nr, arch, ip, args[6]}
RESPONSE = struct.Struct("QqiI")  # struct seccomp_notif_resp: id, val, error, flags
SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage)
DATAGRAM_MAX = 1 << 17  # above IP's 64 KiB: a larger sendto fails EMSGSIZE in the kernel anyway
REFUSED = errno.EHOSTUNREACH  # what the jail's own routes answer for the LAN ("No route to host")
REFUSED_KEPT = 64  # distinct refused addresses a guard counts, for tests and diagnosis

_libc = ctypes.CDLL(None, use_errno=True)
_libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.sendto.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.sendto.restype = ctypes.c_ssize_t
_libc.getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


@functools.cache
def slirp_filter() -> bytes:
    """The BPF program slirp4netns runs under (see the module docstring)."""
    machine = arch()
    table = syscall_table(machine)
    p = _Program()
    p.op(_LD_W_ABS, _ARCH_OFF)
    p.op(_JEQ, AUDIT_ARCH[machine], 0, "refuse")
    p.op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        p.op(_JSET, X32_BIT, "refuse", 0)
    for name in ("connect", "sendmsg", "sendmmsg"):
        p.op(_JEQ, table[name], "notify", 0)
    p.op(_JEQ, table["io_uring_setup"], "refuse", 0)
    p.op(_JEQ, table["sendto"], 0, "allow")
    p.op(_LD_W_ABS, _ARG4)
    p.op(_JEQ, 0, 0, "notify")
    p.op(_LD_W_ABS, _ARG4 + 4)
    p.op(_JEQ, 0, "allow", "notify")
    p.label("allow")
    p.op(_RET, RET_ALLOW)
    p.label("notify")
    p.op(_RET, RET_NOTIFY)
    p.label("refuse")
    p.op(_RET, RET_ERRNO | errno.ENOSYS)
    return p.assemble()


class EgressGuard:
    """The thread that answers slirp4netns's trapped calls; ``close()`` ends it (slirp4netns's exit
    ends it too). Takes ownership of ``listener``."""

    def __init__(self, listener: int, pid: int, allowed: tuple[IPNetwork, ...]) -> None:
        self._listener = listener
        self._pid = pid  # slirp4netns, whose calls these nearly all are: its pidfd is kept
        self._pidfd = os.pidfd_open(pid)
        self._allowed = allowed
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        table = syscall_table(arch())
        self._connect, self._sendto = table["connect"], table["sendto"]
        self.refused: dict[str, int] = {}  # address -> calls refused (the first REFUSED_KEPT addresses)
        self._thread = threading.Thread(target=self._serve, name="jailbox-slirp-egress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._stop_w < 0:
            return
        os.write(self._stop_w, b"x")
        self._thread.join()
        os.close(self._stop_w)
        os.close(self._stop_r)
        os.close(self._pidfd)
        self._stop_w = -1

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._listener, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        notif = bytearray(NOTIF.size)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_r in ready or ready.get(self._listener, select.POLLIN) & select.POLLIN == 0:
                    return  # closed, or slirp4netns and its children are gone (POLLHUP)
                notif[:] = bytes(NOTIF.size)  # the kernel takes only a zeroed struct
                try:
                    fcntl.ioctl(self._listener, L.SECCOMP_IOCTL_NOTIF_RECV, notif, True)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.EINTR):  # the caller went before it was read
                        continue
                    raise
                notif_id, pid, _, nr, _, _, *args = NOTIF.unpack(notif)
                response = RESPONSE.pack(notif_id, *self._answer(notif_id, pid, nr, args))
                try:
                    fcntl.ioctl(self._listener, L.SECCOMP_IOCTL_NOTIF_SEND, response)
                except OSError:  # ENOENT: the caller went (a signal, its end)
                    continue
        finally:
            os.close(self._listener)  # fail closed: from here on every trapped call is ENOSYS

    def _answer(self, notif_id: int, pid: int, nr: int, args: list[int]) -> tuple[int, int, int]:
        """(value, -errno, flags) for the response."""
        try:
            fd = (
                L.pidfd_getfd(self._pidfd, args[0] & 0xFFFFFFFF)
                if pid == self._pid
                else _fd_of(self._listener, notif_id, pid, args[0])
            )
        except OSError as exc:
            return 0, -(errno.EBADF if exc.errno == errno.EBADF else errno.EACCES), 0
        try:
            if _family(fd) not in (socket.AF_INET, socket.AF_INET6):
                return 0, 0, L.SECCOMP_USER_NOTIF_FLAG_CONTINUE
            if nr == self._connect:
                return self._connect_as(pid, fd, args)
            if nr == self._sendto:
                return self._sendto_as(pid, fd, args)
            return 0, -errno.EACCES, 0  # sendmsg, sendmmsg on an IP socket
        except OSError as exc:
            return 0, -(exc.errno or errno.EACCES), 0
        finally:
            os.close(fd)

    def _destination(self, pid: int, address: int, size: int) -> bytes:
        """The sockaddr the caller named, checked: raises OSError with the errno to answer."""
        if not 0 < size <= SOCKADDR_MAX:
            raise OSError(errno.EINVAL, "address size")
        raw = L.read_memory(pid, address, size)
        if len(raw) < size:
            raise OSError(errno.EFAULT, "address")
        family = struct.unpack_from("H", raw)[0]
        if family == socket.AF_INET and size >= 16:
            addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[4:8])
        elif family == socket.AF_INET6 and size >= 24:
            addr = ipaddress.IPv6Address(raw[8:24])
        elif family == socket.AF_UNSPEC:  # connect(AF_UNSPEC) dissolves an association: no destination
            return raw
        else:
            raise OSError(errno.EAFNOSUPPORT, "family")
        port = struct.unpack_from("!H", raw, 2)[0]
        if full_refuses(addr, port, self._allowed):
            if str(addr) in self.refused or len(self.refused) < REFUSED_KEPT:
                self.refused[str(addr)] = self.refused.get(str(addr), 0) + 1
            raise OSError(REFUSED, "refused")
        return raw

    def _connect_as(self, pid: int, fd: int, args: list[int]) -> tuple[int, int, int]:
        raw = self._destination(pid, args[1], args[2] & 0xFFFFFFFF)
        if not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK:
            return 0, -errno.EACCES, 0  # this thread never waits for a connection
        if _libc.connect(fd, raw, len(raw)) == 0:
            return 0, 0, 0
        return 0, -ctypes.get_errno(), 0

    def _sendto_as(self, pid: int, fd: int, args: list[int]) -> tuple[int, int, int]:
        raw = self._destination(pid, args[4], args[5] & 0xFFFFFFFF)
        size = args[2]
        if size > DATAGRAM_MAX:
            return 0, -errno.EMSGSIZE, 0
        data = L.read_memory(pid, args[1], size) if size else b""
        if len(data) < size:
            return 0, -errno.EFAULT, 0
        flags = (args[3] & 0xFFFFFFFF) | socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
        sent = _libc.sendto(fd, data, size, ctypes.c_int(flags).value, raw, len(raw))
        if sent < 0:
            return 0, -ctypes.get_errno(), 0
        return sent, 0, 0


def _fd_of(listener: int, notif_id: int, pid: int, fd: int) -> int:
    """A duplicate of descriptor ``fd`` of ``pid``, a process slirp4netns started."""
    pidfd = os.pidfd_open(pid)
    try:
        # the pid is the caller's still (not a new process's) while its notification is pending
        fcntl.ioctl(listener, L.SECCOMP_IOCTL_NOTIF_ID_VALID, struct.pack("Q", notif_id))
        return L.pidfd_getfd(pidfd, fd & 0xFFFFFFFF)
    finally:
        os.close(pidfd)


def _family(fd: int) -> int:
    """The socket's family (OSError ENOTSOCK for anything else)."""
    value = ctypes.c_int()
    size = ctypes.c_uint(ctypes.sizeof(value))
    if _libc.getsockopt(fd, socket.SOL_SOCKET, socket.SO_DOMAIN, ctypes.byref(value), ctypes.byref(size)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return value.value
