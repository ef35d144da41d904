"""Host side of ``Sandbox.pause()`` and ``resume()``: every process of a jail stopped, then continued.

Runs in the host process: the caller's thread, and for the SIGSTOP way one thread per paused jail
(``_Holder``) from ``pause()`` to ``resume()``. Where the jail has a cgroup that can freeze
(``limits/cgroups.py``), the kernel's freezer does it, fork races included. Otherwise (rootless on
cgroup v1, or a sandbox with no cgroup limit as root) the host sends each process SIGSTOP
(``Stopper``), and finds them itself, never asking the jail: every process of a pid namespace
descends from its pid 1, the init, whose host pid the launcher gave. A walk reads each process's
threads from the init down (``/proc/PID/task/TID/children``, complete for a stopped process; a
process whose first thread has ended is walked too, its others may run), and signals through
pidfds re-checked against the tree (``procs.in_tree``), so no recycled pid is hit.

A jail forks while it is walked, and its processes may send each other SIGCONT, so walks repeat
until two in a row find the same processes and threads, none running, and none scheduled between
its two looks (``/proc/PID/task/TID/schedstat`` unchanged, read after the walk signalled it): then
between the two walks nothing of the jail ran that could have made a process or continued one. A
thread asleep in the kernel (state D) is signalled again at each walk and counts as stopped: it
stops before it runs a user instruction. Each stopped thread is also seized with ``ptrace``
(``PTRACE_SEIZE``): a seized thread in group-stop is in ptrace's stop, which SIGCONT does
not end, so a signal the kernel sends on the jail's behalf (a POSIX timer or a SIGIO armed with
SIGCONT, once nothing of it runs) cannot continue it. Where ptrace is refused (another tracer, Yama's
``ptrace_scope`` 3), that thread is only stopped. A host that dies while its jail is paused takes the
jail with it, as a running one: the init's parent-death signal (the launcher ends with the host)
kills it, stopped or not. At most ``WALK_ROUNDS`` walks in ``WALK_TIME``
seconds, of at most ``WALK_PROCS`` threads each; past any, the stopped are continued and
``PauseFailed`` raised. Resuming sends SIGCONT to exactly the processes this pause stopped (through
the pidfds it kept), then lets every seized thread go, so one the jail had stopped itself stays
stopped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from dataclasses import dataclass

from .errors import PauseFailed, SandboxClosed
from .floor import procstat, small
from .limits import procs
from .limits.cgroups import Cgroup

WALK_ROUNDS = 200  # walks of the jail's processes one pause makes at most
WALK_TIME = 5.0  # seconds one pause walks at most (a loaded host may take seconds to run a signalled thread)
WALK_PROCS = 65_536  # threads one walk visits at most (a rootless jail's count is bounded by RLIMIT_NPROC)
WALK_REST = 0.0002  # seconds between the first two walks while a signalled process has not stopped yet
WALK_REST_MAX = 0.05  # seconds the rest doubles up to: the rounds then last past WALK_TIME, which binds
CHILDREN_MAX = 1 << 20  # bytes of one thread's list of children read (7 bytes a pid)
SMALL_MAX = 512  # bytes of a thread's stat or schedstat line read
HELD = (b"T", b"t", b"Z", b"X", b"x")  # states in which a thread runs nothing (stopped, traced, dead)
HOLDER_WAIT = 5.0  # seconds past WALK_TIME the caller waits for the holder's walk (a host slowed by its load)
PTRACE_SEIZE = 0x4206
PTRACE_DETACH = 17


@dataclass(frozen=True)
class _Process:
    start: bytes  # start time in clock ticks: with the pid, which process this is
    threads: dict[int, bytes]  # tid -> its schedstat line (time on a CPU, time waiting, times scheduled)
    running: bool  # a thread of it was running or runnable after the walk signalled it


class Pause:
    """One jail's pause state: ``pause()`` and ``resume()`` are idempotent and say whether they did
    anything; ``paused_for()`` is the seconds spent paused so far (a command's timeout skips them)."""

    def __init__(self, cgroup: Cgroup | None, init_pid: int) -> None:
        self._init = (init_pid, _start(init_pid, ended=False))  # alive now: a later process with its pid is not it
        self._cgroup = cgroup if cgroup is not None and cgroup.can_freeze else None
        self._stopper = None if self._cgroup is not None else Stopper(init_pid, self._init[1])
        self._lock = threading.Lock()
        self._since: float | None = None  # when the jail was paused, while it is
        self._total = 0.0  # seconds paused before that

    @property
    def way(self) -> str:
        return f"{self._cgroup.kind} freezer" if self._cgroup is not None else "SIGSTOP and ptrace from the host"

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
            if self._init[1] is None or _start(self._init[0], ended=False) != self._init[1]:
                raise SandboxClosed("the sandbox's init has died: nothing to pause (close() it)")
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
    """SIGSTOP to every process of a jail, from its init down, until none runs, each stopped thread
    held in ptrace's group-stop (see the module). ptrace requests count only from the thread that
    seized, so every step runs in a thread of its own, ``_Holder``, from ``stop()`` to ``cont()``."""

    def __init__(self, init_pid: int, init_start: bytes | None) -> None:
        self.init_pid = init_pid
        self.init_start = init_start
        self.pidfds: dict[int, int] = {}  # pid -> pidfd, of each process seen to be of the jail
        self.signalled: set[int] = set()  # the pids this pause sent SIGSTOP, to be sent SIGCONT
        self.seized: set[int] = set()  # tids held in ptrace's group-stop
        self._holder: _Holder | None = None

    def stop(self) -> None:
        holder = _Holder(self)
        holder.start()
        if not holder.stopped.wait(WALK_TIME + HOLDER_WAIT):
            holder.release.set()  # it ends once its walk does, continuing what it stopped
            raise PauseFailed(f"the host's walk of the jail did not end within {WALK_TIME + HOLDER_WAIT:g}s")
        if holder.error is not None:
            holder.join()
            raise holder.error
        self._holder = holder

    def cont(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.release.set()
            holder.join()

    def _stop(self) -> None:
        """In the holder: walk until nothing runs, or continue what was stopped and raise."""
        deadline = time.monotonic() + WALK_TIME
        last: dict[int, _Process] | None = None
        rest = WALK_REST
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
                time.sleep(rest)
                rest = min(2 * rest, WALK_REST_MAX)
        self._cont()
        raise PauseFailed(
            f"the jail's processes could not all be stopped within {WALK_ROUNDS} walks and {WALK_TIME:g}s "
            f"(at most {WALK_PROCS} threads; a jail forking as fast as it can); the sandbox runs on"
        )

    def _cont(self) -> None:
        """In the holder: SIGCONT to each process this pause stopped, then every held thread let go
        (a process the jail had stopped itself goes back to that stop)."""
        for pid in self.signalled:
            try:
                signal.pidfd_send_signal(self.pidfds[pid], signal.SIGCONT)
            except OSError:
                pass  # gone meanwhile (killed by a bound, say)
        # Let go with no signal: a seized thread in group-stop has taken none (its pending ones wait for
        # it to run); one the jail continued right after it was seen stopped and seized may have taken
        # one, which is dropped: only a jail sending itself SIGCONT through the pause loses one.
        for tid in self.seized:
            _ptrace(PTRACE_DETACH, tid)  # fails for one gone; the holder's end lets go of any left
        for pidfd in self.pidfds.values():
            os.close(pidfd)
        self.pidfds, self.signalled, self.seized = {}, set(), set()

    def _walk(self) -> dict[int, _Process] | None:
        """The jail's processes now: each one signalled unless all its threads are stopped or dead,
        each stopped thread seized; None past ``WALK_PROCS`` threads."""
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
            if start is None or not self._of_the_jail(pid, known):
                continue  # gone meanwhile
            running = any(s not in HELD and s != b"D" for s in states.values())
            if any(s not in HELD for s in states.values()):  # D: asleep in the kernel; stops once out of it
                self._signal(pid)
            for tid, state in states.items():
                if state == b"T" and tid not in self.seized and _ptrace(PTRACE_SEIZE, tid):
                    self.seized.add(tid)
            view[pid] = _Process(
                start, {tid: small.read(f"/proc/{pid}/task/{tid}/schedstat", SMALL_MAX) for tid in tids}, running
            )
            for tid in tids:
                children = _children(pid, tid)
                if children is None:
                    return None
                todo.extend(children)
        return view

    def _of_the_jail(self, pid: int, known: set[int]) -> bool:
        """Whether ``pid`` is a process of the jail, through a pidfd opened and then re-checked (the
        init by its start time, any other against the tree, ``procs.in_tree``) and kept: what it
        signals is that process, even once the pid is another's. Its threads' ids are taken from
        ``/proc/PID/task`` of a process seen alive: one recycled between that read and a seize
        would take the host's ``pid_max`` ids to come round."""
        if pid in self.pidfds:
            return True
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        if pid == self.init_pid:
            mine = self.init_start is not None and _start(pid) == self.init_start
        else:
            mine = procs.in_tree(pid, known)
        if not mine:
            os.close(pidfd)
            return False
        self.pidfds[pid] = pidfd
        return True

    def _signal(self, pid: int) -> None:
        self.signalled.add(pid)
        try:
            signal.pidfd_send_signal(self.pidfds[pid], signal.SIGSTOP)
        except OSError:
            pass


class _Holder(threading.Thread):
    """The thread that stops the jail, holds its threads seized while it is paused, and continues it."""

    def __init__(self, stopper: Stopper) -> None:
        super().__init__(name="jailbox-pause", daemon=True)
        self.stopper = stopper
        self.stopped = threading.Event()  # the walk has ended, the jail stopped or ``error`` set
        self.release = threading.Event()  # resume
        self.error: PauseFailed | None = None

    def run(self) -> None:
        try:
            self.stopper._stop()
        except PauseFailed as exc:
            self.error = exc
            self.stopped.set()
            return
        self.stopped.set()
        self.release.wait()
        self.stopper._cont()


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_LIBC.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int) -> bool:
    """``ptrace(request, tid, 0, 0)``; whether it worked. Refused (another tracer, a security
    module), the thread stays only stopped."""
    return bool(_LIBC.ptrace(request, tid, None, None) == 0)


def _tids(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()]
    except OSError:
        return []


def _state(pid: int, tid: int) -> bytes:
    found = procstat.after_name(small.read(f"/proc/{pid}/task/{tid}/stat", SMALL_MAX))
    return found[0] if found else b"X"


def _start(pid: int, ended: bool = True) -> bytes | None:
    """When ``pid`` started (clock ticks since boot); None if it is gone, or if it has ended (a
    zombie, whose threads may still run if its first one alone has ended) and ``ended`` is False."""
    found = procstat.after_name(small.read(f"/proc/{pid}/stat", SMALL_MAX))
    return found[19] if len(found) > 19 and (ended or found[0] not in (b"Z", b"X")) else None


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
