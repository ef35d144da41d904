"""Host side: a TCP connection to a port on a jail's own loopback, whatever its network mode.

Runs in the host process, on the caller's thread. The jail's init connects from inside the jail's
network namespace (``ConnectRequest``) and hands the socket back over its control channel; the init
may be the jail's code by then, so what comes back is checked before it is used: exactly one
descriptor, a socket (``fstat``), TCP over IPv4 or IPv6 (the kernel's own ``SO_DOMAIN``, ``SO_TYPE``
and ``SO_PROTOCOL``), non-blocking from here on, connected within ``PORT_CONNECT_WAIT`` seconds (a
bounded poll) to the loopback address and the port asked for. The socket is a connection made in the
jail's namespace: its bytes are the jail's, and the caller bounds what it reads of them.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import stat

from .channel import Channel
from .child.requests import ConnectRequest
from .errors import ProtocolError, SandboxFileError
from .limits import PORT_CONNECT_WAIT
from .messages import Done

LOOPBACK = ("127.0.0.1", "::1")


def connect(channel: Channel, port: int, timeout: float = PORT_CONNECT_WAIT) -> socket.socket:
    """A connected, non-blocking TCP socket to ``port`` on the jail's loopback: 127.0.0.1, else ::1.
    ``ConnectionRefusedError`` when nothing listens on either, ``TimeoutError`` when the connection is
    not made within ``timeout`` seconds, ``ProtocolError`` when the jail hands back anything else."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be a number from 1 to 65535, e.g. connect_port(8000), not {port!r}")
    try:
        return _connect(channel, port, False, timeout)
    except ConnectionRefusedError:  # nothing on 127.0.0.1: a server may listen on ::1 alone
        try:
            return _connect(channel, port, True, timeout)
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.ENETUNREACH):  # no IPv6 there
                refused = f"port {port} of the sandbox: Connection refused"
                raise ConnectionRefusedError(errno.ECONNREFUSED, refused) from None
            raise


def _connect(channel: Channel, port: int, ipv6: bool, timeout: float) -> socket.socket:
    try:
        _, fds = channel.call(ConnectRequest(port, ipv6), Done, max_fds=1)
    except SandboxFileError as exc:  # the init's connect(2) failed: its errno, as a connect here would raise it
        code = exc.errno or errno.ECONNREFUSED
        raise OSError(code, f"port {port} of the sandbox: {os.strerror(code)}") from None
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"connect to port {port}: the jail handed back {len(fds)} descriptors, not one")
    sock = _checked(fds[0], port)
    try:
        _wait_connected(sock, port, timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def _checked(fd: int, port: int) -> socket.socket:
    """``fd`` as a TCP socket of IPv4 or IPv6, made non-blocking; closed and refused if it is not one."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ProtocolError(f"connect to port {port}: the jail handed back something that is not a socket")
        sock = socket.socket(fileno=fd)  # its family, type and protocol as the kernel reports them
    except BaseException:
        os.close(fd)
        raise
    try:
        family = sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        protocol = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)
        tcp = kind == socket.SOCK_STREAM and protocol == socket.IPPROTO_TCP
        if family not in (socket.AF_INET, socket.AF_INET6) or not tcp:
            raise ProtocolError(f"connect to port {port}: the jail handed back a socket that is not TCP")
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _wait_connected(sock: socket.socket, port: int, timeout: float) -> None:
    """Wait (bounded) for the connection under way, then check where it leads."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    if not poller.poll(max(0, int(timeout * 1000))):
        raise TimeoutError(f"port {port} of the sandbox did not accept a connection within {timeout:g}s")
    failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if failed:
        raise OSError(failed, f"port {port} of the sandbox: {os.strerror(failed)}")
    try:
        peer = sock.getpeername()
    except OSError as exc:  # not connected after all
        raise OSError(exc.errno or errno.ENOTCONN, f"port {port} of the sandbox: {exc.strerror}") from None
    if peer[0] not in LOOPBACK or peer[1] != port:
        raise ProtocolError(f"connect to port {port}: the jail handed back a connection to {peer[0]} port {peer[1]}")
