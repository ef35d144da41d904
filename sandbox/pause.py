"""Host side of ``Sandbox.pause()`` and ``resume()``: every process of a jail stopped, then continued.

Runs in the host process (the caller's thread). Where the jail has a cgroup that can freeze
(``limits/cgroups.py``), the kernel's freezer does it, fork races included. Otherwise (rootless on
cgroup v1, or a sandbox with no cgroup limit as root) the host sends each process SIGSTOP
(``Stopper``), and finds them itself, never asking the jail: every process of a pid namespace
descends from its pid 1, the init, whose host pid the launcher gave. A walk reads each process's
threads from the init down (``/proc/PID/task/TID/children``, complete for a stopped process), and
signals through pidfds re-checked against the tree (``procs.in_tree``), so no recycled pid is hit.

A jail forks while it is walked, and its processes may send each other SIGCONT, so walks repeat
until two in a row find the same processes and threads, none running, and none scheduled between
its two looks (``/proc/PID/task/TID/schedstat`` unchanged, read after the walk signalled it): then
between the two walks nothing of the jail ran that could have made a process or continued one. A
thread asleep in the kernel (state D) is signalled again at each walk and counts as stopped: it
stops before it runs a user instruction. At most ``WALK_ROUNDS`` walks in ``WALK_TIME`` seconds,
of at most ``WALK_PROCS`` threads each; past any, the stopped are continued and ``PauseFailed``
raised. Resuming continues exactly the processes this pause stopped (through the pidfds it kept), so
one the jail had stopped itself stays stopped.

Not held by the SIGSTOP way (documented in ``docs/python.md``): a signal the kernel sends on the
jail's behalf once it is stopped (a POSIX timer or a SIGIO armed with SIGCONT) continues its process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from .errors import PauseFailed
from .limits import procs
from .limits.cgroups import Cgroup

WALK_ROUNDS = 200  # walks of the jail's processes one pause makes at most
WALK_TIME = 2.0  # seconds one pause walks at most
WALK_PROCS = 65_536  # threads one walk visits at most (a rootless jail's count is bounded by RLIMIT_NPROC)
WALK_REST = 0.0002  # seconds between two walks while a signalled process has not stopped yet
CHILDREN_MAX = 1 << 20  # bytes of one thread's list of children read (7 bytes a pid)
SMALL_MAX = 512  # bytes of a thread's stat or schedstat line read
HELD = (b"T", b"t", b"Z", b"X", b"x")  # states in which a thread runs nothing (stopped, traced, dead)


@dataclass(frozen=True)
class _Process:
    start: bytes  # start time in clock ticks: with the pid, which process this is
    threads: dict[int, bytes]  # tid -> its schedstat line (time on a CPU, time waiting, times scheduled)
    running: bool  # a thread of it was running or runnable after the walk signalled it


class Pause:
    """One jail's pause state: ``pause()`` and ``resume()`` are idempotent and say whether they did
    anything; ``paused_for()`` is the seconds spent paused so far (a command's timeout skips them)."""

    def __init__(self, cgroup: Cgroup | None, init_pid: int) -> None:
        self._cgroup = cgroup if cgroup is not None and cgroup.can_freeze else None
        self._stopper = None if self._cgroup is not None else Stopper(init_pid)
        self._lock = threading.Lock()
        self._since: float | None = None  # when the jail was paused, while it is
        self._total = 0.0  # seconds paused before that

    @property
    def way(self) -> str:
        return f"{self._cgroup.kind} freezer" if self._cgroup is not None else "SIGSTOP from the host"

    @property
    def paused(self) -> bool:
        return self._since is not None

    def paused_for(self) -> float:
        since = self._since
        return self._total + (0.0 if since is None else time.monotonic() - since)

    def pause(self) -> bool:
        with self._lock:
            if self._since is not None:
                return False
            if self._cgroup is not None:
                if not self._cgroup.freeze():
                    raise PauseFailed("the jail's cgroup did not freeze in time; the sandbox runs on")
            else:
                assert self._stopper is not None
                self._stopper.stop()
            self._since = time.monotonic()
            return True

    def resume(self) -> bool:
        with self._lock:
            if self._since is None:
                return False
            if self._cgroup is not None:
                self._cgroup.thaw()
            else:
                assert self._stopper is not None
                self._stopper.cont()
            self._total += time.monotonic() - self._since
            self._since = None
            return True


class Stopper:
    """SIGSTOP to every process of a jail, from its init down, until none runs (see the module)."""

    def __init__(self, init_pid: int) -> None:
        self.init_pid = init_pid
        self.stopped: dict[int, int] = {}  # pid -> pidfd, of each process this pause signalled

    def stop(self) -> None:
        deadline = time.monotonic() + WALK_TIME
        last: dict[int, _Process] | None = None
        for _ in range(WALK_ROUNDS):
            view = self._walk()
            if view is None:
                break
            running = any(p.running for p in view.values())
            if not running and view == last:
                return
            last = None if running else view
            if time.monotonic() >= deadline:
                break
            if running:
                time.sleep(WALK_REST)
        self.cont()
        raise PauseFailed(
            f"the jail's processes could not all be stopped within {WALK_ROUNDS} walks and {WALK_TIME:g}s "
            f"(at most {WALK_PROCS} threads; a jail forking as fast as it can); the sandbox runs on"
        )

    def cont(self) -> None:
        """SIGCONT to each process this pause stopped."""
        stopped, self.stopped = self.stopped, {}
        for pidfd in stopped.values():
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGCONT)
            except OSError:
                pass  # gone meanwhile (killed by a bound, say)
            os.close(pidfd)

    def _walk(self) -> dict[int, _Process] | None:
        """The jail's processes now, each signalled unless all its threads are stopped or dead;
        None past ``WALK_PROCS`` threads."""
        view: dict[int, _Process] = {}
        known = {self.init_pid}
        todo = [self.init_pid]
        threads = 0
        while todo:
            pid = todo.pop()
            if pid in view:
                continue
            tids = _tids(pid)
            threads += len(tids)
            if threads > WALK_PROCS:
                return None
            states = {tid: _state(pid, tid) for tid in tids}
            start = _start(pid)
            if start is None:
                continue  # gone meanwhile
            running = any(s not in HELD and s != b"D" for s in states.values())
            if any(s not in HELD for s in states.values()):  # D: asleep in the kernel; stops once out of it
                self._signal(pid, known)
            view[pid] = _Process(start, {tid: _small(f"/proc/{pid}/task/{tid}/schedstat") for tid in tids}, running)
            for tid in tids:
                children = _children(pid, tid)
                if children is None:
                    return None
                todo.extend(children)
        return view

    def _signal(self, pid: int, known: set[int]) -> None:
        """SIGSTOP to ``pid`` once seen to be of the jail, through a pidfd kept for ``cont()``."""
        pidfd = self.stopped.get(pid)
        if pidfd is None:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                return
            if pid != self.init_pid and not procs.in_tree(pid, known):
                os.close(pidfd)
                return
            self.stopped[pid] = pidfd
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
        except OSError:
            pass


def _small(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, SMALL_MAX)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _tids(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()]
    except OSError:
        return []


def _fields(line: bytes) -> list[bytes]:
    """A stat line's fields from the state on: after the last ``)``, the name being the jail's choice."""
    end = line.rfind(b")")
    return [] if end < 0 else line[end + 2 :].split()


def _state(pid: int, tid: int) -> bytes:
    found = _fields(_small(f"/proc/{pid}/task/{tid}/stat"))
    return found[0] if found else b"X"


def _start(pid: int) -> bytes | None:
    found = _fields(_small(f"/proc/{pid}/stat"))
    return found[19] if len(found) > 19 else None


def _children(pid: int, tid: int) -> list[int] | None:
    """The thread's children; None if the list is longer than ``CHILDREN_MAX`` bytes."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    chunks: list[bytes] = []
    read = 0
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            read += len(chunk)
            if read > CHILDREN_MAX:
                return None
    except OSError:
        return []
    finally:
        os.close(fd)
    return [int(p) for p in b"".join(chunks).split() if p.isdigit()]
