"""Host side: a jail's memory where no cgroup counts it, held by the watcher (``watch.py``).

Runs in the host process (the watcher's thread, and one reader thread per watched sandbox).
Without a cgroup, ``memory=`` is a per-process ``RLIMIT_AS``: many processes add up past it. Over
``memory``, the biggest processes (proportional resident set of their anonymous and shared memory,
a charge per open descriptor for the kernel memory behind it, a pipe's buffer, a file, and a charge
per mapping for the kernel's records of it) are killed with their descendants, as many as bring the
total back under. The sockets of the jail's own network namespace count too (``sockets.py``). A jail
past 1/``NEAR`` of its bound is sampled for memory between two samples too (``watch.quick``).

A process may hold 65,530 mappings (``vm.max_map_count``), 14 MiB of kernel memory, and only reading
its ``/proc/PID/maps`` counts them (28 ms for 65,000). So they are counted only where the most each
process's address space could hold (a page each) would take the jail past its bound, for at most
``MAPS_TIME`` a sample, all sandboxes together; a count stays ``MAPS_FRESH`` seconds, and a process's
is read again first when its address space grew. Reading stops at ``MAPPINGS_HOG``: a process with
that many is charged the most its address space could hold, so a jail of hundreds of such processes
is held without reading all of their maps at every sample. Proportional shares are read in the same
time: one not read again is its last share plus what its resident memory grew since, and a jail
over only if the shares never read are all of its processes' resident memory is read on at the
next samples, for at most ``UNDECIDED``, before it is judged so.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import proc
from .enforcement import Enforcement, held, unbounded
from .procs import KILL_WAIT, QUICK_TICK, TICK, Procs, biggest_until_under, socket_holders

NEAR = 2  # past 1/NEAR of its bound, a jail's memory is sampled between two samples too
# What each open descriptor is charged against ``memory``: a pipe past the per-user soft limit
# (``fs.pipe-user-pages-soft``, where the kernel shrinks new pipes to one page) holds one page of
# buffer and about 2 KiB of file, inode and pipe structures for its two ends (measured: 20,000
# descriptors of full one-page pipes took 93 MiB of the host, 4.8 KiB each).
DESCRIPTOR_CHARGE = 5 << 10
# What each mapping is charged against ``memory``: its vm_area_struct and anonymous-mapping records
# (measured: 65,000 one-page anonymous mappings of alternating protection took 14,463 KiB of
# unreclaimable slab, 228 bytes each). Each takes at least a page of address space.
MAPPING_CHARGE = 256
# A process with this many mappings is charged the most its address space could hold (at most
# vm.max_map_count): programs hold hundreds to a few thousand; reading stops here (about 400 KiB, 3 ms).
MAPPINGS_HOG = 4096
MAPS_TIME = 0.03  # seconds a sample spends reading maps and shares, all sandboxes together
MAPS_FRESH = 0.5  # seconds a process's count of mappings, or its proportional share, is taken as it is
READ_WAIT = 0.02  # seconds the watcher waits for one process's maps or smaps_rollup
LATE_KEPT = 64  # results of reads done after their wait, kept until asked for again
READER_IDLE = 10.0  # seconds a sandbox's reader thread waits for a read before it ends
SHARE_MOVE = 1 << 20  # bytes of resident anonymous memory a process gains or frees before its share is read again
UNDECIDED = 20  # samples in a row a jail may be over only by shares not read yet, before it is judged so


@dataclass(eq=False)
class MemoryBound:
    """A jail's memory bound, and what the watcher keeps between samples to hold it."""

    limit: int
    maps: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> mappings (-1: not read), pages, when
    shares: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> proportional, resident, when
    last_kill: float = 0.0  # when the memory bound last killed
    undecided: int = 0  # samples in a row it may have been over only by shares not read yet
    near: bool = False  # its memory total at the last sample passed 1/NEAR of its bound: sampled quickly too
    reader: _Reader = field(default_factory=lambda: _Reader())  # reads its processes' maps and shares


def plan(limit: int | None, cgroup: str | None) -> tuple[dict[str, int], Enforcement]:
    """(the rlimits memory needs, how it is held): by the cgroup, else by the watcher and a
    per-process ``RLIMIT_AS`` (which stops a single allocator at once)."""
    if limit is None:
        return {}, unbounded("memory", "memory")
    if cgroup:
        return {}, held("memory", f"{cgroup} memory (no swap beyond Limits.swap)")
    return {"RLIMIT_AS": limit}, held(
        "memory",
        f"host watcher: total proportional memory of the jail's processes, sampled every {TICK * 1000:.0f} ms "
        f"(every {QUICK_TICK * 1000:.0f} ms past half the limit), "
        f"each open descriptor charged {DESCRIPTOR_CHARGE >> 10} KiB (pipe buffers, files) and each mapping "
        f"{MAPPING_CHARGE} bytes (a process with {MAPPINGS_HOG} or more: as many as its address space could "
        "hold), biggest process killed past it; rlimit RLIMIT_AS per process; memfd_create ENOSYS (no cgroup)",
    )


def check(p: Procs, m: MemoryBound, queued: int, tree: dict[int, list[int]], maps: Maps, quick: bool) -> None:
    """Kill what takes the jail past its bound; ``queued`` is what its sockets hold. A ``quick``
    sample leaves the count of undecided samples as it is: that count is of full samples, the time
    the jail's reads are given."""
    undecided = m.undecided
    if not quick:
        m.undecided = 0  # kept only while still undecided
    # A killed process frees what it holds once it runs again, which on a busy host may take a second;
    # until then it is left out, so the ones still running are not killed for what it holds.
    pids = [pid for pid in (p.init_pid, *proc.descendants(tree, p.init_pid)) if pid not in p.dying]
    m.maps = {pid: m.maps[pid] for pid in pids if pid in m.maps}  # the gone, and what a recycled pid had
    m.shares = {pid: m.shares[pid] for pid in pids if pid in m.shares}
    # Resident minus file-backed pages first (cheap, counts pages shared after fork twice), and for
    # mappings the most each process's address space could hold, or its fresh count. Only over the
    # bound are mappings counted; only over it with them, the proportional share is read. Each open
    # descriptor is charged DESCRIPTOR_CHARGE on top: what it holds (a pipe's buffer, the file, its
    # inode) is kernel memory no process's pages show.
    held = {pid: proc.descriptors(pid) * DESCRIPTOR_CHARGE for pid in pids}
    statm = {pid: proc.statm(pid) for pid in pids}
    most = proc.map_count_max()
    could = {pid: min(most, statm[pid][0]) for pid in pids}
    fresh = {pid: maps.fresh(m, pid, could[pid]) for pid in pids}
    first = queued + sum(statm[pid][1] + held[pid] + fresh[pid] * MAPPING_CHARGE for pid in pids)
    m.near = first * NEAR > m.limit
    if first <= m.limit:
        return
    mapped = maps.count(m, {pid: statm[pid][0] for pid in pids}, could)
    held = {pid: held[pid] + mapped.get(pid, 0) * MAPPING_CHARGE for pid in pids}
    if queued + sum(statm[pid][1] + held[pid] for pid in pids) <= m.limit:
        return
    shares = maps.shares(m, {pid: statm[pid][1] for pid in pids})
    sizes = {pid: shares[pid][1] + held[pid] for pid in pids}
    if queued + sum(sizes.values()) <= m.limit:
        return
    if queued + sum(shares[pid][0] + held[pid] for pid in pids) <= m.limit:
        # over only if the shares not read yet are all they may be: read on at the next samples,
        # for at most UNDECIDED, then judged on what they may be (a jail can make reads slow; and
        # counted in full samples, not seconds, as a host slowed by its load samples less often)
        if quick:
            return
        m.undecided = undecided + 1
        if m.undecided < UNDECIDED:
            return
    candidates = {pid: size for pid, size in sizes.items() if pid != p.init_pid}
    if not candidates:
        return  # the init alone: it reads at most one bounded request, and is never killed here
    # As many of the biggest as bring the total back under: processes growing together (forked
    # workers) are all stopped at this sample, not one per sample while the others grow on. A jail
    # over again within KILL_WAIT of a kill is brought to half its bound: its processes outgrow
    # what each sample kills, and those killed free what they hold only once they get a CPU.
    again = maps.now - m.last_kill < KILL_WAIT
    victims = biggest_until_under(candidates, queued + sum(sizes.values()) - (m.limit // 2 if again else m.limit))
    m.last_kill = maps.now
    # Queued bytes belong to no process's pages: when they are what is over, the process holding the
    # most sockets is the one (a socket's queue is freed when its last holder is gone).
    holders = socket_holders(candidates) if queued > sum(sizes.values()) else []
    p.kill_trees(tree, holders or victims)


class Maps:
    """What one sample reads of jails' processes that walking their mappings tells, for at most
    ``MAPS_TIME`` of it, all sandboxes together: how many mappings each holds (``/proc/PID/maps``,
    only counted, up to ``MAPPINGS_HOG``) and its proportional share (``smaps_rollup``, 10 ms for
    65,000 mappings). Both are kept in the jail's ``MemoryBound`` and taken as they are for
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

    def fresh(self, m: MemoryBound, pid: int, otherwise: int) -> int:
        """What ``pid``'s mappings are charged as (``MAPPINGS_HOG`` or more: ``otherwise``, the most
        its address space could hold), if counted within ``MAPS_FRESH``; else ``otherwise``."""
        known = m.maps.get(pid)
        if known is None or known[0] < 0 or self.now - known[2] >= MAPS_FRESH or known[0] >= MAPPINGS_HOG:
            return otherwise
        return known[0]

    def count(self, m: MemoryBound, pages: dict[int, int], could: dict[int, int]) -> dict[int, int]:
        """pid -> what the mappings of each of ``pages`` (pid -> pages of address space) are charged
        as: its last count, and a mapping for each page its address space grew since (since it was
        first seen, if never counted: while a read is kept waiting, what grows is still charged);
        or, from ``MAPPINGS_HOG`` on, what it ``could`` hold. While there is time, the processes
        never counted are counted first, then those whose address space grew, most first, then
        those not fresh, oldest first."""
        pids = list(pages)
        for pid in pids:
            m.maps.setdefault(pid, (-1, pages[pid], -MAPS_FRESH))  # seen, not counted yet
        unread = [pid for pid in pids if m.maps[pid][0] < 0]
        grown = sorted(
            (pid for pid in pids if m.maps[pid][0] >= 0 and pages[pid] > m.maps[pid][1]),
            key=lambda pid: pages[pid] - m.maps[pid][1],
            reverse=True,
        )
        stale = sorted((pid for pid in pids if m.maps[pid][0] >= 0), key=lambda pid: m.maps[pid][2])
        for pid in (*unread, *grown, *stale):
            known = m.maps[pid]
            if known[0] >= 0 and self.now - known[2] < MAPS_FRESH and pages[pid] <= known[1]:
                continue  # fresh, and its address space did not grow
            if not self._in_time() or m.reader.busy():
                break
            count = m.reader.read(_count_maps, pid)
            if count is None:  # its mappings' lock is kept taken: charged the most it could hold
                self.stalled.add(pid)
                break
            m.maps[pid] = (count, pages[pid], self.now)
        counted = {pid: max(0, m.maps[pid][0]) + max(0, pages[pid] - m.maps[pid][1]) for pid in pids}
        counted.update(dict.fromkeys(self.stalled & set(pids), MAPPINGS_HOG))
        if self.now - m.last_kill < KILL_WAIT:  # killed for memory within a second: a count not fresh is not taken
            counted.update({pid: MAPPINGS_HOG for pid in pids if self.now - m.maps[pid][2] >= MAPS_FRESH})
        return {pid: could[pid] if n >= MAPPINGS_HOG else min(n, could[pid]) for pid, n in counted.items()}

    def shares(self, m: MemoryBound, resident: dict[int, int]) -> dict[int, tuple[int, int]]:
        """pid -> the least and the most the proportional share (``proc.proportional``) of each of
        ``resident`` (pid -> resident anonymous memory) may be. While there is time, shares never
        read are read first, biggest first; then those whose resident memory moved by
        ``SHARE_MOVE``, most first; then those not fresh, oldest first. A share not read again is its
        last one, plus what its resident memory grew since (new pages are the process's own until it
        forks), or, if that shrank, as little as it shrank to. A share never read is anything from
        nothing to all of its resident memory."""
        shares = m.shares
        moved = {pid: abs(resident[pid] - shares[pid][1]) for pid in resident if pid in shares}
        unread = sorted((pid for pid in resident if pid not in shares), key=resident.__getitem__, reverse=True)
        grown = sorted((pid for pid, by in moved.items() if by >= SHARE_MOVE), key=moved.__getitem__, reverse=True)
        stale = sorted((pid for pid in moved if self.now - shares[pid][2] >= MAPS_FRESH), key=lambda p: shares[p][2])
        for pid in dict.fromkeys((*unread, *grown, *stale)):
            if not self._in_time() or m.reader.busy():
                break
            share = m.reader.read(proc.proportional, pid)
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


def _count_maps(pid: int) -> int:
    return proc.count_maps(pid, MAPPINGS_HOG)


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
