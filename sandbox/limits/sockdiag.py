"""Host side: the kernel memory the sockets of one jail's network namespace hold (UNIX, TCP, UDP).

Socket buffers are kernel memory no rlimit holds: a reader that never reads makes a writer fill
them (a UNIX stream socket queues up to its send buffer, about 200 KiB by default, and
``/proc/PID/net/unix`` shows no queue sizes). The kernel reports each socket's memory through
sock_diag netlink, for the namespace the netlink socket was made in; the host cannot enter a
rootless jail's namespace, so the jail's init makes that socket before any untrusted code runs and
hands it over with its ready message (``child/netns.py``). The watcher thread (``watch.py``) asks for
one dump per family each time it counts. (Reading the ``/proc/PID/net`` tables instead cost 4-7 ms
per jail here, the dumps about 1 ms: both walk the host's hash tables; and the tables give
payload bytes, not the memory behind them.)

Per socket the count is what the socket itself takes (``SOCKET_OBJECT``) plus the kernel's figures: for
UNIX what it charges the socket's sends (``wmem_alloc``, which covers what waits in its peer's
receive queue) and receives; for TCP and UDP its receive memory, the larger of its send figures
and its backlog. Two kinds of UNIX queue have no socket left to report them: the receive queue of
a socket whose writer closed its end (the kernel then reports only its payload bytes) and a
listener's connections not yet accepted (only their number). Each of those counts at least one
default send buffer, which is what a writer that did not raise its ``SO_SNDBUF`` could leave there.

The dumps are attack surface: the jail decides how many sockets there are, and a process of it
with CAP_NET_ADMIN in its namespace could address the netlink socket. The socket is connected to
the kernel (nothing else can deliver to it) and every batch's sender is checked; reads never
block; a count stops once past the caller's bound, ``MAX_SOCKETS`` or ``DUMP_TIME``, and what is
left of a dump is drained (not parsed) on later calls, at most ``DRAIN_BYTES`` at a time; every
length is checked against what was received. Stdlib and the floor only.
"""

from __future__ import annotations

import operator
import socket
import struct
import time
from dataclasses import dataclass

from ..floor import small

SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_PEER, UDIAG_SHOW_RQLEN, UDIAG_SHOW_MEMINFO = 0x4, 0x10, 0x20
UNIX_DIAG_PEER, UNIX_DIAG_RQLEN, UNIX_DIAG_MEMINFO, UNIX_DIAG_SHUTDOWN = 2, 4, 5, 6
TCP_ESTABLISHED, TCP_LISTEN = 1, 10
SHUTDOWN_MASK = 3  # both directions: what the kernel sets on a stream socket whose peer closed
ALL_STATES = 0xFFFFFFFF

INET_DIAG_SKMEMINFO = 7
# rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, optmem, backlog, drops
SK_MEMINFO = struct.Struct("=9I")

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, sender port
UNIX_REQUEST = struct.Struct("=BBHIIIII")  # unix_diag_req: family, protocol, pad, states, inode, show, cookie
INET_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, extensions, pad, states, sockid
INET_MESSAGE = struct.Struct("=BB2x48x4xII8x")  # inet_diag_msg: family, state, .., rqueue, wqueue, ..
DUMPS = (
    UNIX_REQUEST.pack(
        socket.AF_UNIX, 0, 0, ALL_STATES, 0, UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN | UDIAG_SHOW_MEMINFO, 0, 0
    ),
    *(
        INET_REQUEST.pack(family, protocol, 1 << (INET_DIAG_SKMEMINFO - 1), 0, ALL_STATES)
        for family in (socket.AF_INET, socket.AF_INET6)
        for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP)
    ),
)
DUMP_FLAGS = NLM_F_REQUEST | NLM_F_DUMP
MESSAGE = struct.Struct("=BBBBI8x")  # unix_diag_msg: family, type, state, pad, inode, cookie
ATTR = struct.Struct("=HH")
U32 = struct.Struct("=I")
TWO_U32 = struct.Struct("=II")
MEMINFO = struct.Struct("=III")  # the first three of SK_MEMINFO_*: rmem_alloc, rcvbuf, wmem_alloc
# The kernel's layouts of one socket's message for the attributes asked, in its order (PEER only
# when there is one; SHUTDOWN always): read in one step when their attribute headers are as expected.
WITH_PEER = struct.Struct("=16x BBBB4x8x HHI HHII HHIII24x HHB3x")
NO_PEER = struct.Struct("=16x BBBB4x8x HHII HHIII24x HHB3x")
LAYOUTS = {
    WITH_PEER.size: (
        WITH_PEER,
        operator.itemgetter(4, 5, 7, 8, 11, 12, 16, 17),
        (8, UNIX_DIAG_PEER, 12, UNIX_DIAG_RQLEN, 40, UNIX_DIAG_MEMINFO, 5, UNIX_DIAG_SHUTDOWN),
        operator.itemgetter(0, 1, 2, 6, 9, 13, 15, 18),
    ),
    NO_PEER.size: (
        NO_PEER,
        operator.itemgetter(4, 5, 8, 9, 13, 14),
        (12, UNIX_DIAG_RQLEN, 40, UNIX_DIAG_MEMINFO, 5, UNIX_DIAG_SHUTDOWN),
        operator.itemgetter(0, 1, 2, 2, 6, 10, 12, 15),  # peer is set to -1 below
    ),
}

RECV_BYTES = 1 << 16  # the kernel fills at most about 32 KiB per dump message batch
MAX_SOCKETS = 1 << 16  # sockets looked at per dump; past it the figure is a lower bound
DUMP_TIME = 0.2  # seconds of parsing per dump; past it the figure is a lower bound
DRAIN_BYTES = 8 << 20  # read (unparsed) per call of what is left of a cut dump
# a socket's own kernel objects (its sock, inode, file and dentry; slab sizes of a 6.x kernel)
SOCKET_OBJECT = 2048
INET_SOCKET_OBJECT = 3584


def _default_send_buffer() -> int:
    try:
        return max(4096, int(small.read("/proc/sys/net/core/wmem_default", 64)))
    except ValueError:  # unreadable (nothing read), or not a number
        return 212992


DEFAULT_SEND_BUFFER = _default_send_buffer()


@dataclass
class Tally:
    """One dump's sums; ``total()`` is the figure that counts towards memory."""

    charged: int = 0  # send and receive memory, each socket's own objects, queues left by closed writers
    inet: int = 0  # of which TCP and UDP sockets' buffers: the host's one tcp_mem/udp_mem count
    sockets: int = 0
    pending: int = 0  # connections listeners have not accepted
    connecting: int = 0  # live sockets whose peer is such a connection (their writes are in ``charged``)

    def total(self) -> int:
        return self.charged + max(0, self.pending - self.connecting) * DEFAULT_SEND_BUFFER


class Sockets:
    """A sock_diag netlink socket of one jail's namespace (this object owns and closes it)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self._seq = 0
        self._draining = False  # a dump we stopped counting is still being read out

    def close(self) -> None:
        self.sock.close()

    def measure(self, bound: int) -> Tally | None:
        """The kernel memory the namespace's sockets hold (``total()``: at least ``bound`` + 1 when past
        it, counting stops there). None when no figure could be had this time (the rest of an earlier
        dump is still being drained, or the socket failed)."""
        tally = Tally()
        deadline = time.monotonic() + DUMP_TIME
        try:
            if self._draining and not self._drain():
                return None
            for dump in DUMPS:
                self._seq = self._seq % 0xFFFFFFF + 1
                self.sock.send(
                    HEADER.pack(HEADER.size + len(dump), SOCK_DIAG_BY_FAMILY, DUMP_FLAGS, self._seq, 0) + dump
                )
                if not self._count(tally, bound, deadline):
                    break
        except OSError:  # e.g. ENOBUFS, part of a dump dropped: what is left is drained first
            self._draining = True
            return None
        return tally

    def _count(self, tally: Tally, bound: int, deadline: float) -> bool:
        """Add one dump to ``tally``; False when counting stopped before its end."""
        while True:
            data = self._recv()
            if data is None:
                return True  # the dump ended without its end message
            if _parse(data, self._seq, tally):
                return True
            if tally.total() > bound or tally.sockets >= MAX_SOCKETS or time.monotonic() > deadline:
                self._draining = True
                self._drain()
                return False

    def _drain(self) -> bool:
        """Read out what is left of a dump, at most ``DRAIN_BYTES``; True once it has ended."""
        read = 0
        while read < DRAIN_BYTES:
            data = self._recv()
            if data is None or _ends(data):
                self._draining = False
                return True
            read += len(data)
        return False

    def _recv(self) -> bytes | None:
        """The kernel's next batch; None when there is none (no dump running). Batches from any
        other sender are dropped (the connected socket should already refuse them)."""
        while True:
            try:
                data, (port, _) = self.sock.recvfrom(RECV_BYTES)
            except BlockingIOError:
                return None
            if port == 0:
                return data


def _ends(data: bytes) -> bool:
    """Whether a batch holds a dump's end (done, or an error that ends it)."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if kind in (NLMSG_DONE, NLMSG_ERROR):
            return True
        if length < HEADER.size:
            return False
        offset += (length + 3) & ~3
    return False


def _parse(data: bytes, seq: int, tally: Tally) -> bool:
    """Add one batch's sockets to ``tally``; True once the dump has ended. A message whose lengths
    do not fit what was received ends the batch (the kernel's own messages always fit)."""
    offset, end = 0, len(data)
    while offset + HEADER.size <= end:
        length, kind, _, got_seq, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > end:
            return False
        if got_seq == seq:
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                return True
            if kind == SOCK_DIAG_BY_FAMILY and length > HEADER.size:
                if data[offset + HEADER.size] == socket.AF_UNIX:
                    fields = _fields(data, offset, length)
                    if fields is not None:
                        _add(tally, *fields)
                else:
                    _add_inet(data, offset, length, tally)
        offset += (length + 3) & ~3
    return False


def _fields(data: bytes, offset: int, length: int) -> tuple[int, int, int, int, int, int] | None:
    """(type, state, peer, receive queue, memory, shutdown) of one socket's message; peer -1 when
    none is reported (a listener, an unconnected socket). The kernel's usual layouts are read in one
    step; any other is walked attribute by attribute."""
    known = LAYOUTS.get(length)
    if known is not None:
        layout, headers, expected, values = known
        fields = layout.unpack_from(data, offset)
        if headers(fields) == expected:
            family, kind, state, peer, rqueue, rmem, wmem, shutdown = values(fields)
            if family != socket.AF_UNIX:
                return None
            return kind, state, peer if length == WITH_PEER.size else -1, rqueue, rmem + wmem, shutdown
    start, end = offset + HEADER.size, offset + length
    if length < HEADER.size + MESSAGE.size:
        return None
    family, kind, state, _, _ = MESSAGE.unpack_from(data, start)
    if family != socket.AF_UNIX:
        return None
    rqueue = memory = shutdown = 0
    peer = -1
    offset = start + MESSAGE.size
    while offset + ATTR.size <= end:
        size, attr = ATTR.unpack_from(data, offset)
        if size < ATTR.size or offset + size > end:
            break
        value = offset + ATTR.size
        size -= ATTR.size
        if attr == UNIX_DIAG_MEMINFO and size >= MEMINFO.size:
            rmem, _, wmem = MEMINFO.unpack_from(data, value)
            memory = rmem + wmem
        elif attr == UNIX_DIAG_RQLEN and size >= TWO_U32.size:
            rqueue = TWO_U32.unpack_from(data, value)[0]
        elif attr == UNIX_DIAG_PEER and size >= U32.size:
            peer = U32.unpack_from(data, value)[0]
        elif attr == UNIX_DIAG_SHUTDOWN and size >= 1:
            shutdown = data[value]
        offset += (size + ATTR.size + 3) & ~3
    return kind, state, peer, rqueue, memory, shutdown


def _add(tally: Tally, kind: int, state: int, peer: int, rqueue: int, memory: int, shutdown: int) -> None:
    tally.sockets += 1
    tally.charged += SOCKET_OBJECT + memory
    stream = kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET)
    if state == TCP_LISTEN:
        tally.pending += rqueue  # a listener's receive queue length is its count of waiting connections
    elif stream and state == TCP_ESTABLISHED and peer == 0 and shutdown != SHUTDOWN_MASK:
        tally.connecting += 1  # connected to a connection not accepted yet (which has no inode)
    elif rqueue and (peer <= 0 or shutdown == SHUTDOWN_MASK):
        tally.charged += max(rqueue, DEFAULT_SEND_BUFFER)  # its writer is gone: its memory is reported nowhere


def _add_inet(data: bytes, offset: int, length: int, tally: Tally) -> None:
    """A TCP or UDP socket: its receive memory, the larger of its send figures, its backlog (its
    queues' payload bytes when the kernel sends no memory figures)."""
    if length < HEADER.size + INET_MESSAGE.size:
        return
    family, _, rqueue, wqueue = INET_MESSAGE.unpack_from(data, offset + HEADER.size)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return
    memory = rqueue + wqueue
    end = offset + length
    offset += HEADER.size + INET_MESSAGE.size
    while offset + ATTR.size <= end:
        size, attr = ATTR.unpack_from(data, offset)
        if size < ATTR.size or offset + size > end:
            break
        if attr == INET_DIAG_SKMEMINFO and size - ATTR.size >= SK_MEMINFO.size:
            rmem, _, wmem, _, _, queued, _, backlog, _ = SK_MEMINFO.unpack_from(data, offset + ATTR.size)
            memory = rmem + max(wmem, queued) + backlog
            break
        offset += (size + 3) & ~3
    tally.sockets += 1
    tally.charged += INET_SOCKET_OBJECT + memory
    tally.inet += memory
