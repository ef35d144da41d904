"""Host side: the sockets of a jail's own network namespace, held by the watcher (``watch.py``).

Runs in the host process (the watcher's thread). Socket buffers are kernel memory no rlimit holds,
and a reader that never reads makes a writer fill them. Their figures (UNIX, TCP, UDP) are the
kernel's own, read through a sock_diag socket the jail's init made in that namespace before any
untrusted code ran (``sockdiag.py``: bounded, never blocking, and spaced so that counts take at most
a ``COUNT_SHARE``-th of the thread's time, all sandboxes together); the netlink, packet and raw
sockets' queues come from ``/proc/INIT/net`` tables, each read to at most ``PROC_TABLE_MAX`` bytes.
Without a cgroup, what they hold is in the jail's memory total (``memory.py``). They are also held on
their own: the netlink, packet and raw queues, which no cgroup counts, to the memory limit; and the
TCP and UDP part, with or without a cgroup (v1's ``kmem.tcp`` holds it in the kernel instead), to the
jail's share of the host's ``tcp_mem``/``udp_mem``, one count for every network namespace
(``inet_bound``). Past either, the process holding the most sockets is killed. A jail on the
host's network has no such count (its sockets are among all of the host's).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import proc
from .enforcement import Enforcement, held, unbounded
from .procs import Procs, socket_holders
from .sockdiag import Sockets

COUNT_SHARE = 5  # socket counts take at most a fifth of the thread's time, all sandboxes together
# /proc/PID/net tables of the sockets sock_diag's dumps leave out: (name, queue columns, base). Their
# queues are the kernel's sk_rmem_alloc (and sk_wmem_alloc): buffer memory, not payload. Netlink
# queues take no cgroup's memory either: 3,000 pairs of NETLINK_USERSOCK sockets held 1.1 GiB past a
# 256M limit, as root with a cgroup too.
# Packet and raw sockets need CAP_NET_RAW: their tables are read only for a jail whose commands hold it.
PROC_QUEUE_TABLES = (("netlink", (4, 5), 10), ("packet", (6,), 10), ("raw", (4,), 16), ("raw6", (4,), 16))
NETLINK_ONLY = PROC_QUEUE_TABLES[:1]
PROC_TABLE_MAX = 16 << 20  # bytes of one table read (about 100,000 sockets)
# TCP and UDP buffers are one count for the whole host (net.ipv4.tcp_mem, udp_mem: low, pressure,
# high, in pages, about 4.5/6/9% of memory): past the low mark the kernel shrinks every socket's
# buffers, past the high one every TCP send waits and every UDP datagram is dropped, root's too
# (DNS). A cgroup counts them against its memory limit, which can be above the high mark (750 MB
# with 8 GiB). One sandbox gets 1/INET_SHARE of the low mark, all of a cgroup v1 group 1/INET_ALL.
INET_SHARE = 8
INET_ALL = 2
# A loopback fill adds about 6 GB/s here: 300 MiB in one TICK. The host's own figure for all network
# namespaces (/proc/net/sockstat, one small read) is looked at between two samples; once it has grown
# by 1/INET_RISE of the smallest jail's TCP and UDP bound since the last count, the jails with such a
# bound are counted then, not at the next sample.
INET_RISE = 2
SOCKSTAT_MAX = 4096  # bytes of /proc/net/sockstat read (a few hundred)

Tables = tuple[tuple[str, tuple[int, ...], int], ...]


@dataclass(eq=False)
class SocketBound:
    """What a jail's sockets are held to, and the watcher's last figures for them."""

    diag: Sockets | None  # of the jail's own network namespace: their memory counts
    memory: int | None  # the memory bound the watcher holds (None: a cgroup holds memory, or none is set)
    queues: int | None = None  # bound on the netlink, packet and raw sockets' queues of its own namespace
    inet: int | None = None  # bound on its TCP and UDP buffers (a share of the host's tcp_mem/udp_mem)
    tables: Tables = NETLINK_ONLY  # the /proc/INIT/net tables read
    queued: int = 0  # the last figure for its sockets, kept until the next count
    diagnosed: int = 0  # of which what sock_diag reported (UNIX, TCP, UDP), kept while a dump is read out
    inet_held: int = 0  # of which TCP and UDP buffers
    next_count: float = 0.0
    counted: float = 0.0  # when the last figure was counted

    def close(self) -> None:
        if self.diag is not None:
            self.diag.close()


def inet_low_mark() -> int:
    """Bytes of TCP and UDP buffers the host holds before the kernel presses them: the lower of
    tcp_mem's and udp_mem's low mark."""
    marks = []
    for name in ("tcp_mem", "udp_mem"):
        try:
            marks.append(int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[0]) * proc.PAGE)
        except (OSError, ValueError, IndexError):
            continue
    return min(marks, default=1 << 30)


def inet_bound(memory: int | None) -> int:
    """Bytes of TCP and UDP buffers one sandbox may hold: its share of the host's low mark, and no
    more than its memory limit."""
    share = inet_low_mark() // INET_SHARE
    return share if memory is None else min(memory, share)


def inet_budget() -> int:
    """Bytes of TCP and UDP buffers all sandboxes of a cgroup v1 ``jailbox`` group may hold."""
    return inet_low_mark() // INET_ALL


def host_inet() -> int:
    """Bytes of TCP and UDP buffers the host holds, every network namespace's together (the ``mem``
    pages of ``/proc/net/sockstat``); 0 if unreadable."""
    try:
        fd = os.open("/proc/net/sockstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        text = os.read(fd, SOCKSTAT_MAX)
    except OSError:
        return 0
    finally:
        os.close(fd)
    pages = 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in (b"TCP:", b"UDP:") and b"mem" in fields[:-1]:
            try:
                pages += int(fields[fields.index(b"mem") + 1])
            except ValueError:
                continue
    return pages * proc.PAGE


@dataclass(eq=False)
class HostInet:
    """The host's TCP and UDP buffers as the watcher last counted the jails' (``host_inet``): a fill
    faster than a sample shows there first. Used by the watcher's thread only."""

    counted: int = 0  # host_inet() when the jails' sockets were last counted

    def rising(self, bounds: list[SocketBound]) -> bool:
        """Whether the host's figure has grown by 1/INET_RISE of the smallest of the jails' TCP and
        UDP ``bounds`` since the last count."""
        inet = [s.inet for s in bounds if s.inet is not None]
        return bool(inet) and host_inet() - self.counted > min(inet) // INET_RISE

    def reset(self) -> None:
        self.counted = host_inet()


def plan_buffers(memory: int | None, cgroup: str | None) -> Enforcement:
    """How the jail's socket buffers are held: UNIX in its memory, TCP and UDP to ``inet_bound``."""
    inet = inet_bound(memory)
    if cgroup == "cgroup v1" and memory is not None:
        return held(
            "socket_buffers",
            f"cgroup v1 memory.kmem.tcp.limit_in_bytes={inet} (TCP and UDP: 1/{INET_SHARE} of the host's low mark "
            f"of tcp_mem/udp_mem, at most the memory limit; all sandboxes of the group {inet_budget()}); UNIX in "
            "memory.limit_in_bytes",
        )
    counted = {
        "cgroup v2": "UNIX, TCP and UDP counted in memory.current; ",
        None: "UNIX, TCP and UDP in the watcher's memory total; " if memory is not None else "",
    }.get(cgroup, "")
    return held(
        "socket_buffers",
        f"{counted}host watcher: the TCP and UDP buffers of the jail's own network namespace held to {inet} "
        f"bytes (1/{INET_SHARE} of the host's low mark of tcp_mem/udp_mem, at most the memory limit), the "
        "process holding the most sockets killed past it (on the host's network: per socket only)",
    )


def plan_queues(memory: int | None, own_netns: bool) -> Enforcement:
    """How the queues of netlink, packet and raw sockets are held: no cgroup counts them."""
    if memory is None:
        return unbounded("socket_queues", "memory")
    if not own_netns:
        return held("socket_queues", "per socket only (its receive buffer): the jail is on the host's network")
    return held(
        "socket_queues",
        f"host watcher: the queues of the netlink, packet and raw sockets of the jail's own network namespace "
        f"(/proc/INIT/net), held to the memory limit ({memory} bytes; in the total without a cgroup, on their "
        "own with one, which does not count them); past it the process holding the most sockets is killed",
    )


def check(p: Procs, s: SocketBound, counters: int) -> None:
    """Socket queues held on their own: with a cgroup, which counts none of them, the netlink, packet
    and raw sockets' queues of the jail's own namespace, to the memory limit; and the TCP and UDP
    buffers, to the jail's share of the host's. Past either, the process holding the most sockets is
    killed with its descendants."""
    netlink = queued(p, s, counters) - s.diagnosed  # without a cgroup, all of it is in the memory total
    over_queues = s.queues is not None and s.memory is None and netlink > s.queues
    if not (over_queues or (s.inet is not None and s.inet_held > s.inet)):
        return
    tree = proc.children()
    holders = socket_holders(proc.descendants(tree, p.init_pid))
    if holders:
        p.kill_trees(tree, holders)


def queued(p: Procs, s: SocketBound, counters: int) -> int:
    """What the sockets of the jail's own network namespace hold; counted again once the last count
    has been paid for (``COUNT_SHARE``, shared by the ``counters`` sandboxes) or something was killed
    since, else the last figure."""
    bound = max((b for b in (s.memory, s.queues, s.inet) if b is not None), default=None)
    if bound is None or (s.diag is None and s.queues is None):
        return 0
    now = time.monotonic()
    if now < s.next_count and p.killed < s.counted:  # what the killed held is freed: the last figure is stale
        return s.queued
    if s.diag is not None:
        counted = s.diag.measure(bound)  # a count stops once past the bound: the total is over either way
        if counted is not None:  # else the rest of an earlier dump is still being read out: the last figure holds
            s.diagnosed, s.inet_held = counted.total(), counted.inet
    s.queued = s.diagnosed + (proc_queues(p.init_pid, s.tables, bound) if s.queues is not None else 0)
    s.counted = now
    s.next_count = now + (time.monotonic() - now) * COUNT_SHARE * counters
    return s.queued


def proc_queues(pid: int, tables: Tables, bound: int) -> int:
    """Bytes the netlink, packet and raw sockets of ``pid``'s network namespace hold (the kernel's
    ``sk_rmem_alloc`` and, for netlink, ``sk_wmem_alloc``, from its ``/proc/PID/net`` tables, which
    sock_diag's UNIX/TCP/UDP dumps leave out). The jail decides how many lines there are: each
    table is read at most ``PROC_TABLE_MAX`` bytes, and reading stops once the total is past ``bound``."""
    total = 0
    for table, columns, base in tables:
        try:
            fd = os.open(f"/proc/{pid}/net/{table}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            read, rest = 0, b""
            while total <= bound and read < PROC_TABLE_MAX:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                read += len(chunk)
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                total += sum(_queue_of(line, columns, base) for line in lines)
            if read >= PROC_TABLE_MAX:
                return bound + 1  # more sockets than a table we read whole: over, whatever they hold
        except OSError:
            pass
        finally:
            os.close(fd)
    return total


def _queue_of(line: bytes, columns: tuple[int, ...], base: int) -> int:
    """The sum of a table line's queue columns (a ``tx:rx`` pair in hex counts both); 0 for a header."""
    fields = line.split()
    try:
        return sum(int(part, base) for column in columns for part in fields[column].split(b":"))
    except (IndexError, ValueError):
        return 0
