"""Host side: a watched jail's processes, how the watcher kills them, and when it samples.

Runs in the host process (the watcher's thread). Every bound the watcher holds ends, past its
mark, in killing some of a jail's processes; ``Procs`` is what the bounds share of a jail for that:
its init, the processes killed and still going (``dying``), and the counts of kills its results
report. Kills go through a pidfd opened and re-checked against the jail's tree, so a recycled pid
is never hit, and wait at most ``KILL_POLL`` for the killed to go: a jail can make its processes
slow to die (150 holding 60,000 mappings each took a second), and no other sandbox is sampled
while the watcher waits.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..floor import procstat
from . import proc

TICK = 0.05  # seconds between two samples of every watched jail
QUICK_TICK = 0.01  # seconds between quick samples of a jail near its memory bound (``watch.quick``)
QUICK_SHARE = 4  # a quick sample is followed by a rest this many times as long as it took
KILL_POLL = 0.01  # seconds a kill waits for the killed to be gone
KILL_WAIT = 1.0  # seconds a killed process still going is left out, and its jail not judged again
HOLDER_LOOKS = 1024  # descriptors one search for the top socket holder reads, all processes together (6 ms)


@dataclass(eq=False)
class Procs:
    """One watched jail's processes: the descendants of its init (every process of a pid namespace
    descends from its pid 1, so none can leave the set). ``counters`` grow on each kill."""

    init_pid: int
    counters: dict[str, int] = field(default_factory=lambda: {"oom_kill": 0})
    dying: dict[int, float] = field(default_factory=dict)  # pid -> until when: killed, not gone yet
    killed: float = 0.0  # when ``kill_trees`` last killed: figures counted before are stale

    def forget_gone(self, now: float) -> None:
        """Keep in ``dying`` only the processes killed within ``KILL_WAIT`` and still going. While
        any is, the jail is not judged again for its disk, its socket queues or the host's open files
        (what they held is freed once they are gone), and its memory total leaves them out."""
        self.dying = {pid: until for pid, until in self.dying.items() if until > now and os.path.exists(f"/proc/{pid}")}

    def kill_trees(self, tree: dict[int, list[int]], victims: list[int]) -> None:
        """Kill ``victims`` with their descendants, counted as one OOM kill of the jail. Those not gone
        at once are the jail's ``dying`` for ``KILL_WAIT``."""
        self.counters["oom_kill"] += 1  # first: the killed command's result reads it when it ends
        doomed = dict.fromkeys(found for pid in victims for found in (pid, *proc.descendants(tree, pid)))
        self.killed = time.monotonic()
        self.dying.update(dict.fromkeys(kill_all(list(doomed), self.init_pid), self.killed + KILL_WAIT))

    def kill_all_but_init(self, now: float) -> None:
        """Every process of the jail but its init, not counted as an OOM kill (the caller counts)."""
        victims = proc.descendants(proc.children(), self.init_pid)
        self.dying.update(dict.fromkeys(kill_all(victims, self.init_pid), now + KILL_WAIT))


def biggest_until_under(sizes: dict[int, int], over: int) -> list[int]:
    """The biggest processes whose sizes together cover ``over`` bytes (at least one)."""
    victims: list[int] = []
    for pid in sorted(sizes, key=lambda pid: sizes[pid], reverse=True):
        victims.append(pid)
        over -= sizes[pid]
        if over <= 0:
            break
    return victims


def socket_holders(pids: Iterable[int]) -> list[int]:
    """What to kill to free the sockets ``pids`` hold: the process holding the most, or none if
    none holds one. Processes are looked at most descriptors first, and at most ``HOLDER_LOOKS``
    descriptors in all: a jail's processes may hold hundreds of thousands (reading 400,000 kept
    the watcher from every other sandbox for 1.8 s). If those looked at hold no socket and some
    were left unread, all of ``pids``: processes holding other descriptors by the thousand would
    otherwise be killed one a sample while a socket holder fills on."""
    ranked = sorted(pids, key=proc.descriptors, reverse=True)
    holders: dict[int, int] = {}
    left = HOLDER_LOOKS
    for pid in ranked:
        if left <= 0:
            break
        holders[pid], looked = proc.sockets(pid, left)
        left -= looked
    if any(holders.values()):
        return [max(holders, key=lambda pid: holders[pid])]
    return ranked if left <= 0 else []


def in_tree(pid: int, known: set[int]) -> bool:
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
        pid = procstat.parent(pid)
    return False


def kill_all(pids: list[int], init_pid: int) -> list[int]:
    """SIGKILL each through a pidfd, once the pid it holds is seen to still be of this jail; then
    wait at most ``KILL_POLL`` until they are gone. Returns the pids not gone yet: the caller keeps
    them as the jail's ``dying``, and no sample waits longer for them."""
    killed = {}
    known = {init_pid}
    for pid in pids:
        pidfd = kill(pid, init_pid, known)
        if pidfd >= 0:
            killed[pidfd] = pid
    poller = select.poll()
    for pidfd in killed:
        poller.register(pidfd, select.POLLIN)
    pending = set(killed)
    deadline = time.monotonic() + KILL_POLL
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            poller.unregister(fd)
            pending.discard(fd)
    for pidfd in killed:
        os.close(pidfd)
    return [killed[pidfd] for pidfd in pending]


def kill(pid: int, init_pid: int, known: set[int]) -> int:
    """SIGKILL through a pidfd, once the pid it holds is seen to still be of this jail (``known``:
    as ``in_tree``); the pidfd of what was signalled (the caller closes it), else -1."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return -1
    try:
        if pid != init_pid and in_tree(pid, known):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return -1
