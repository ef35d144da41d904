"""Host side of one command: pipes, bounded capture, timeout, and the two drivers (sync, asyncio).

The host creates the command's pipes and hands their far ends to the init with the request, so
output flows from the command straight to this process: the init never copies a byte. The exit
status arrives on a reply socket private to this command. When the command's own process has
exited, what is already in the pipes is read and whatever still holds them open (a background
server started with ``&``) has them handed to the init, which drains them so that process never
dies of SIGPIPE. Stdin is bytes or a host stream (``Stdin``), copied one ``CHUNK`` at a time as the
command reads, so ``yes | jailbox exec -- head -n1`` holds one chunk, not everything ``yes`` wrote;
a command that stops reading ends the copy quietly.
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import time
from collections.abc import Callable
from typing import IO

from .capture import Capture
from .channel import Channel, parse_reply
from .child.requests import MAX_REQUEST, DrainRequest, ExecRequest, KillRequest
from .errors import ExecError, ProtocolError, SandboxClosed
from .messages import Exit, PtyOpened
from .results import ExecResult
from .seccomp import syscalls

Callback = Callable[[bytes], None]
Stdin = bytes | IO[bytes]
"""What a command reads: bytes, or a host stream read through its descriptor (bytes the stream object
has already buffered are not seen); the stream is never closed here, nor made non-blocking."""
KILL_GRACE = 10.0
CHUNK = 1 << 16


class ExecRun:
    """One command in flight. Drivers call ``on_ready(fd)`` and watch ``readers``/``writers``,
    then ``finish()``, which hands the result to ``on_result`` (the sandbox's accounting) too."""

    def __init__(
        self,
        channel: Channel,
        request: ExecRequest,
        stdin: Stdin | None,
        limit: int,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        counters: Callable[[], dict[str, int]] | None = None,
        on_result: Callable[[ExecResult], None] | None = None,
        paused: Callable[[], float] | None = None,
    ) -> None:
        """``paused``: seconds the sandbox has spent paused so far, which its timeout does not count."""
        size = len(json.dumps(request.to_wire(), separators=(",", ":")))
        if size > MAX_REQUEST:  # the init would drop it unanswered
            raise ExecError(
                f"the command, its environment and cwd come to {size} bytes, over the jail's {MAX_REQUEST}: "
                "pass large data as stdin=... or write it to a file first (sb.write_file('/tmp/in', data))"
            )
        self.channel = channel
        self.on_result = on_result
        self.counters = counters
        self.counters_before = counters() if counters is not None else {}
        self.paused = paused
        self.paused_seen = paused() if paused is not None else 0.0  # counted into the deadline so far
        self.exec_id = request.id
        self.limit = limit
        self.callbacks = {}
        self.captures: dict[int, Capture] = {}
        self.exit: Exit | None = None
        self.timed_out = False
        self.killed = False
        self.pending = memoryview(stdin if isinstance(stdin, bytes) else b"")  # taken, not yet written
        self.source = -1 if stdin is None or isinstance(stdin, bytes) else stdin.fileno()
        self.source_polled = self.source >= 0 and _pollable(self.source)
        close_after_send: list[int] = []
        mine: list[int] = []
        try:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            mine.append(out_r)
            close_after_send.append(out_w)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            mine.append(err_r)
            close_after_send.append(err_w)
            if self.pending or self.source >= 0:
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
                mine.append(in_w)
                os.set_blocking(in_w, False)
            else:  # an empty pipe, not the host's /dev/null: a command could chmod that through fd 0
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
                os.close(in_w)
                in_w = -1
            close_after_send.append(in_r)
            for fd in (out_r, err_r):
                os.set_blocking(fd, False)
            self.started = time.monotonic()
            self.reply = channel.open_call(request, [in_r, out_w, err_w])
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in close_after_send:
                os.close(fd)
        self.out_r, self.err_r, self.in_w = out_r, err_r, in_w
        self.captures = {out_r: Capture(limit), err_r: Capture(limit)}
        self.callbacks = {out_r: on_stdout, err_r: on_stderr}
        self.readers = {out_r, err_r, self.reply.fileno()}
        self.writers: set[int] = set()
        if self.pending or (in_w >= 0 and not self.source_polled):
            self.writers.add(in_w)
        elif in_w >= 0:
            self.readers.add(self.source)

    @property
    def done(self) -> bool:
        return self.exit is not None

    def on_ready(self, fd: int) -> None:
        if fd == self.reply.fileno():
            self._status()
        elif fd == self.source and fd in self.readers:
            self._take_stdin()
        elif fd == self.in_w:
            self._write_stdin()
        elif fd in self.captures:
            self._read(fd, until_blocked=False)

    def _status(self) -> None:
        self.readers.discard(self.reply.fileno())
        try:
            self.exit, _ = parse_reply(self.reply, Exit, 0, None)
        except SandboxClosed:
            raise SandboxClosed("the sandbox died while a command was running") from None
        if self.exit.error:  # the command never started: say why, to a streaming caller too
            message = self.exit.error.encode() + b"\n"
            self.captures[self.err_r].feed(message)
            callback = self.callbacks.get(self.err_r)
            if callback is not None:
                callback(message)
        self.elapsed = time.monotonic() - self.started

    def _read(self, fd: int, until_blocked: bool) -> bool:
        """Read what is there; True once the pipe is at EOF."""
        while True:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                return False
            if not data:
                self.readers.discard(fd)
                return True
            self.captures[fd].feed(data)
            callback = self.callbacks.get(fd)
            if callback is not None:
                callback(data)
            if not until_blocked:
                return False

    def _take_stdin(self) -> bool:
        """Read the next chunk of the stdin stream; False if none is there yet. At EOF the command's
        stdin is closed."""
        try:
            data = os.read(self.source, CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""  # an unreadable stream ends the command's input, as a closed one would
        if not data:
            self._end_stdin()
            return False
        self.pending = memoryview(data)
        self.readers.discard(self.source)
        self.writers.add(self.in_w)
        return True

    def _write_stdin(self) -> None:
        if not self.pending and (self.source < 0 or not self._take_stdin()):
            return
        try:
            written = os.write(self.in_w, self.pending)
        except BlockingIOError:
            return
        except BrokenPipeError:  # the command stopped reading (``head -n1``): stop feeding it, quietly
            self._end_stdin()
            return
        self.pending = self.pending[written:]
        if self.pending:
            return
        if self.source < 0:
            self._end_stdin()
        elif self.source_polled:  # wait for the stream, not for the pipe
            self.writers.discard(self.in_w)
            self.readers.add(self.source)

    def _end_stdin(self) -> None:
        self.pending = memoryview(b"")
        self.readers.discard(self.source)
        self.source = -1
        if self.in_w >= 0:
            self.writers.discard(self.in_w)
            os.close(self.in_w)
            self.in_w = -1

    def check_deadline(self, deadline: float | None, now: float) -> float | None:
        """Past the deadline: kill the command's tree and allow a grace period for its status. Time
        the sandbox spent paused since the last call moves the deadline on: a timeout counts only
        time the command could run."""
        if deadline is not None and self.paused is not None:
            paused = self.paused()
            deadline += paused - self.paused_seen
            self.paused_seen = paused
        if deadline is None or now < deadline:
            return deadline
        if self.killed:
            raise ExecError("the sandbox's init did not stop a timed-out command")
        self.kill()
        return now + KILL_GRACE

    def kill(self) -> None:
        self.timed_out = True
        if not self.killed:
            self.killed = True
            self.channel.send(KillRequest(self.exec_id))

    def abandon(self) -> None:
        """Release everything without a result (the sandbox died or the caller was cancelled)."""
        if self.reply.fileno() >= 0:
            self.reply.close()
        for fd in (self.out_r, self.err_r, self.in_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.out_r = self.err_r = self.in_w = self.source = -1

    def finish(self) -> ExecResult:
        assert self.exit is not None
        leftovers = []
        for fd in (self.out_r, self.err_r):
            if fd in self.readers and not self._read(fd, until_blocked=True):
                leftovers.append(fd)
        if leftovers:
            try:
                self.channel.send(DrainRequest(), leftovers)
            except SandboxClosed:
                pass
        (out, out_drop), (err, err_drop) = self.captures[self.out_r].result(), self.captures[self.err_r].result()
        self.abandon()
        result = ExecResult(
            exit_code=self.exit.exit,
            signal=self.exit.signal,
            stdout_bytes=out,
            stderr_bytes=err,
            stdout_dropped=out_drop,
            stderr_dropped=err_drop,
            output_limit=self.limit,
            timed_out=self.timed_out,
            wall_time=self.elapsed,
            refused_syscalls=_names(self.exit.refused),
            cpu_user=self.exit.utime,
            cpu_system=self.exit.stime,
            peak_memory=self.exit.maxrss_kb * 1024,
            **self._limit_events(),
        )
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _limit_events(self) -> dict[str, bool | None]:
        """Did the sandbox's cgroup or the host's watcher count an OOM kill, a refused fork or a
        kill for disk use while this command ran? ``None`` for what nothing counts here."""
        if self.counters is None:
            return {"oom_killed": None, "pids_limit_hit": None, "disk_limit_hit": None}
        after = self.counters()
        grew = {k: after.get(k, 0) > v for k, v in self.counters_before.items()}
        return {
            "oom_killed": grew.get("oom_kill"),
            "pids_limit_hit": grew.get("pids_max"),
            "disk_limit_hit": grew.get("disk_max"),
        }


def _pollable(fd: int) -> bool:
    """Can a loop wait for ``fd`` to be readable? Pipes, sockets and terminals yes; a regular file or
    /dev/null always has data (or EOF) at hand, and epoll refuses them, so those are read as the
    command's pipe has room."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _names(refused: dict[str, int]) -> dict[str, int]:
    if not refused:
        return {}
    machine = syscalls.arch()
    named: dict[str, int] = {}
    for key, count in refused.items():
        name = syscalls.name_of(key, machine)
        named[name] = named.get(name, 0) + count
    return named


class TtyCommand:
    """A command on a pty of the jail's devpts. The caller pumps ``master``; a readable ``fileno()``
    means the command has exited."""

    def __init__(self, reply: socket.socket) -> None:
        self.reply = reply
        try:
            _, fds = parse_reply(reply, PtyOpened, 1, None)
        except BaseException:
            reply.close()
            raise
        if len(fds) != 1 or not os.isatty(fds[0]):
            for fd in fds:
                os.close(fd)
            reply.close()
            raise ProtocolError("the jail did not hand back a pty")
        self.master = fds[0]

    def fileno(self) -> int:
        return self.reply.fileno()

    def exit_code(self) -> int:
        return parse_reply(self.reply, Exit, 0, None)[0].exit

    def close(self) -> None:
        self.reply.close()
        os.close(self.master)


def run_sync(run: ExecRun, timeout: float | None) -> ExecResult:
    poller = select.poll()
    watched: dict[int, int] = {}
    deadline = None if timeout is None else run.started + timeout
    try:
        while not run.done:
            _sync_watch(poller, watched, run)
            now = time.monotonic()
            deadline = run.check_deadline(deadline, now)
            wait = -1 if deadline is None else max(0, int((deadline - now) * 1000) + 1)
            try:
                events = poller.poll(wait)
            except InterruptedError:
                continue
            for fd, _ in events:
                run.on_ready(fd)
        return run.finish()
    except BaseException:
        run.abandon()
        raise


def _sync_watch(poller: select.poll, watched: dict[int, int], run: ExecRun) -> None:
    wanted = {fd: select.POLLIN for fd in run.readers} | {fd: select.POLLOUT for fd in run.writers}
    for fd in list(watched):
        if fd not in wanted:
            poller.unregister(fd)
            del watched[fd]
    for fd, mask in wanted.items():
        if fd not in watched:
            poller.register(fd, mask)
            watched[fd] = mask


async def run_async(run: ExecRun, timeout: float | None) -> ExecResult:
    import asyncio  # here, not at the top: the CLI's sync path would pay for it (ssl, concurrent.futures)

    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    readers: set[int] = set()
    writers: set[int] = set()
    error: list[BaseException] = []

    def ready(fd: int) -> None:
        try:
            run.on_ready(fd)
        except BaseException as exc:  # surface in the awaiting task, not the loop's handler
            error.append(exc)
        sync()
        wake.set()

    def sync() -> None:
        for fd in readers - run.readers:
            loop.remove_reader(fd)
        for fd in run.readers - readers:
            loop.add_reader(fd, ready, fd)
        for fd in writers - run.writers:
            loop.remove_writer(fd)
        for fd in run.writers - writers:
            loop.add_writer(fd, ready, fd)
        readers.clear()
        readers.update(run.readers)
        writers.clear()
        writers.update(run.writers)

    deadline = None if timeout is None else run.started + timeout
    try:
        sync()
        while not run.done and not error:
            wake.clear()
            now = time.monotonic()
            deadline = run.check_deadline(deadline, now)
            try:
                await asyncio.wait_for(wake.wait(), None if deadline is None else max(0.0, deadline - now))
            except asyncio.TimeoutError:
                pass
        if error:
            raise error[0]
        for fd in readers:
            loop.remove_reader(fd)
        for fd in writers:
            loop.remove_writer(fd)
        readers.clear()
        writers.clear()
        return run.finish()
    except BaseException:
        for fd in readers:
            loop.remove_reader(fd)
        for fd in writers:
            loop.remove_writer(fd)
        run.abandon()
        raise
