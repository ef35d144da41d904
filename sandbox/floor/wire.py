"""Message framing between host, launcher and in-jail init.

One JSON object per ``SOCK_SEQPACKET`` message, file descriptors riding along with SCM_RIGHTS.
Seqpacket keeps message boundaries and makes each send atomic, so several threads can share one
control socket without a framing lock and without a demultiplexer: every request carries its own
reply socket. Payloads above ``INLINE_MAX`` travel in a memfd (in a jail without memfds, an unnamed
file in its /tmp) so no size limit comes from the socket buffer. The receiver bounds everything:
bytes, descriptors, nesting.

Stdlib only (runs inside the launcher and the init).
"""

from __future__ import annotations

import array
import errno
import json
import os
import select
import socket
from collections.abc import Sequence
from typing import Any, TypeVar

INLINE_MAX = 48 * 1024
RECV_BUF = 64 * 1024
MEMFD_KEY = "_memfd"
FD_SIZE = array.array("i").itemsize
T = TypeVar("T")


class WireError(Exception):
    """A peer sent something that is not a well-formed, bounded message."""


def wait_readable(fd: int | socket.socket, timeout: float | None) -> bool:
    """poll(2) for one descriptor: unlike select(2) it works past descriptor number 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    wait = -1 if timeout is None else max(0, int(timeout * 1000))
    while True:
        try:
            return bool(poller.poll(wait))
        except InterruptedError:
            continue


def seqpacket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, obj: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    fds = list(fds)
    memfd = -1
    if len(data) > INLINE_MAX:
        memfd = _scratch()
        view = memoryview(data)
        while view:
            view = view[os.write(memfd, view) :]
        fds.append(memfd)
        data = json.dumps({MEMFD_KEY: len(data)}).encode()
    try:
        if fds:
            socket.send_fds(sock, [data], fds)
        else:
            sock.sendall(data)
    finally:
        if memfd >= 0:
            os.close(memfd)


def _scratch() -> int:
    """A memfd for a large payload; in a jail whose seccomp filter makes ``memfd_create`` ENOSYS (its
    memory is held by the host's watcher, not a cgroup), an unnamed file in its bounded /tmp."""
    try:
        return os.memfd_create("jailbox-msg", os.MFD_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        return os.open("/tmp", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)


def recv(sock: socket.socket, max_fds: int = 4, max_bytes: int = 16 * 1024 * 1024) -> tuple[dict, list[int]] | None:
    """Receive one message; ``None`` on orderly EOF. Extra or malformed input raises ``WireError``."""
    data, fds, flags = _recv_fds(sock, max_fds + 1)
    if not data and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise WireError("message or descriptors truncated")
        obj = _decode(data)
        if MEMFD_KEY in obj:
            if not fds:
                raise WireError("large message without its memfd")
            memfd = fds.pop()
            try:
                obj = _decode(_read_memfd(memfd, obj[MEMFD_KEY], max_bytes))
            finally:
                os.close(memfd)
        if len(fds) > max_fds:
            raise WireError(f"too many descriptors ({len(fds)})")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return obj, fds


def _recv_fds(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int], int]:
    """recvmsg with MSG_CMSG_CLOEXEC: received descriptors never leak into a spawned command."""
    ancillary = socket.CMSG_SPACE(max_fds * FD_SIZE)
    data, anc, flags, _ = sock.recvmsg(RECV_BUF, ancillary, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % FD_SIZE
            fds.extend(array.array("i", payload[:usable]))
    return data, fds, flags


def _read_memfd(fd: int, size: object, max_bytes: int) -> bytes:
    if not isinstance(size, int) or not 0 <= size <= max_bytes:
        raise WireError(f"large message of bad size {size!r} (limit {max_bytes})")
    chunks = []
    left = size
    offset = 0
    while left:
        chunk = os.pread(fd, min(left, 1 << 20), offset)
        if not chunk:
            raise WireError("large message shorter than announced")
        chunks.append(chunk)
        left -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _decode(data: bytes) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"undecodable message: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("message is not an object")
    return obj


def fields_of(cls: type, obj: object) -> dict[str, Any]:
    """``obj`` as the wire form of the dataclass ``cls``: exactly its fields, none missing or unknown."""
    import dataclasses  # here: its import (inspect, ast) would double what jailbox exec's fast path pays

    if not isinstance(obj, dict):
        raise WireError(f"{cls.__name__}: expected an object, got {type(obj).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    missing, unknown = names - obj.keys(), obj.keys() - names
    if missing or unknown:
        raise WireError(f"{cls.__name__}: missing {sorted(missing)}, unknown {sorted(map(str, unknown))}")
    return obj


def typed(fields: dict[str, Any], name: str, kind: type[T]) -> T:
    """One field of a wire object, which must be of ``kind`` (a bool is not an int here)."""
    value = fields[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"{name}: expected {kind.__name__}, got {type(value).__name__}")
    return value
