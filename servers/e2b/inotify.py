"""Directory watches of a served sandbox by inotify, as envd's: create, write, remove, rename, chmod.

Runs in the serving host process; the watching itself runs in the jail, as the jail's user: a small
Python program (``WATCHER``, stdlib only) holds an inotify instance on the watched directory (and, for
a recursive watch, every directory beneath it, new ones added as they appear, at most
``MAX_WATCHES``; what a new directory already holds when its watch is in place is reported as
created, as it would be missed otherwise) and writes one record per event to its stdout. So the
host never resolves a path the jail made. What the program writes is untrusted: records are
parsed from NUL-separated fields, a record longer than ``MAX_RECORD`` bytes ends the watch with an
error, each path must lie in the watched directory, and the events a client has not collected yet
are held up to ``MAX_PENDING`` bytes (past that the watch ends with an error the client sees, as a
full inotify queue does). A jail without ``python3``, or whose share of its user's inotify instances
is spent (``sandbox/limits/budget.py``: the jail degrades), gets no inotify watcher: ``start`` returns
None and the caller polls.
"""

from __future__ import annotations

import os
import posixpath
import threading
from dataclasses import dataclass

from ...sandbox import Sandbox
from ...sandbox.errors import SandboxError, ServerError
from ...sandbox.serving import ExecRun, run_sync

MAX_WATCHES = 8192
"""Directories one recursive watch follows at most (each holds an inotify watch in the jail)."""
MAX_RECORD = 2 * 4096 + 64
"""Bytes of one event record from the jail: its path (at most PATH_MAX) and its mask."""
MAX_PENDING = 4 << 20
"""Bytes of events held for a client that has not collected them yet."""
READY_WAIT = 30.0
"""Seconds the in-jail watcher has to report its watches in place."""
SYNC_WAIT = 2.0
"""Seconds a poll waits for the watcher to report every event of what was done before it."""
NO_INSTANCE = 3
"""The watcher's exit status when the jail may make no inotify instance."""

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW = 0x4000

# fsnotify's mapping, which envd uses: one inotify event may be several of these
KINDS = (
    (IN_CREATE | IN_MOVED_TO, "create"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "rename"),
    (IN_ATTRIB, "chmod"),
    (IN_MODIFY, "write"),
    (IN_DELETE | IN_DELETE_SELF, "remove"),
)

WATCHER = r"""
import ctypes, os, select, struct, sys
root, recursive, limit = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
fd = libc.inotify_init1(0o4000)  # IN_NONBLOCK
if fd < 0:
    sys.stderr.write("inotify_init1: " + os.strerror(ctypes.get_errno()))
    sys.exit(3)
MASK = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x01000000 | 0x02000000
dirs = {}
out = sys.stdout.buffer
def add(path):
    if len(dirs) < limit:
        wd = libc.inotify_add_watch(fd, os.fsencode(path), MASK)
        if wd >= 0:
            dirs[wd] = path
def walk(path, announce):
    add(path)
    if recursive:
        for top, names, files in os.walk(path):
            for name in names:
                add(os.path.join(top, name))
            if announce:  # made in a new directory before its watch was in place: as created
                for name in names + files:
                    out.write(b"256\0%s\0" % os.fsencode(os.path.join(top, name)))
walk(root, False)
if not dirs:
    sys.exit("cannot watch " + root)
def drain():
    while True:
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            return
        report(buf)
def report(buf):
    i = 0
    while i < len(buf):
        wd, mask, _, size = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16 : i + 16 + size].rstrip(b"\0")
        i += 16 + size
        base = dirs.get(wd)
        if mask & 0x4000:
            out.write(b"%d\0/\0" % mask)
        if base is None:
            continue
        path = os.path.join(base, os.fsdecode(name)) if name else base
        if mask & 0x8000:
            dirs.pop(wd, None)
            continue
        out.write(b"%d\0%s\0" % (mask, os.fsencode(path)))
        if recursive and mask & 0x40000000 and mask & 0x180:
            walk(path, True)
out.write(b"0\0R\0")
out.flush()
while True:
    ready = select.select([fd, 0], [], [])[0]
    if fd in ready:
        drain()
    if 0 in ready:  # the server asks for every event so far: all read, then a mark
        if not os.read(0, 64):
            sys.exit(0)
        drain()
        out.write(b"0\0F\0")
    out.flush()
"""


@dataclass(frozen=True)
class Event:
    name: str  # relative to the watched directory
    kind: str  # "create", "write", "remove", "rename", "chmod"
    path: str  # absolute, in the jail


class InotifyWatch:
    """One watch: the in-jail watcher's run and the events it reported that nobody has taken yet."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.cond = threading.Condition()
        self.events: list[Event] = []
        self.pending = 0
        self.error: str | None = None
        self.ready = False
        self.buf = b""
        self.run: ExecRun | None = None
        self.ask_w = -1  # the watcher's stdin: a byte asks it for every event so far, then a mark
        self.asked = 0
        self.marked = 0

    def feed(self, data: bytes) -> None:
        """What the in-jail watcher wrote, parsed as it comes (on the command's driver thread)."""
        with self.cond:
            if self.error is not None:
                return
            self.buf += data
            parts = self.buf.split(b"\0")
            self.buf = parts.pop()
            if len(self.buf) > MAX_RECORD or (len(parts) % 2 and len(parts[-1]) > MAX_RECORD):
                self._fail("the jail's watcher wrote a malformed event")
                return
            if len(parts) % 2:  # a mask whose path has not come yet
                self.buf = parts.pop() + b"\0" + self.buf
            for i in range(0, len(parts), 2):
                self._record(parts[i], parts[i + 1])
            self.cond.notify_all()

    def _record(self, raw_mask: bytes, raw_path: bytes) -> None:
        if raw_path == b"R" and not self.ready:
            self.ready = True
            return
        if raw_path == b"F" and raw_mask == b"0":
            self.marked += 1
            return
        try:
            mask = int(raw_mask)
        except ValueError:
            self._fail("the jail's watcher wrote a malformed event")
            return
        if mask & IN_Q_OVERFLOW:
            self._fail("the jail's inotify queue overflowed: events were lost")
            return
        path = raw_path.decode(errors="surrogateescape")
        if path != self.root and not path.startswith(self.root.rstrip("/") + "/"):
            self._fail("the jail's watcher named a path outside the watched directory")
            return
        name = posixpath.relpath(path, self.root) if path != self.root else "."
        for bits, kind in KINDS:
            if mask & bits:
                self.pending += len(raw_path) + 16
                if self.pending > MAX_PENDING:
                    self._fail(f"over {MAX_PENDING} bytes of events were not collected: the watch fell behind")
                    return
                self.events.append(Event(name, kind, path))

    def _fail(self, why: str) -> None:
        self.error = why
        self.events.clear()
        self.cond.notify_all()
        if self.run is not None:
            self.run.kill()

    def take(self, wait: float = 0.0) -> list[Event]:
        """The events not taken yet: with ``wait``, waiting up to that long for one; without, every
        event of what was done in the jail before the call (the watcher is asked to report all it
        has, for up to ``SYNC_WAIT`` seconds). Raises once the watch failed."""
        with self.cond:
            if wait > 0 and not self.events and self.error is None:
                self.cond.wait(wait)
            elif wait <= 0 and self.error is None and self._ask():
                target = self.asked
                self.cond.wait_for(lambda: self.marked >= target or self.error is not None, SYNC_WAIT)
            if self.error is not None:
                raise WatchFailed(self.error)
            events, self.events, self.pending = self.events, [], 0
            return events

    def _ask(self) -> bool:
        """Ask the watcher for every event so far (``cond`` held); False if it cannot be asked now."""
        if self.ask_w < 0:
            return False
        try:
            os.write(self.ask_w, b"?")
        except OSError:  # its pipe is full (it is not reading) or closed: the events there are what we have
            return False
        self.asked += 1
        return True

    def stop(self) -> None:
        with self.cond:
            if self.error is None:
                self.error = "the watch was stopped"
            if self.ask_w >= 0:  # the watcher exits at the end of its stdin
                os.close(self.ask_w)
                self.ask_w = -1
        if self.run is not None:
            self.run.kill()


class WatchFailed(ServerError):
    """The watch ended: the jail's watcher failed, fell behind or exited."""


def start(sb: Sandbox, root: str, recursive: bool, user: str | None = None) -> InotifyWatch | None:
    """A running inotify watch of ``root`` in the jail, or None if the jail has no ``python3`` to run
    the watcher or may make no inotify instance (the caller polls instead). Raises ``WatchFailed`` if
    the watcher could not watch."""
    watch = InotifyWatch(root)
    ask_r, watch.ask_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(watch.ask_w, False)
    asks = open(ask_r, "rb", buffering=0)  # closed by the driver below, when the run ends
    try:
        run = sb.begin_exec(
            ["python3", "-I", "-S", "-c", WATCHER, root, "1" if recursive else "0", str(MAX_WATCHES)],
            stdin=asks,
            on_stdout=watch.feed,
            user=user,
        )
    except SandboxError as exc:
        asks.close()
        watch.stop()
        raise WatchFailed(f"the sandbox could not start a watch: {exc}") from None
    watch.run = run
    result: list[object] = []

    def drive() -> None:
        try:
            result.append(run_sync(run, None))
        except Exception as exc:  # the sandbox stopped under the watch
            result.append(exc)
        asks.close()
        with watch.cond:
            if watch.error is None:
                watch.error = "the watch ended: the sandbox stopped or the directory is gone"
            watch.cond.notify_all()

    threading.Thread(target=drive, name="jailbox-serve-watch", daemon=True).start()
    with watch.cond:
        watch.cond.wait_for(lambda: watch.ready or watch.error is not None, READY_WAIT)
        if watch.ready:
            return watch
    watch.stop()
    with watch.cond:
        watch.cond.wait_for(lambda: bool(result), READY_WAIT)
    got = result[0] if result else None
    if getattr(got, "exit_code", None) in (127, NO_INSTANCE):  # no python3 in this tree; no instance left
        return None
    stderr = getattr(got, "stderr_bytes", b"").decode(errors="replace").strip()
    raise WatchFailed(f"cannot watch {root}: {stderr[-300:] or 'the watcher did not start'}")
