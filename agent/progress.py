"""The batch's live display: on a terminal, a region redrawn in place; elsewhere, plain lines.

On a terminal: an overall bar with the ETA, one line per running task (id, step, elapsed), the counts by
exit status and the tokens so far, redrawn with ANSI cursor moves at most every ``REDRAW`` seconds by a
small thread (so the clocks tick even when nothing happens), finished tasks and notes scrolling above it.
Anywhere else (a pipe, a file, CI logs): one line per finished task and a summary line every
``summary_every`` seconds, never an escape sequence. A task's id is the tasks file's: it is shown
escaped, on one line (the region moves up as many lines as it drew). Plain ANSI, no dependency: the
display is a few lines and must not fight the worker threads for the terminal.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections import Counter
from typing import TextIO

from ..sandbox import printable
from .batch import Observer
from .tasks import Task, TaskResult

REDRAW = 0.2
BAR = 30
CLEAR_LINE = "\x1b[2K"
CLEAR_BELOW = "\x1b[J"


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02}:{rest % 60:02}" if hours else f"{rest // 60}:{rest % 60:02}"


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class Progress(Observer):
    """``with Progress(total, stream):`` around ``Batch.run()``, passed as its observer; thread-safe."""

    def __init__(
        self, total: int, stream: TextIO, *, tty: bool | None = None, summary_every: float = 30.0, already: int = 0
    ) -> None:
        self.total = total
        self.stream = stream
        self.tty = is_terminal(stream) if tty is None else tty
        self.summary_every = summary_every
        self.already = already  # done by an earlier run (resume): shown, not counted in the rate
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, int]] = {}  # id -> (started, step)
        self._counts: Counter[str] = Counter()
        self._tokens = 0
        self._task_tokens: dict[str, int] = {}
        self._log: list[str] = []
        self._notes: queue.SimpleQueue[str] = queue.SimpleQueue()  # note()'s, printed under the lock
        self._drawn = 0
        self._shown: list[str] = []
        self._started = time.monotonic()
        self._closing = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="jailbox-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._ticker.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def started(self, task: Task) -> None:
        with self._lock:
            self._running[task.id] = (time.monotonic(), 0)

    def stepped(self, task_id: str, step: int, tokens: int) -> None:
        with self._lock:
            if task_id in self._running:
                self._running[task_id] = (self._running[task_id][0], step)
            self._tokens += tokens - self._task_tokens.get(task_id, 0)
            self._task_tokens[task_id] = tokens

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._print_notes()
            self._running.pop(result.id, None)
            self._counts[result.exit_status] += 1
            self._tokens += result.tokens - self._task_tokens.pop(result.id, 0)
            line = (
                f"{printable(result.id, line=True)}: {result.exit_status} score={result.score:g} steps={result.steps} "
                f"tokens={result.tokens} {result.wall_seconds:.1f}s"
            )
            if result.error:
                line += f" error={result.error[:200]!r}"
            self._emit(line)

    def note(self, text: str) -> None:
        """A message for the user that must not tear the live region, printed within ``REDRAW``.
        Queued, without the lock: Ctrl-C's handler calls this, and it runs in the main thread,
        which it may have interrupted while that held the lock (a deadlock CI saw, at a task's
        end). ``SimpleQueue.put`` may be called from a signal handler."""
        self._notes.put(text)

    def _print_notes(self) -> None:
        """Under the lock: what ``note`` queued, in order."""
        while True:
            try:
                self._emit(self._notes.get_nowait())
            except queue.Empty:
                return

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        if self._ticker.is_alive():
            self._ticker.join()
        with self._lock:
            self._print_notes()
            if self.tty:
                self._redraw(final=True)
            else:
                self._write(self._summary_line() + "\n")

    def _emit(self, line: str) -> None:
        """Under the lock: plain mode writes at once; the terminal region prints it above itself next redraw."""
        if self.tty:
            self._log.append(line)
        else:
            self._write(line + "\n")

    def _tick(self) -> None:
        last_summary = time.monotonic()
        while not self._closing.wait(REDRAW):
            with self._lock:
                self._print_notes()
                if self.tty:
                    self._redraw()
                elif time.monotonic() - last_summary >= self.summary_every:
                    last_summary = time.monotonic()
                    self._write(self._summary_line() + "\n")

    def _done(self) -> int:
        return sum(self._counts.values())

    def _eta(self) -> str:
        done = self._done()
        if not done:
            return "ETA -"
        elapsed = time.monotonic() - self._started
        return "ETA " + _clock(elapsed / done * (self.total - done))

    def _counts_text(self) -> str:
        counts = ", ".join(f"{status} {n}" for status, n in sorted(self._counts.items())) or "none finished"
        return f"{counts}; tokens {self._tokens:,}"

    def _summary_line(self) -> str:
        done = self._done()
        earlier = f" ({self.already} done earlier)" if self.already else ""
        return (
            f"progress: {done}/{self.total} done{earlier}, {len(self._running)} running, "
            f"{self._counts_text()}, elapsed {_clock(time.monotonic() - self._started)}, {self._eta()}"
        )

    def _region(self, final: bool) -> list[str]:
        done = self._done()
        filled = BAR * done // self.total if self.total else BAR
        percent = 100 * done // self.total if self.total else 100
        elapsed = _clock(time.monotonic() - self._started)
        lines = [f"[{'#' * filled}{'-' * (BAR - filled)}] {done}/{self.total} {percent}%  {elapsed}  {self._eta()}"]
        if not final:
            now = time.monotonic()
            height = shutil.get_terminal_size().lines
            shown = sorted(self._running.items(), key=lambda item: item[1][0])
            room = max(1, height - 4)
            for task_id, (started, step) in shown[:room]:
                lines.append(f"  {printable(task_id, line=True)}  step {step}  {_clock(now - started)}")
            if len(shown) > room:
                lines.append(f"  ... and {len(shown) - room} more running")
        lines.append(self._counts_text() + (f"; {self.already} done earlier" if self.already else ""))
        return lines

    def _redraw(self, final: bool = False) -> None:
        """Under the lock: back to the region's first line, the log lines, then the region, each cut to the
        terminal's width so none wraps (a wrapped line would throw off the next move up); nothing when
        nothing changed."""
        width = max(20, shutil.get_terminal_size().columns - 1)
        region = [line[:width] for line in self._region(final)]
        if region == self._shown and not self._log and not final:
            return
        out = [f"\x1b[{self._drawn}F" if self._drawn else "\r"]
        out += [CLEAR_LINE + line + "\n" for line in self._log]
        out += [CLEAR_LINE + line + "\n" for line in region]
        out.append(CLEAR_BELOW)
        self._log.clear()
        self._shown = region
        self._drawn = 0 if final else len(region)
        self._write("".join(out))

    def _write(self, text: str) -> None:
        """A closed or broken terminal must not stop the batch: the results file is the record."""
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass
