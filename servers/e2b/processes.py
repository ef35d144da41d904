"""The commands one served sandbox runs: started, watched, fed, signalled and listed by number.

Runs in the serving host process. Each command is driven on a thread of its own through the jail's
public ``begin_exec``; its output goes to the streams that watch it (the one that started it and any
that connect later) through bounded queues: a watcher that stops reading for ``STALL`` seconds is
dropped instead of holding the command back. Stdin is a pipe whose write end only this process holds,
written with a deadline so a command that never reads cannot pin a request thread.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import queue
import select
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ...sandbox import Sandbox
from ...sandbox.errors import SandboxError, ServerError
from ...sandbox.serving import ExecRun, TtyCommand, run_sync

MAX_PROCESSES = 128
"""Commands one sandbox may have running at once through the server."""
QUEUE_DEPTH = 256
"""Output chunks (each at most 64 KiB) held for one watcher that has not read them yet."""
STALL = 30.0
"""Seconds a watcher may leave its queue full before it is dropped."""
STDIN_DEADLINE = 10.0
"""Seconds one write to a command's stdin may wait for the command to read."""
FIRST_PID = 1000
HANGUP_GRACE = 5.0
"""Seconds a killed PTY's command has to exit after its terminal is hung up."""
MAX_PTY = 1000
"""Largest PTY side, in rows or columns."""


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout", "stderr" or "pty"
    data: bytes


@dataclass(frozen=True)
class End:
    exit_code: int
    status: str
    error: str | None = None
    broken: str | None = None  # the sandbox was killed under it: its streams break with this, as E2B's do


Event = Output | End


class ProcessError(ServerError):
    """A request about a command that cannot be met; ``code`` is a Connect error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Watcher:
    events: queue.Queue[Event | None] = field(default_factory=lambda: queue.Queue(QUEUE_DEPTH))
    dropped: bool = False


class Process:
    """One command: its number, what it was started as, its watchers and its stdin."""

    def __init__(
        self, pid: int, cmd: str, args: list[str], envs: dict[str, str], cwd: str | None, tag: str | None
    ) -> None:
        self.pid = pid
        self.cmd, self.args, self.envs, self.cwd, self.tag = cmd, args, envs, cwd, tag
        self.lock = threading.Lock()
        self.input_lock = threading.Lock()  # held by whoever writes, closes or resizes the input side
        self.watchers: list[Watcher] = []
        self.run: ExecRun | None = None
        self.stdin_w = -1
        self.tty: TtyCommand | None = None
        self.hangup_w = -1
        self.ended = threading.Event()

    def watch(self) -> Watcher:
        w = Watcher()
        with self.lock:
            if self.ended.is_set():
                raise ProcessError("not_found", f"process {self.pid} has ended")
            self.watchers.append(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        with self.lock:
            if w in self.watchers:
                self.watchers.remove(w)

    def publish(self, event: Event) -> None:
        with self.lock:
            watchers = list(self.watchers)
        for w in watchers:
            try:
                w.events.put(event, timeout=STALL)
            except queue.Full:
                w.dropped = True
                self.unwatch(w)
                _wake(w)

    def write_input(self, data: bytes, pty: bool) -> None:
        """Feed the command's stdin pipe, or type into its terminal. Holds ``input_lock`` (not ``lock``) while
        it waits for the command to read, so output keeps flowing meanwhile, and no close of the
        descriptor can slip in between (its number could be reused by then)."""
        with self.input_lock:
            if pty != (self.tty is not None):
                raise ProcessError("invalid_argument", f"process {self.pid} {'has no' if pty else 'has a'} PTY")
            fd = self.tty.master if self.tty is not None else self.stdin_w
            if fd < 0 or self.ended.is_set():
                raise ProcessError(
                    "failed_precondition", f"process {self.pid} has no open stdin (start it with stdin=True)"
                )
            view = memoryview(data)
            deadline = time.monotonic() + STDIN_DEADLINE
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    raise ProcessError("deadline_exceeded", f"process {self.pid} did not read its stdin")
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    raise ProcessError("failed_precondition", f"process {self.pid} closed its stdin") from None

    def close_stdin(self) -> None:
        with self.input_lock:
            if self.stdin_w >= 0:
                os.close(self.stdin_w)
                self.stdin_w = -1

    def resize(self, cols: int, rows: int) -> None:
        with self.input_lock:
            if self.tty is None or self.ended.is_set():
                raise ProcessError("failed_precondition", f"process {self.pid} has no PTY to resize")
            fcntl.ioctl(self.tty.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def kill(self) -> None:
        """Kill the command's whole tree (the jail's init does it; the end event follows). A PTY is hung
        up instead (SIGHUP to its session, as closing a terminal window does): a command that ignores
        that keeps running until the sandbox ends, and its end event says so."""
        with self.lock:
            run = self.run
            if self.hangup_w >= 0 and not self.ended.is_set():
                os.write(self.hangup_w, b"k")
        if run is not None and not self.ended.is_set():
            run.kill()


def _close_tty(proc: Process, tty: TtyCommand, hung_up: bool) -> None:
    """Called with ``proc.lock`` held (so a kill cannot write to a closed hangup pipe)."""
    with proc.input_lock:
        proc.tty = None
        if hung_up:  # its master is closed already
            tty.reply.close()
        else:
            tty.close()
    os.close(proc.hangup_w)
    proc.hangup_w = -1


def _wake(w: Watcher) -> None:
    """Let a dropped watcher's reader see it was dropped, even with its queue full."""
    try:
        w.events.put_nowait(None)
    except queue.Full:
        pass


class ProcessTable:
    """The commands of one sandbox, by the number the client uses for them."""

    def __init__(self, sandbox: Sandbox, base_env: dict[str, str]) -> None:
        self.sandbox = sandbox
        self.base_env = base_env  # the sandbox's own variables (from create), under each command's
        self.lock = threading.Lock()
        self.procs: dict[int, Process] = {}
        self.pids = itertools.count(FIRST_PID)
        self.killed: str | None = None  # why every command ends now (the sandbox is being killed)

    def _add(self, cmd: str, args: list[str], envs: dict[str, str], cwd: str | None, tag: str | None) -> Process:
        with self.lock:
            if len(self.procs) >= MAX_PROCESSES:
                raise ProcessError("resource_exhausted", f"{MAX_PROCESSES} processes already run in this sandbox")
            if tag is not None and any(p.tag == tag for p in self.procs.values()):
                raise ProcessError("already_exists", f"a process tagged {tag!r} is running")
            proc = Process(next(self.pids), cmd, args, envs, cwd, tag)
            self.procs[proc.pid] = proc
        return proc

    def start_pty(
        self,
        cmd: str,
        args: list[str],
        envs: dict[str, str],
        cwd: str | None,
        tag: str | None,
        cols: int,
        rows: int,
        user: str | None = None,
    ) -> tuple[Process, Watcher]:
        """Start a command as session leader on a new terminal of ``cols`` x ``rows``."""
        if not (1 <= cols <= MAX_PTY and 1 <= rows <= MAX_PTY):
            raise ProcessError("invalid_argument", f"pty size must be 1..{MAX_PTY} columns and rows, e.g. 80x24")
        proc = self._add(cmd, args, envs, cwd, tag)
        watcher = proc.watch()
        argv = [cmd, *args]
        if cwd is not None:  # the jail starts a terminal in its workdir: move there first, then become the command
            argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]
        try:
            tty = self.sandbox.exec_tty(argv, env={**self.base_env, **envs}, user=user)
        except (SandboxError, ValueError, OSError) as exc:
            self._forget(proc)
            raise ProcessError("invalid_argument", f"cannot start {cmd!r} on a PTY: {exc}") from None
        os.set_blocking(tty.master, False)
        fcntl.ioctl(tty.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        proc.tty = tty
        hangup_r, proc.hangup_w = os.pipe2(os.O_CLOEXEC)
        threading.Thread(
            target=self._drive_tty, args=(proc, tty, hangup_r), name=f"jailbox-serve-pty-{proc.pid}", daemon=True
        ).start()
        return proc, watcher

    def _drive_tty(self, proc: Process, tty: TtyCommand, hangup_r: int) -> None:
        end = End(-1, "error", "the sandbox stopped while the terminal ran")
        reading = True  # until the terminal is hung up here, or no process holds it any more
        hung_up = False
        try:
            while True:
                watch = [tty.fileno(), *([tty.master] if reading else []), *([] if hung_up else [hangup_r])]
                ready = select.select(watch, [], [], HANGUP_GRACE if hung_up else None)[0]
                if not ready:
                    end = End(-1, "error", "the command kept running after its terminal was hung up")
                    break
                if reading and tty.master in ready:
                    reading = self._pump(proc, tty) is not None
                    continue
                if tty.fileno() in ready:
                    code = tty.exit_code()
                    while reading and self._pump(proc, tty):  # what it wrote before exiting
                        pass
                    if hung_up and code == 0:
                        # killed: a shell that had not started reading yet finds the terminal hung up, reads
                        # end of file and exits 0 (the SIGHUP came before its handler); it ends as hung up
                        code = 128 + signal.SIGHUP
                    end = End(code, f"exit status {code}")
                    break
                if hangup_r in ready:  # kill: hang the terminal up, as closing a terminal window does
                    with proc.input_lock:
                        proc.tty = None
                        os.close(tty.master)
                    reading, hung_up = False, True
        except Exception:  # the sandbox died under the terminal: its watchers hear so
            pass
        os.close(hangup_r)
        self._finish(proc, end, lambda: _close_tty(proc, tty, hung_up))

    @staticmethod
    def _pump(proc: Process, tty: TtyCommand) -> bool | None:
        """Pass on what the terminal has: True if there was some, False if none yet, None once no
        process holds the terminal (EIO), so nobody polls a dead end."""
        try:
            data = os.read(tty.master, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            return None
        if not data:
            return None
        proc.publish(Output("pty", data))
        return True

    def start(
        self,
        cmd: str,
        args: list[str],
        envs: dict[str, str],
        cwd: str | None,
        tag: str | None,
        stdin: bool,
        user: str | None = None,
    ) -> tuple[Process, Watcher]:
        """Start a command; the returned watcher sees all of its output and its end."""
        proc = self._add(cmd, args, envs, cwd, tag)
        watcher = proc.watch()
        stdin_r = -1
        try:
            if stdin:
                stdin_r, proc.stdin_w = os.pipe2(os.O_CLOEXEC)
                os.set_blocking(proc.stdin_w, False)
            source = open(stdin_r, "rb", buffering=0, closefd=True) if stdin_r >= 0 else None
            stdin_r = -1  # the file object owns it now
            try:
                proc.run = self.sandbox.begin_exec(
                    [cmd, *args],
                    cwd=cwd,
                    env={**self.base_env, **envs},
                    stdin=source,
                    on_stdout=lambda data: proc.publish(Output("stdout", data)),
                    on_stderr=lambda data: proc.publish(Output("stderr", data)),
                    user=user,
                )
            except BaseException:
                if source is not None:
                    source.close()
                raise
        except (SandboxError, ValueError, OSError) as exc:
            self._forget(proc)
            raise ProcessError("invalid_argument", f"cannot start {cmd!r}: {exc}") from None
        finally:
            if stdin_r >= 0:
                os.close(stdin_r)
        threading.Thread(
            target=self._drive, args=(proc, source), name=f"jailbox-serve-proc-{proc.pid}", daemon=True
        ).start()
        return proc, watcher

    def _drive(self, proc: Process, source: object) -> None:
        assert proc.run is not None
        end: End
        try:
            result = run_sync(proc.run, None)
            if result.signal is not None:
                end = End(128 + result.signal, f"signal: {result.signal}")
            else:
                end = End(result.exit_code, f"exit status {result.exit_code}")
        except Exception as exc:  # the sandbox died under the command: its watchers hear why
            end = End(-1, "error", f"the sandbox stopped while the command ran: {exc}")
        finally:
            if hasattr(source, "close"):
                source.close()
            proc.close_stdin()
        self._finish(proc, end, lambda: None)

    def _finish(self, proc: Process, end: End, release: Callable[[], None]) -> None:
        if self.killed is not None:
            end = replace(end, broken=self.killed)
        with proc.lock:
            release()
            proc.ended.set()
            watchers = list(proc.watchers)
            proc.watchers.clear()
        for w in watchers:
            try:
                w.events.put(end, timeout=STALL)
            except queue.Full:
                w.dropped = True
                _wake(w)
        self._forget(proc)

    def _forget(self, proc: Process) -> None:
        with self.lock:
            self.procs.pop(proc.pid, None)

    def find(self, pid: int | None, tag: str | None) -> Process:
        with self.lock:
            if pid is not None:
                proc = self.procs.get(pid)
            else:
                proc = next((p for p in self.procs.values() if p.tag == tag), None)
        if proc is None:
            raise ProcessError("not_found", f"process {pid if pid is not None else tag!r} not found")
        return proc

    def list(self) -> list[Process]:
        with self.lock:
            return list(self.procs.values())

    def kill_all(self, why: str | None = None) -> None:
        """Kill every command; ``why``: the sandbox is going away, and their streams break with it
        instead of ending with an exit code (an E2B sandbox killed under a command cuts its stream)."""
        if why is not None:
            self.killed = why
        for proc in self.list():
            proc.kill()


def events(proc: Process, watcher: Watcher, keepalive: float | None, deadline: float | None) -> Iterator[Event | None]:
    """What ``watcher`` sees, ``None`` for a keepalive tick, until the end event. Past ``deadline``
    the command is killed (the client's timeout for the call); a dropped watcher raises."""
    try:
        while True:
            wait = keepalive
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            try:
                event = watcher.events.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    proc.kill()
                    raise ProcessError("deadline_exceeded", f"process {proc.pid} ran past the call's timeout") from None
                yield None
                continue
            if event is None or watcher.dropped:
                raise ProcessError("resource_exhausted", f"the client fell behind process {proc.pid}'s output")
            if isinstance(event, End) and event.broken is not None:
                raise ProcessError("unavailable", event.broken)
            yield event
            if isinstance(event, End):
                return
    finally:
        proc.unwatch(watcher)
