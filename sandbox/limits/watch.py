"""Host side: the one thread per host process that holds the memory and disk bounds no kernel
mechanism holds here.

Without a cgroup, ``memory=`` is a per-process ``RLIMIT_AS``: many processes add up past it. And a
writable layer on the host's disk has no quota. Both are held here, in the host process, because the
jail's own init is untrusted once a command has run. Every ``TICK`` the thread reads ``/proc`` once
for all watched sandboxes: a jail's processes are the descendants of its init (every process of a
pid namespace descends from its pid 1, so none can leave the set). Over ``memory``, the biggest
processes (proportional resident set of their anonymous and shared memory, a charge per open
descriptor for the kernel memory behind it, a pipe's buffer, a file, and a charge per mapping for the
kernel's records of it) are killed with their descendants, as many as bring the total back under.
A jail past half its bound is sampled for memory five times as often (``quick``).
A process may hold 65,530 mappings (``vm.max_map_count``), 14 MiB of kernel memory, and only reading
its ``/proc/PID/maps`` counts them (28 ms for 65,000). So they are counted only where the most each
process's address space could hold (a page each) would take the jail past its bound, for at most
``MAPS_TIME`` a sample, all sandboxes together; a count stays ``MAPS_FRESH`` seconds, and a process's
is read again first when its address space grew. Reading stops at ``MAPPINGS_HOG``: a process with
that many is charged the most its address space could hold, so a jail of hundreds of such processes
is held without reading all of their maps at every sample. Proportional shares are read in the same
time: one not read again is its last share plus what its resident memory grew since, and a jail
over only if the shares never read are all of its processes' resident memory is read on at the
next samples, for at most ``UNDECIDED``, before it is judged so. The sockets of the jail's own network
namespace count towards ``memory`` too: socket buffers are kernel memory no rlimit holds, and a
reader that never reads makes a writer fill them.
Their figures (UNIX, TCP, UDP) are the kernel's own, read through a sock_diag socket the jail's
init made in that namespace before any untrusted code ran (``sockdiag.py``: bounded, never
blocking, and spaced so that counts take at most a ``COUNT_SHARE``-th of the thread's time, all
sandboxes together). When they are what is over, the process holding the most sockets is killed.
Their TCP and UDP part is also held on its own, with or without a cgroup (v1's ``kmem.tcp`` holds
it in the kernel instead), to the jail's share of the host's ``tcp_mem``/``udp_mem``, one count for
every network namespace (``rlimits.inet_bound``). A jail on the host's network has no such count
(its sockets are among all of the host's); there each socket is bounded only by its own buffer
size. Over ``disk`` or ``inodes`` (a walk of the writable layer, which each sample goes on with
for at most ``WALK_TIME``, all sandboxes together, the least recently walked first), every process
of the jail but its init is killed each time usage grew.

The host's open-file table (``fs.file-max``, about 10% of memory in 1 KiB files) is one count for
every process of the host, root's aside, that no namespace, cgroup or rlimit divides: a file costs
a cgroup some 256 bytes, so one jail under a 2 GiB limit could take them all, and every other
user's ``open()`` would fail with ENFILE. Each sample reads the table's use (one small read); past
1/``FILES_ALARM`` of it, a jail holding at least 1/``FILES_CULPRIT`` of the table (its descriptors;
if no jail holds that many, its descriptors and the files only a mapping holds) loses every
process but its init, reported as ``oom_killed``. Maps are read for at most ``FILES_TIME`` a
sample; a process not read again is charged its last count and a file for each page its address
space grew since.

Descriptors in flight are counted per host uid, and where a jail's root is a uid others share
(yours rootless, root's shared range) a probe of that uid is asked at each sample whether the uid
is past ``flight.MARK``; if so, the jail whose commands' sockets show the most loses every process
but its init (``flight.py``).

All are reactive: what a fast allocator or writer gets past the bound before the next sample is
measured in docs/bounds.md. Kills go through a pidfd opened and re-checked against the
jail's tree, so a recycled pid is never hit; a sample waits at most a ``QUICK_TICK`` for the killed
to go (a jail can make its processes slow to die), and while they go the jail's memory total leaves
them out and its other bounds are not judged again.
What the jail made is only measured: the walk never follows a link, reads at most twice
``inodes`` entries, and holds at most ``WALK_HELD`` bytes and ``WALK_BASES`` descriptors for what
it has still to read (a tree needing more is judged over its bounds).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..floor import linux as L
from . import flight
from .sockdiag import Sockets

TICK = 0.05
# Between two samples, a jail whose memory total (the first, cheap figure) passed 1/``NEAR`` of its
# bound is sampled again every ``QUICK_TICK``, and each such quick sample is followed by a rest
# ``QUICK_SHARE`` times as long as it took: forked workers opening pipes at full speed add 100 MiB of
# kernel memory in a ``TICK`` on 2 cores, so a jail near its bound is looked at five times as often,
# and the quick samples take at most a fifth of the thread's time whatever the host's size.
NEAR = 2
QUICK_TICK = 0.01
QUICK_SHARE = 4
KILL_WAIT = 1.0  # seconds a killed process still going is left out, and its jail not judged again (``_forget_gone``)
WALK_TIME = 0.01  # seconds a sample spends walking writable layers, all sandboxes together
WALK_SLACK = 2  # a walk counts up to twice a bound, so growth past it is still seen
WALK_HELD = 16 << 20  # bytes a walk holds at most for directories waiting to be read, their names
WALK_BASES = 64  # directories a walk holds open at most, to open deeper ones from
UNDER_LAYER = L.RESOLVE_NO_SYMLINKS | L.RESOLVE_NO_XDEV  # how a walk opens what is below a layer
PAGE = os.sysconf("SC_PAGE_SIZE")
ROLLUP_KEYS = (b"Pss_Anon:", b"Pss_Shmem:", b"SwapPss:")
COUNT_SHARE = 5  # socket counts take at most a fifth of the thread's time, all sandboxes together
# What each open descriptor is charged against ``memory``: a pipe past the per-user soft limit
# (``fs.pipe-user-pages-soft``, where the kernel shrinks new pipes to one page) holds one page of
# buffer and about 2 KiB of file, inode and pipe structures for its two ends (measured: 20,000
# descriptors of full one-page pipes took 93 MiB of the host, 4.8 KiB each).
DESCRIPTOR_CHARGE = 5 << 10
# /proc/PID/net tables of the sockets sock_diag's dumps leave out: (name, queue columns, base). Their
# queues are the kernel's sk_rmem_alloc (and sk_wmem_alloc): buffer memory, not payload. Netlink
# queues take no cgroup's memory either: 3,000 pairs of NETLINK_USERSOCK sockets held 1.1 GiB past a
# 256M limit, as root with a cgroup too.
# Packet and raw sockets need CAP_NET_RAW: their tables are read only for a jail whose commands hold it.
PROC_QUEUE_TABLES = (("netlink", (4, 5), 10), ("packet", (6,), 10), ("raw", (4,), 16), ("raw6", (4,), 16))
NETLINK_ONLY = PROC_QUEUE_TABLES[:1]
PROC_TABLE_MAX = 16 << 20  # bytes of one table read (about 100,000 sockets)
HOST_FILES = "/proc/sys/fs/file-nr"  # the host's open files, 0, fs.file-max
FILES_ALARM = 4  # past this share of the host's open-file table, the jails' files are counted
FILES_CULPRIT = 64  # a jail holding less of the table than this share is not what fills it
MAPS_MAX = 16 << 20  # bytes of one process's /proc/PID/maps read (vm.max_map_count's 65,530 mappings)
# What each mapping is charged against ``memory``: its vm_area_struct and anonymous-mapping records
# (measured: 65,000 one-page anonymous mappings of alternating protection took 14,463 KiB of
# unreclaimable slab, 228 bytes each). Each takes at least a page of address space.
MAPPING_CHARGE = 256
MAP_COUNT = "/proc/sys/vm/max_map_count"
# A process with this many mappings is charged the most its address space could hold (at most
# vm.max_map_count): programs hold hundreds to a few thousand; reading stops here (about 400 KiB, 3 ms).
MAPPINGS_HOG = 4096
MAPS_TIME = 0.03  # seconds a sample spends reading maps and shares, all sandboxes together
MAPS_FRESH = 0.5  # seconds a process's count of mappings, or its proportional share, is taken as it is
READ_WAIT = 0.02  # seconds the watcher waits for one process's maps or smaps_rollup
FILES_TIME = 0.03  # seconds a sample spends reading maps for the host's open-file table, all sandboxes together
LATE_KEPT = 64  # results of reads done after their wait, kept until asked for again
READER_IDLE = 10.0  # seconds a sandbox's reader thread waits for a read before it ends
HOLDER_LOOKS = 1024  # descriptors one search for the top socket holder reads, all processes together (6 ms)
SHARE_MOVE = 1 << 20  # bytes of resident anonymous memory a process gains or frees before its share is read again
UNDECIDED = 20  # samples in a row a jail may be over only by shares not read yet, before it is judged so


@dataclass(eq=False)
class Watched:
    """One sandbox's bounds, as the watcher holds them. ``counters`` grow on each kill."""

    init_pid: int
    memory: int | None = None
    upper: Path | None = None  # a disk writable layer, on the host
    disk: int | None = None
    inodes: int | None = None
    sockets: Sockets | None = None  # of the jail's own network namespace: their memory counts
    queues: int | None = None  # bound on the netlink, packet and raw sockets' queues of its own namespace
    inet: int | None = None  # bound on its TCP and UDP buffers (a share of the host's tcp_mem/udp_mem)
    queue_tables: tuple[tuple[str, tuple[int, ...], int], ...] = NETLINK_ONLY  # the /proc/INIT/net tables read
    flight: tuple[int, int] | None = None  # its root's host uid and gid if shared: their count in flight is probed
    counters: dict[str, int] = field(default_factory=dict)
    last_usage: tuple[int, int] = (0, 0)  # of the last walk done
    walk: _Walk | None = None  # of its writable layer, under way
    walked: float = 0.0  # when its walk last went on: the least recent goes first
    settling: bool = False  # killed at the last walk: what its writers still flushed is not new growth
    queued: int = 0  # the last figure for its sockets, kept until the next count
    diagnosed: int = 0  # of which what sock_diag reported (UNIX, TCP, UDP), kept while a dump is read out
    inet_held: int = 0  # of which TCP and UDP buffers
    next_count: float = 0.0
    maps: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> mappings (-1: not read), pages, when
    shares: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> proportional, resident, when
    files: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> files its maps hold, pages, when
    dying: dict[int, float] = field(default_factory=dict)  # pid -> until when: killed, not gone yet (``_forget_gone``)
    last_kill: float = 0.0  # when the memory bound last killed
    undecided: int = 0  # samples in a row it may have been over only by shares not read yet
    near: bool = False  # its memory total at the last sample passed 1/NEAR of its bound: sampled quickly too
    reader: _Reader = field(default_factory=lambda: _Reader())  # reads its processes' maps and shares

    def __post_init__(self) -> None:
        self.counters["oom_kill"] = 0  # memory, socket queues, and for every jail the host's open-file table
        if self.upper is not None:
            self.counters["disk_max"] = 0


class Watcher:
    """Started on the first ``add``; idles (blocked, no polling) while nothing is watched."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._watched: list[Watched] = []
        self._thread: threading.Thread | None = None
        self._owner = 0  # the pid that started the thread: a forked child starts its own
        self._checking = threading.Lock()  # held through each sample: what it reads is not closed under it

    def add(self, watched: Watched) -> None:
        with self._lock:
            self._watched.append(watched)
            if self._thread is None or self._owner != os.getpid():
                self._owner = os.getpid()
                self._checking = threading.Lock()  # a fork copies it as it was, maybe held by a sample
                self._thread = threading.Thread(target=self._run, name="jailbox-watch", daemon=True)
                self._thread.start()
            self._lock.notify()

    def remove(self, watched: Watched) -> None:
        """Stop watching; the sandbox's netlink socket and its walk's directory are closed once no
        sample is using them, and a probe no other watched jail needs ends with it."""
        with self._lock:
            if watched in self._watched:
                self._watched.remove(watched)
            ids = [w.flight for w in self._watched if w.flight is not None]
        if watched.sockets is None and watched.upper is None and watched.flight is None:
            return
        if self._owner != os.getpid():  # a forked child: no thread of this process samples it
            _release(watched)
            return
        with self._checking:
            _release(watched)
            PROBES.keep(ids)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched:
                    self._lock.wait()
            due = time.monotonic() + TICK
            spent = self._sample(check)
            while (left := due - time.monotonic()) > 0:
                with self._lock:
                    near = any(w.near for w in self._watched)
                pause = max(QUICK_TICK, spent * QUICK_SHARE)
                if not near or pause >= left:  # nothing to sample quickly before the next full sample
                    time.sleep(left)
                    break
                time.sleep(pause)
                spent = self._sample(quick)

    def _sample(self, sample: Callable[[list[Watched], float], None]) -> float:
        """Run ``sample`` on what is watched now; the seconds it took. The list is taken under
        ``_checking``: a sandbox removed before is not sampled with what ``remove`` closed."""
        start = time.monotonic()
        try:
            with self._checking:
                with self._lock:
                    current = list(self._watched)
                sample(current, time.monotonic())
        except Exception:  # a bad sample must not end the thread that holds the bounds
            pass
        return time.monotonic() - start


WATCHER = Watcher()
PROBES = flight.Probes()  # used by the watcher's thread, and by ``remove`` while it holds the sample's lock


def check(watched: list[Watched], now: float) -> None:
    """One sample of every watched sandbox; kills what is over its bound."""
    tree: dict[int, list[int]] | None = None
    counters = sum(w.sockets is not None or w.queues is not None for w in watched)
    maps = _Maps(now)
    for w in watched:
        _forget_gone(w, now)
    used, table = host_files()
    if used * FILES_ALARM > table:
        tree = _children()
        _check_files([w for w in watched if not w.dying], tree, table)
    ids = [w.flight for w in watched if w.flight is not None]
    PROBES.keep(ids)
    for key in PROBES.refused(ids, now):
        if now >= _flight_settled.get(key, 0.0):
            tree = tree if tree is not None else _children()
            _check_flight(key, [w for w in watched if w.flight == key and not w.dying], tree, now)
    for w in sorted(watched, key=lambda w: -w.undecided):  # the longest undecided read first
        if w.memory is not None:
            tree = tree if tree is not None else _children()
            _check_memory(w, tree, counters, maps, quick=False)
        if (w.queues is not None or w.inet is not None) and not w.dying:
            _check_queues(w, counters)
    until = time.monotonic() + WALK_TIME
    for w in sorted((w for w in watched if w.upper is not None and not w.dying), key=lambda w: w.walked):
        _check_disk(w, now, until)


def quick(watched: list[Watched], now: float) -> None:
    """A quick sample between two: the memory of the jails whose total was near their bound at the
    last sample (nothing if none is). Their other bounds wait for the next full sample."""
    near = [w for w in watched if w.near and w.memory is not None]
    if not near:
        return
    counters = sum(w.sockets is not None or w.queues is not None for w in watched)
    tree, maps = _children(), _Maps(now)
    for w in near:
        _forget_gone(w, now)
        _check_memory(w, tree, counters, maps, quick=True)


def _check_disk(w: Watched, now: float, until: float) -> None:
    """Go on with the walk of the jail's writable layer until ``until``; once it is done, kill the
    jail's processes if its usage is past a bound and grew since the last walk."""
    assert w.upper is not None
    w.walk = w.walk or _Walk(w.upper, w.disk, w.inodes)
    w.walked = now
    if not w.walk.step(until):
        return
    usage, overflowed, w.walk = (w.walk.used, w.walk.entries), w.walk.overflowed, None
    over = (w.disk is not None and usage[0] > w.disk) or (w.inodes is not None and usage[1] > w.inodes)
    grew = usage[0] > w.last_usage[0] or usage[1] > w.last_usage[1]
    over, grew = over or overflowed, grew or overflowed  # a tree it could not count may hold anything
    # a command that removes files to get back under is left alone; a killed writer may still be
    # flushing once gone, so the walk after a kill only takes the baseline, not new growth
    if over and grew and not w.settling:
        w.counters["disk_max"] += 1  # first: the killed command's result reads it when it ends
        w.dying.update(dict.fromkeys(_kill_all(_descendants(_children(), w.init_pid), w.init_pid), now + KILL_WAIT))
        w.settling = True
    else:
        w.settling = False
    w.last_usage = usage


def _check_memory(w: Watched, tree: dict[int, list[int]], counters: int, maps: _Maps, quick: bool) -> None:
    """Kill what takes the jail past ``memory``. A ``quick`` sample leaves the count of undecided
    samples as it is: that count is of full samples, the time the jail's reads are given."""
    assert w.memory is not None
    undecided = w.undecided
    if not quick:
        w.undecided = 0  # kept only while still undecided
    # A killed process frees what it holds once it runs again, which on a busy host may take a second;
    # until then it is left out, so the ones still running are not killed for what it holds.
    pids = [pid for pid in (w.init_pid, *_descendants(tree, w.init_pid)) if pid not in w.dying]
    w.maps = {pid: w.maps[pid] for pid in pids if pid in w.maps}  # the gone, and what a recycled pid had
    w.shares = {pid: w.shares[pid] for pid in pids if pid in w.shares}
    queued = _queued(w, counters)
    # Resident minus file-backed pages first (cheap, counts pages shared after fork twice), and for
    # mappings the most each process's address space could hold, or its fresh count. Only over the
    # bound are mappings counted; only over it with them, the proportional share is read. Each open
    # descriptor is charged DESCRIPTOR_CHARGE on top: what it holds (a pipe's buffer, the file, its
    # inode) is kernel memory no process's pages show.
    held = {pid: _descriptors(pid) * DESCRIPTOR_CHARGE for pid in pids}
    statm = {pid: _statm(pid) for pid in pids}
    most = _map_count_max()
    could = {pid: min(most, statm[pid][0]) for pid in pids}
    fresh = {pid: maps.fresh(w, pid, could[pid]) for pid in pids}
    first = queued + sum(statm[pid][1] + held[pid] + fresh[pid] * MAPPING_CHARGE for pid in pids)
    w.near = first * NEAR > w.memory
    if first <= w.memory:
        return
    mapped = maps.count(w, {pid: statm[pid][0] for pid in pids}, could)
    held = {pid: held[pid] + mapped.get(pid, 0) * MAPPING_CHARGE for pid in pids}
    if queued + sum(statm[pid][1] + held[pid] for pid in pids) <= w.memory:
        return
    shares = maps.shares(w, {pid: statm[pid][1] for pid in pids})
    sizes = {pid: shares[pid][1] + held[pid] for pid in pids}
    if queued + sum(sizes.values()) <= w.memory:
        return
    if queued + sum(shares[pid][0] + held[pid] for pid in pids) <= w.memory:
        # over only if the shares not read yet are all they may be: read on at the next samples,
        # for at most UNDECIDED, then judged on what they may be (a jail can make reads slow; and
        # counted in full samples, not seconds, as a host slowed by its load samples less often)
        if quick:
            return
        w.undecided = undecided + 1
        if w.undecided < UNDECIDED:
            return
    candidates = {pid: size for pid, size in sizes.items() if pid != w.init_pid}
    if not candidates:
        return  # the init alone: it reads at most one bounded request, and is never killed here
    # As many of the biggest as bring the total back under: processes growing together (forked
    # workers) are all stopped at this sample, not one per sample while the others grow on. A jail
    # over again within KILL_WAIT of a kill is brought to half its bound: its processes outgrow
    # what each sample kills, and those killed free what they hold only once they get a CPU.
    again = maps.now - w.last_kill < KILL_WAIT
    victims = _biggest_until_under(candidates, queued + sum(sizes.values()) - (w.memory // 2 if again else w.memory))
    w.last_kill = maps.now
    # Queued bytes belong to no process's pages: when they are what is over, the process holding the
    # most sockets is the one (a socket's queue is freed when its last holder is gone).
    holders = _socket_holders(candidates) if queued > sum(sizes.values()) else []
    _kill_trees(w, tree, holders or victims)


class _Maps:
    """What one sample reads of jails' processes that walking their mappings tells, for at most
    ``MAPS_TIME`` of it, all sandboxes together: how many mappings each holds (``/proc/PID/maps``,
    only counted, up to ``MAPPINGS_HOG``) and its proportional share (``smaps_rollup``, 10 ms for
    65,000 mappings). Both are kept in the process's ``Watched`` and taken as they are for
    ``MAPS_FRESH`` seconds. Each is read through the sandbox's ``_Reader``: a process whose count
    the jail keeps waiting is charged the most it could hold; a share kept waiting is taken once
    read, at a later sample."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.until = 0.0  # set at the first read: what came before in the sample is not counted
        self.stalled: set[int] = set()  # processes whose read outlasted READ_WAIT in this sample

    def _in_time(self) -> bool:
        if not self.until:
            self.until = time.monotonic() + MAPS_TIME
        return time.monotonic() < self.until

    def fresh(self, w: Watched, pid: int, otherwise: int) -> int:
        """What ``pid``'s mappings are charged as (``MAPPINGS_HOG`` or more: ``otherwise``, the most
        its address space could hold), if counted within ``MAPS_FRESH``; else ``otherwise``."""
        known = w.maps.get(pid)
        if known is None or known[0] < 0 or self.now - known[2] >= MAPS_FRESH or known[0] >= MAPPINGS_HOG:
            return otherwise
        return known[0]

    def count(self, w: Watched, pages: dict[int, int], could: dict[int, int]) -> dict[int, int]:
        """pid -> what the mappings of each of ``pages`` (pid -> pages of address space) are charged
        as: its last count, and a mapping for each page its address space grew since (since it was
        first seen, if never counted: while a read is kept waiting, what grows is still charged);
        or, from ``MAPPINGS_HOG`` on, what it ``could`` hold. While there is time, the processes
        never counted are counted first, then those whose address space grew, most first, then
        those not fresh, oldest first."""
        pids = list(pages)
        for pid in pids:
            w.maps.setdefault(pid, (-1, pages[pid], -MAPS_FRESH))  # seen, not counted yet
        unread = [pid for pid in pids if w.maps[pid][0] < 0]
        grown = sorted(
            (pid for pid in pids if w.maps[pid][0] >= 0 and pages[pid] > w.maps[pid][1]),
            key=lambda pid: pages[pid] - w.maps[pid][1],
            reverse=True,
        )
        stale = sorted((pid for pid in pids if w.maps[pid][0] >= 0), key=lambda pid: w.maps[pid][2])
        for pid in (*unread, *grown, *stale):
            known = w.maps[pid]
            if known[0] >= 0 and self.now - known[2] < MAPS_FRESH and pages[pid] <= known[1]:
                continue  # fresh, and its address space did not grow
            if not self._in_time() or w.reader.busy():
                break
            count = w.reader.read(_count_maps, pid)
            if count is None:  # its mappings' lock is kept taken: charged the most it could hold
                self.stalled.add(pid)
                break
            w.maps[pid] = (count, pages[pid], self.now)
        counted = {pid: max(0, w.maps[pid][0]) + max(0, pages[pid] - w.maps[pid][1]) for pid in pids}
        counted.update(dict.fromkeys(self.stalled & set(pids), MAPPINGS_HOG))
        if self.now - w.last_kill < KILL_WAIT:  # killed for memory within a second: a count not fresh is not taken
            counted.update({pid: MAPPINGS_HOG for pid in pids if self.now - w.maps[pid][2] >= MAPS_FRESH})
        return {pid: could[pid] if n >= MAPPINGS_HOG else min(n, could[pid]) for pid, n in counted.items()}

    def shares(self, w: Watched, resident: dict[int, int]) -> dict[int, tuple[int, int]]:
        """pid -> the least and the most the proportional share (``_proportional``) of each of
        ``resident`` (pid -> resident anonymous memory) may be. While there is time, shares never
        read are read first, biggest first; then those whose resident memory moved by
        ``SHARE_MOVE``, most first; then those not fresh, oldest first. A share not read again is its
        last one, plus what its resident memory grew since (new pages are the process's own until it
        forks), or, if that shrank, as little as it shrank to. A share never read is anything from
        nothing to all of its resident memory."""
        shares = w.shares
        moved = {pid: abs(resident[pid] - shares[pid][1]) for pid in resident if pid in shares}
        unread = sorted((pid for pid in resident if pid not in shares), key=resident.__getitem__, reverse=True)
        grown = sorted((pid for pid, by in moved.items() if by >= SHARE_MOVE), key=moved.__getitem__, reverse=True)
        stale = sorted((pid for pid in moved if self.now - shares[pid][2] >= MAPS_FRESH), key=lambda p: shares[p][2])
        for pid in dict.fromkeys((*unread, *grown, *stale)):
            if not self._in_time() or w.reader.busy():
                break
            share = w.reader.read(_proportional, pid)
            if share is None:  # slow, or kept waiting by the jail: taken when done, at a later sample
                break
            shares[pid] = (share, resident[pid], self.now)
        bounds = {}
        for pid, now in resident.items():
            if pid not in shares:
                bounds[pid] = (0, now)
            else:
                share, then, _ = shares[pid]
                bounds[pid] = (max(0, share + now - then), max(share, share + now - then))
        return bounds


class _Reader:
    """A thread for the reads a jail can make wait, one per watched sandbox: a process's maps and
    smaps_rollup take its mappings' lock, which a jail's processes can keep taken for seconds
    (mapping one file's pages from hundreds of processes at once queues them all on that file's
    lock). The watcher waits at most ``READ_WAIT`` for one, and asks for no other while it is not
    done; so a jail delays no sample by more than that, and no other jail's reads. The thread ends
    once idle for ``READER_IDLE`` seconds."""

    def __init__(self) -> None:
        self._owner = 0  # the pid whose thread this is (0: none): a forked child starts its own
        self._cv = threading.Condition()
        self._call: Callable[[], int] | None = None
        self._result = 0
        self._key: tuple[Callable[[int], int], int] | None = None  # of the read in flight
        self._late = False  # whether that read outlasted its wait
        self._done: dict[tuple[Callable[[int], int], int], int] = {}  # results of reads done late

    def busy(self) -> bool:
        """Whether a read that outlasted its wait is still not done."""
        return self._owner == os.getpid() and self._call is not None

    def read(self, read: Callable[[int], int], pid: int) -> int | None:
        """``read(pid)``, or None if it took longer than ``READ_WAIT`` (or the last one still does).
        Asked again for a read that outlasted its wait and is done since, its result at once: a
        process slow to read (hundreds of MiB resident, tens of thousands of mappings) is read."""
        if self._owner != os.getpid():
            self._owner = os.getpid()
            self._cv = threading.Condition()  # a fork copies it as it was, maybe held by the old thread
            self._call = None
            self._done.clear()
            threading.Thread(target=self._run, args=(self._cv,), name="jailbox-watch-read", daemon=True).start()
        with self._cv:
            if self._call is not None:
                return None
            if (read, pid) in self._done:
                return self._done.pop((read, pid))
            if len(self._done) >= LATE_KEPT:  # of processes gone, or not asked for again
                self._done.clear()
            self._call, self._key, self._late = functools.partial(read, pid), (read, pid), False
            self._cv.notify_all()
            deadline = time.monotonic() + READ_WAIT
            while self._call is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._late = True
                    return None
                self._cv.wait(left)
            return self._result

    def _run(self, cv: threading.Condition) -> None:
        while True:
            with cv:
                if self._call is None and not cv.wait_for(lambda: self._call is not None, READER_IDLE):
                    self._owner = 0  # the next read starts a thread again
                    return
                call = self._call
            assert call is not None
            try:
                result = call()
            except Exception:  # a read that fails counts nothing, and the thread reads on
                result = 0
            with cv:
                self._result, self._call = result, None
                if self._late and self._key is not None:
                    self._done[self._key] = result
                cv.notify_all()


def _count_maps(pid: int) -> int:
    """How many mappings ``pid`` holds, counted up to ``MAPPINGS_HOG``: the lines of its maps (at
    most ``MAPS_MAX`` bytes of them: a file's path may be 4 KiB)."""
    count = read = 0
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        while count < MAPPINGS_HOG and read < MAPS_MAX and (chunk := os.read(fd, 1 << 16)):
            read += len(chunk)
            count += chunk.count(b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)
    return count


def _map_count_max() -> int:
    """vm.max_map_count: the most mappings one process may hold."""
    try:
        with open(MAP_COUNT, "rb") as f:
            return int(f.read(64))
    except (OSError, ValueError):
        return 65530


def _socket_holders(pids: Iterable[int]) -> list[int]:
    """What to kill to free the sockets ``pids`` hold: the process holding the most, or none if
    none holds one. Processes are looked at most descriptors first, and at most ``HOLDER_LOOKS``
    descriptors in all: a jail's processes may hold hundreds of thousands (reading 400,000 kept
    the watcher from every other sandbox for 1.8 s). If those looked at hold no socket and some
    were left unread, all of ``pids``: processes holding other descriptors by the thousand would
    otherwise be killed one a sample while a socket holder fills on."""
    ranked = sorted(pids, key=_descriptors, reverse=True)
    holders: dict[int, int] = {}
    left = HOLDER_LOOKS
    for pid in ranked:
        if left <= 0:
            break
        holders[pid], looked = _sockets(pid, left)
        left -= looked
    if any(holders.values()):
        return [max(holders, key=lambda pid: holders[pid])]
    return ranked if left <= 0 else []


def host_files() -> tuple[int, int]:
    """(files open on the whole host, fs.file-max); (0, 1) where the kernel does not say."""
    try:
        fd = os.open(HOST_FILES, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
        return int(fields[0]), max(1, int(fields[2]))
    except (OSError, ValueError, IndexError):
        return 0, 1


def _check_files(watched: list[Watched], tree: dict[int, list[int]], table: int) -> None:
    """The host's open-file table is filling: a jail holding at least 1/FILES_CULPRIT of it loses
    every process but its init (one jail a sample)."""
    # descriptors first, one call a process; mappings, which take reading every one, only if need be,
    # for at most FILES_TIME a sample, and only until the bound is reached (its maps are as long as
    # what a jail holds)
    until = time.monotonic() + FILES_TIME
    for mapped in (False, True):
        for w in watched:
            pids = _descendants(tree, w.init_pid)
            if mapped:  # the gone forgotten; then the never counted first, the oldest counts next
                w.files = {pid: w.files[pid] for pid in pids if pid in w.files}
                pids.sort(key=lambda pid: w.files[pid][2] if pid in w.files else -1.0)
            held = 0
            for pid in pids:
                held += _descriptors(pid) + (_mapped_files(w, pid, until) if mapped else 0)
                if held >= table // FILES_CULPRIT:
                    # all its processes but the init: holders are cheap to fork again from one that holds none
                    _kill_trees(w, tree, tree.get(w.init_pid, []))
                    return


_flight_settled: dict[tuple[int, int], float] = {}  # host ids -> when what their last kill freed is gone


def _check_flight(key: tuple[int, int], watched: list[Watched], tree: dict[int, list[int]], now: float) -> None:
    """Host ids ``key`` have more than ``flight.MARK`` descriptors in flight: the jail (of
    ``watched``, whose root they are) whose commands' sockets show the most in their queues loses
    every process but its init. Processes are read fewest descriptors first, at most
    ``flight.LOOKS`` descriptors in all; if those read show none, the jail with the most descriptors
    left unread is taken instead: a queue may hide behind a hundred thousand other descriptors."""
    owner: dict[int, Watched] = {}
    for w in watched:
        owner.update(dict.fromkeys(_descendants(tree, w.init_pid), w))
    sizes = {pid: _descriptors(pid) for pid in owner}
    found = flight.shown(sorted(owner, key=sizes.__getitem__), flight.LOOKS)
    shown: dict[Watched, int] = {}
    unread: dict[Watched, int] = {}
    for pid, w in owner.items():
        count, looked = found.get(pid, (0, 0))
        shown[w] = shown.get(w, 0) + count
        unread[w] = unread.get(w, 0) + max(0, sizes[pid] - looked)
    culprit = max((w for w in shown if shown[w] > 0), key=shown.__getitem__, default=None)
    if culprit is None:
        culprit = max((w for w in unread if unread[w] > 0), key=unread.__getitem__, default=None)
    if culprit is not None:
        # all its processes but the init: a queue is handed from process to process in a message
        _kill_trees(culprit, tree, tree.get(culprit.init_pid, []))
        _flight_settled[key] = now + flight.SETTLE


def _mapped_files(w: Watched, pid: int, until: float) -> int:
    """The files only ``pid``'s mappings may hold: counted while the sample has time (``_files``),
    else its last count (0 before the first); either way plus a file for each page its address
    space grew since (a mapping takes one at least). A jail's processes may each have 65,530
    mappings to read: reading them all at every sample kept the watcher from other sandboxes."""
    pages = _statm(pid)[0]
    count, seen, when = w.files.get(pid, (0, pages, -1.0))
    if time.monotonic() < until:
        count, seen, when = _files(pid), pages, time.monotonic()
    w.files[pid] = (count, seen, when)
    return count + max(0, pages - seen)


def _files(pid: int) -> int:
    """The files ``pid``'s mappings hold (a file mapped and then closed stays open in the kernel's
    table). At most MAPS_MAX bytes of its maps are read."""
    mapped = 0
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        left = MAPS_MAX
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            left -= len(chunk)
            # a file's mapping ends in its path, an anonymous one in nothing or [name]; a path of the
            # jail's own holding " /" counts twice, against itself
            mapped += chunk.count(b" /") + chunk.count(b" anon_inode:")
    except OSError:
        pass
    finally:
        os.close(fd)
    return mapped


def _forget_gone(w: Watched, now: float) -> None:
    """Keep in ``w.dying`` only the processes killed within ``KILL_WAIT`` and still going. While
    any is, the jail is not judged again for its disk, its socket queues or the host's open files
    (what they held is freed once they are gone), and its memory total leaves them out."""
    w.dying = {pid: until for pid, until in w.dying.items() if until > now and os.path.exists(f"/proc/{pid}")}


def _kill_trees(w: Watched, tree: dict[int, list[int]], victims: list[int]) -> None:
    """Kill ``victims`` with their descendants, counted as one OOM kill of the jail. Those not gone
    at once are the jail's ``dying`` for ``KILL_WAIT``."""
    w.counters["oom_kill"] += 1  # first: the killed command's result reads it when it ends
    doomed = dict.fromkeys(found for pid in victims for found in (pid, *_descendants(tree, pid)))
    until = time.monotonic() + KILL_WAIT
    w.dying.update(dict.fromkeys(_kill_all(list(doomed), w.init_pid), until))
    w.next_count = 0.0  # what the killed held is freed: the last figure is stale


def _biggest_until_under(sizes: dict[int, int], over: int) -> list[int]:
    """The biggest processes whose sizes together cover ``over`` bytes (at least one)."""
    victims: list[int] = []
    for pid in sorted(sizes, key=lambda pid: sizes[pid], reverse=True):
        victims.append(pid)
        over -= sizes[pid]
        if over <= 0:
            break
    return victims


def _check_queues(w: Watched, counters: int) -> None:
    """Socket queues held on their own: with a cgroup, which counts none of them, the netlink, packet
    and raw sockets' queues of the jail's own namespace, to the memory limit; and the TCP and UDP
    buffers, to the jail's share of the host's. Past either, the process holding the most sockets is
    killed with its descendants."""
    netlink = _queued(w, counters) - w.diagnosed  # without a cgroup, all of it is in the memory total
    over_queues = w.queues is not None and w.memory is None and netlink > w.queues
    if not (over_queues or (w.inet is not None and w.inet_held > w.inet)):
        return
    tree = _children()
    holders = _socket_holders(_descendants(tree, w.init_pid))
    if holders:
        _kill_trees(w, tree, holders)


def _queued(w: Watched, counters: int) -> int:
    """What the sockets of the jail's own network namespace hold; counted again once the last count
    has been paid for (``COUNT_SHARE``, shared by the ``counters`` sandboxes), else the last figure."""
    bound = max((b for b in (w.memory, w.queues, w.inet) if b is not None), default=None)
    if bound is None or (w.sockets is None and w.queues is None):
        return 0
    now = time.monotonic()
    if now < w.next_count:
        return w.queued
    if w.sockets is not None:
        counted = w.sockets.measure(bound)  # a count stops once past the bound: the total is over either way
        if counted is not None:  # else the rest of an earlier dump is still being read out: the last figure holds
            w.diagnosed, w.inet_held = counted.total(), counted.inet
    w.queued = w.diagnosed + (_proc_queues(w.init_pid, w.queue_tables, bound) if w.queues is not None else 0)
    w.next_count = now + (time.monotonic() - now) * COUNT_SHARE * counters
    return w.queued


def _proc_queues(pid: int, tables: tuple[tuple[str, tuple[int, ...], int], ...], bound: int) -> int:
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


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, of every process on the host (``/proc/PID/stat``, readable by all)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent(int(name))
            if parent:
                children.setdefault(parent, []).append(int(name))
    return children


def _descendants(children: dict[int, list[int]], pid: int) -> list[int]:
    found: list[int] = []
    stack = list(children.get(pid, ()))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, ()))
    return found


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read(1024).rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _statm(pid: int) -> tuple[int, int]:
    """(pages of address space, bytes resident but not file-backed) of ``pid``."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read(256).split()
        return int(fields[0]), max(0, int(fields[1]) - int(fields[2])) * PAGE
    except (OSError, ValueError, IndexError):
        return 0, 0


def _proportional(pid: int) -> int:
    """This process's share of anonymous, shared-memory and swapped pages (smaps_rollup), in bytes."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f.read(4096).splitlines():
                if line.startswith(ROLLUP_KEYS):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return _statm(pid)[1]
    return total


def _descriptors(pid: int) -> int:
    """How many descriptors ``pid`` has open: the size Linux (6.2 and later) gives ``/proc/PID/fd``,
    one call however many there are (0 on older kernels, where descriptors go uncharged)."""
    try:
        return os.stat(f"/proc/{pid}/fd").st_size
    except OSError:
        return 0


def _sockets(pid: int, most: int) -> tuple[int, int]:
    """(sockets, descriptors looked at) of ``pid``'s open descriptors, at most ``most`` looked at."""
    count = looked = 0
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                if looked >= most:
                    break
                looked += 1
                try:
                    count += os.readlink(entry.path).startswith("socket:")
                except OSError:
                    continue
    except OSError:
        pass
    return count, looked


def _in_tree(pid: int, known: set[int]) -> bool:
    """Whether ``pid`` descends from a process of ``known`` (the jail's init, to start with), which
    then learns every ancestor met on the way: a kill of a chain of processes reads each one's parent
    once, not the whole chain above each (400 deep took 0.4 s, while no other sandbox was sampled)."""
    path: list[int] = []
    for _ in range(4096):
        if pid in known:
            known.update(path)
            return True
        if pid <= 1:
            return False
        path.append(pid)
        pid = _parent(pid)
    return False


def _kill_all(pids: list[int], init_pid: int) -> list[int]:
    """SIGKILL each through a pidfd, once the pid it holds is seen to still be of this jail; then
    wait at most ``QUICK_TICK`` until they are gone. Returns the pids not gone yet: the caller keeps them
    as the jail's ``dying``, and no sample waits longer for them (a jail's processes can be slow to
    die: 150 holding 60,000 mappings each took a second, while no other sandbox was sampled)."""
    killed = {}
    known = {init_pid}
    for pid in pids:
        pidfd = _kill(pid, init_pid, known)
        if pidfd >= 0:
            killed[pidfd] = pid
    poller = select.poll()
    for pidfd in killed:
        poller.register(pidfd, select.POLLIN)
    pending = set(killed)
    deadline = time.monotonic() + QUICK_TICK
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            poller.unregister(fd)
            pending.discard(fd)
    for pidfd in killed:
        os.close(pidfd)
    return [killed[pidfd] for pidfd in pending]


def _kill(pid: int, init_pid: int, known: set[int]) -> int:
    """SIGKILL through a pidfd, once the pid it holds is seen to still be of this jail (``known``:
    as ``_in_tree``); the pidfd of what was signalled (the caller closes it), else -1."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return -1
    try:
        if pid != init_pid and _in_tree(pid, known):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return -1


class _Base:
    """A directory a walk holds open; deeper directories are opened from it, so no path given to
    openat2 grows past ``_Walk.LONG`` bytes or ``_Walk.DEEP`` names however deep the tree."""

    __slots__ = ("fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd, self.users = fd, 0  # users: the ``_Dir``s named from it


class _Dir:
    """A directory read, or being read, while subdirectories of it wait on the walk's stack."""

    __slots__ = ("base", "rel", "waiting")

    def __init__(self, base: _Base, rel: bytes) -> None:
        self.base, self.rel, self.waiting = base, rel, 0
        base.users += 1


class _Walk:
    """One walk of a writable layer: (bytes allocated, entries). A sample goes on with it for at
    most ``WALK_TIME``, all sandboxes together: a jail may hold a million entries inside its bounds,
    and walking them at once kept the watcher from every other sandbox for seconds. It stops at
    ``WALK_SLACK`` times a bound (a jail over it that long has been killed since it crossed it).

    Everything the walk holds is the jail's to shape, so it is bounded too. The jail renames its
    files while they are walked: each directory is opened from an open directory beneath the layer
    (its ``_Base``) refusing a symlink anywhere on the path (``open_beneath``), so a link swapped in
    for a directory already listed is never followed out of the layer (a directory moved away
    meanwhile is missed by that walk). A tree deeper than PATH_MAX is walked whole, from a ``_Base``
    every ``LONG`` bytes or ``DEEP`` names. Directories waiting to be read hold their names
    (``WALK_HELD`` bytes at most, all told) and the bases they are named from (``WALK_BASES``): a
    tree that needs more (a million directories in one, side branches all the way down a chain
    past PATH_MAX) is judged over its bounds, ``overflowed``, since it cannot be counted."""

    LONG = 1024  # bytes of path below a base: a name adds at most 256, inside PATH_MAX (4096)
    DEEP = 32  # names below a base: what each open walks in the kernel
    ENTRY = 64  # bytes a waiting directory holds besides its name

    def __init__(self, top: Path, disk: int | None, inodes: int | None) -> None:
        self.disk = disk * WALK_SLACK if disk is not None else None
        self.inodes = inodes * WALK_SLACK if inodes is not None else None
        self.used = self.entries = 0
        self.overflowed = False
        self.stack: list[tuple[_Dir, bytes]] = []  # directories to read: (parent, name)
        self.held = 0  # bytes the stack and its parents hold
        self.bases: set[_Base] = set()  # open
        self.reading: os._ScandirIterator[str] | None = None  # the directory it is in
        self.here: _Dir | None = None  # and where it is
        self.fd = -1  # its descriptor unless it is a base: the entries' stat goes through it
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # the layer is gone: nothing to walk
        base = _Base(fd)
        self.bases.add(base)
        self._push(self._dir(base, b"."), b".")  # the top itself, named "." from itself

    def step(self, until: float) -> bool:
        """Walk on until ``until`` (``time.monotonic()``); whether the walk is done."""
        while True:
            if self.reading is None and not self._open_next():
                self.close()
                return True
            assert self.reading is not None and self.here is not None
            here = self.here
            for looked, entry in enumerate(self.reading):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                self.used += st.st_blocks * 512
                self.entries += 1
                if stat.S_ISDIR(st.st_mode):
                    self._push(here, os.fsencode(entry.name))
                    self.overflowed = self.held > WALK_HELD
                if (
                    self.overflowed
                    or (self.disk is not None and self.used > self.disk)
                    or (self.inodes is not None and self.entries > self.inodes)
                ):
                    self.close()
                    return True
                if looked % 64 == 63 and time.monotonic() >= until:
                    return False
            self._leave()

    def _open_next(self) -> bool:
        """Open the next waiting directory that can be; False once none is left, or none may be."""
        while self.stack:
            parent, name = self.stack.pop()
            self.held -= len(name) + self.ENTRY
            parent.waiting -= 1
            rel = name if parent.rel == b"." else parent.rel + b"/" + name
            try:
                fd = L.open_beneath(parent.base.fd, rel, os.O_RDONLY | os.O_DIRECTORY, UNDER_LAYER)
            except OSError:  # gone, a symlink now, or a directory this user may not read (see docs/bounds.md)
                self._done(parent)
                continue
            try:
                self.reading = os.scandir(fd)  # reads a duplicate; its entries stat through fd itself
            except OSError:
                os.close(fd)
                self._done(parent)
                continue
            if len(rel) > self.LONG or rel.count(b"/") >= self.DEEP:
                base = _Base(fd)
                self.bases.add(base)
                self.here = self._dir(base, b".")
                self.overflowed = len(self.bases) > WALK_BASES
            else:
                self.here, self.fd = self._dir(parent.base, rel), fd
            self._done(parent)
            return not self.overflowed
        return False

    def _push(self, parent: _Dir, name: bytes) -> None:
        parent.waiting += 1
        self.held += len(name) + self.ENTRY
        self.stack.append((parent, name))

    def _dir(self, base: _Base, rel: bytes) -> _Dir:
        self.held += len(rel) + self.ENTRY
        return _Dir(base, rel)

    def _done(self, d: _Dir) -> None:
        """``d`` is read and has nothing waiting, or may still be either."""
        if d.waiting or d is self.here:
            return
        self.held -= len(d.rel) + self.ENTRY
        d.base.users -= 1
        if d.base.users == 0:
            os.close(d.base.fd)
            self.bases.discard(d.base)

    def _leave(self) -> None:
        """Done reading the directory it is in."""
        here = self._stop_reading()
        if here is not None:
            self._done(here)

    def _stop_reading(self) -> _Dir | None:
        if self.reading is not None:
            self.reading.close()
            self.reading = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        here, self.here = self.here, None
        return here

    def close(self) -> None:
        self._stop_reading()
        self.stack.clear()
        for base in self.bases:
            os.close(base.fd)
        self.bases.clear()


def _release(watched: Watched) -> None:
    """Close what the watcher holds of a sandbox it no longer watches."""
    if watched.sockets is not None:
        watched.sockets.close()
    if watched.walk is not None:
        watched.walk.close()
        watched.walk = None
