"""Host side: the one thread per host process that holds the bounds no kernel mechanism holds here.

Runs in the host process. The jail's own init is untrusted once a command has run, so what no cgroup
or rlimit holds is held from here: a jail's memory without a cgroup (``memory.py``), its sockets'
queues and buffers (``sockets.py``), a disk writable layer (``disk.py``), the host's open-file table
(``hostfiles.py``, for every jail) and descriptors in flight where the jail's root shares its host uid
(``flight.py``). This module is the scheduler: every ``TICK`` one sample reads ``/proc`` once for all
watched sandboxes and runs each bound's check; between two samples, a jail whose memory total passed
1/``memory.NEAR`` of its bound is sampled again every ``QUICK_TICK``, as are the TCP and UDP buffers
of the jails holding a share of the host's once the host's figure has grown by half the smallest
share (``sockets.HostInet``: one small read a quick sample), and each quick sample is followed by a
rest ``QUICK_SHARE`` times as long as it took (forked workers opening pipes at full
speed add 100 MiB of kernel memory in a ``TICK`` on 2 cores; the quick samples take at most a fifth
of the thread's time whatever the host's size).

All are reactive: what a fast allocator or writer gets past the bound before the next sample is
measured in docs/bounds.md. What one jail makes the watcher do is bounded in time (each bound's
module says how), so no jail holds the watcher from its neighbours. A killed process still going is
left out of its jail's memory total, and the jail's other bounds are not judged again, until it is
gone (``procs.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import disk, flight, hostfiles, memory, proc, sockets
from .disk import DiskBound
from .hostfiles import MappedFiles
from .memory import MemoryBound
from .procs import QUICK_SHARE, QUICK_TICK, TICK, Procs
from .sockets import SocketBound


@dataclass(eq=False)
class Watched:
    """One sandbox as the watcher holds it: its processes, and each bound it holds with that bound's
    own state (None: not held here, a cgroup holds it or none is set)."""

    procs: Procs
    memory: MemoryBound | None = None
    disk: DiskBound | None = None
    sockets: SocketBound | None = None
    flight: tuple[int, int] | None = None  # its root's host uid and gid if shared: their count in flight is probed
    files: MappedFiles = field(default_factory=MappedFiles)

    def __post_init__(self) -> None:
        if self.disk is not None:
            self.procs.counters["disk_max"] = 0

    @property
    def counters(self) -> dict[str, int]:
        """Kills by kind (``oom_kill``; ``disk_max`` with a disk bound): a command's result reads them."""
        return self.procs.counters

    def release(self) -> None:
        """Close what the watcher holds of it (its sock_diag socket, its walk's directories)."""
        if self.sockets is not None:
            self.sockets.close()
        if self.disk is not None:
            self.disk.close()


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
        if watched.sockets is None and watched.disk is None and watched.flight is None:
            return
        if self._owner != os.getpid():  # a forked child: no thread of this process samples it
            watched.release()
            return
        with self._checking:
            watched.release()
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
                    near = any(_near(w) for w in self._watched)
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
INET = sockets.HostInet()  # used by the watcher's thread


def check(watched: list[Watched], now: float) -> None:
    """One sample of every watched sandbox; kills what is over its bound."""
    tree: dict[int, list[int]] | None = None
    counters = _counters(watched)
    maps = memory.Maps(now)
    for w in watched:
        w.procs.forget_gone(now)
    used, table = hostfiles.host_files()
    if hostfiles.filling(used, table):
        tree = proc.children()
        hostfiles.check([(w.procs, w.files) for w in watched if not w.procs.dying], tree, table)
    ids = [w.flight for w in watched if w.flight is not None]
    PROBES.keep(ids)
    for key in PROBES.refused(ids, now):
        if flight.due(key, now):
            tree = tree if tree is not None else proc.children()
            flight.check(key, [w.procs for w in watched if w.flight == key and not w.procs.dying], tree, now)
    if _inet(watched):
        INET.reset()  # before the counts below: what is added while they run shows as growth
    for w in sorted(watched, key=lambda w: -w.memory.undecided if w.memory else 0):  # the longest undecided first
        if w.memory is not None:
            tree = tree if tree is not None else proc.children()
            memory.check(w.procs, w.memory, _queued(w, counters), tree, maps, quick=False)
        if w.sockets is not None and (w.sockets.queues is not None or w.sockets.inet is not None):
            if not w.procs.dying:
                sockets.check(w.procs, w.sockets, counters)
    until = time.monotonic() + disk.WALK_TIME
    walking = [w for w in watched if w.disk is not None and not w.procs.dying]
    for w in sorted(walking, key=lambda w: w.disk.walked if w.disk else 0.0):
        assert w.disk is not None
        disk.check(w.procs, w.disk, now, until)


def quick(watched: list[Watched], now: float) -> None:
    """A quick sample between two: the memory of the jails whose total was near their bound at the
    last sample, and the TCP and UDP buffers of all jails with a bound on them once the host's have
    grown by half the smallest (``sockets.HostInet``). Their other bounds wait for the next full sample."""
    near = [w for w in watched if w.memory is not None and w.memory.near]
    inet = _inet(watched)
    rising = inet if INET.rising([w.sockets for w in inet if w.sockets is not None]) else []
    if not near and not rising:
        return
    counters = _counters(watched)
    if rising:
        INET.reset()
    if near:
        tree, maps = proc.children(), memory.Maps(now)
        for w in near:
            assert w.memory is not None
            w.procs.forget_gone(now)
            memory.check(w.procs, w.memory, _queued(w, counters), tree, maps, quick=True)
    for w in rising:
        assert w.sockets is not None
        w.procs.forget_gone(now)
        if not w.procs.dying:
            sockets.check(w.procs, w.sockets, counters)


def _near(w: Watched) -> bool:
    """Whether ``w`` is looked at between two samples: its memory is near its bound, or its TCP and
    UDP buffers are bounded here (the host's figure is read for them)."""
    return (w.memory is not None and w.memory.near) or (w.sockets is not None and w.sockets.inet is not None)


def _inet(watched: list[Watched]) -> list[Watched]:
    """The jails whose TCP and UDP buffers the watcher holds, none of them dying."""
    return [w for w in watched if w.sockets is not None and w.sockets.inet is not None and not w.procs.dying]


def _counters(watched: list[Watched]) -> int:
    """How many sandboxes have their sockets counted: each count waits its share of the thread's time."""
    return sum(w.sockets is not None and (w.sockets.diag is not None or w.sockets.queues is not None) for w in watched)


def _queued(w: Watched, counters: int) -> int:
    return 0 if w.sockets is None else sockets.queued(w.procs, w.sockets, counters)
