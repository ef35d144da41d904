"""Host side: a disk writable layer's bytes and inodes, held by the watcher (``watch.py``).

Runs in the host process (the watcher's thread). A writable layer on the host's disk has no quota:
each sample goes on with a walk of it for at most ``WALK_TIME``, all sandboxes together, the least
recently walked first, and once a walk is done, every process of the jail but its init is killed if
its usage is past a bound and grew since the last walk. What the jail made is only measured: the walk
never follows a link, reads at most ``WALK_SLACK`` times ``inodes`` entries (its bytes, however many,
are all counted: a removal past twice the bound must read as shrinking), and holds at most
``WALK_HELD`` bytes and ``WALK_BASES`` descriptors for what it has still to read (a tree needing more
is judged over its bounds).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..floor import linux as L
from .enforcement import Enforcement, held, unbounded
from .procs import Procs

WALK_TIME = 0.01  # seconds a sample spends walking writable layers, all sandboxes together
WALK_SLACK = 2  # a walk counts up to twice the inodes bound, so growth past it is still seen
WALK_HELD = 16 << 20  # bytes a walk holds at most for directories waiting to be read, their names
WALK_BASES = 64  # directories a walk holds open at most, to open deeper ones from
UNDER_LAYER = L.RESOLVE_NO_SYMLINKS | L.RESOLVE_NO_XDEV  # how a walk opens what is below a layer


@dataclass(eq=False)
class DiskBound:
    """A jail's disk writable layer, its bounds, and the walk under way."""

    upper: Path  # the layer, on the host
    disk: int | None
    inodes: int | None
    last_usage: tuple[int, int] = (0, 0)  # of the last walk done
    walk: _Walk | None = None  # of its writable layer, under way
    walked: float = 0.0  # when its walk last went on: the least recent goes first
    settling: bool = False  # killed at the last walk: what its writers still flushed is not new growth

    def close(self) -> None:
        if self.walk is not None:
            self.walk.close()
            self.walk = None


def plan(disk: int | None, inodes: int | None, upper: str) -> list[Enforcement]:
    """How the writable layer's bytes and inodes are held: by its tmpfs's size and inode count, or
    by the watcher's walk of a layer on disk."""
    if disk is None:
        by_size = unbounded("disk", "disk")
    elif upper == "tmpfs":
        by_size = held("disk", "tmpfs size of the writable layer")
    else:
        by_size = held(
            "disk",
            "host watcher: a bounded walk of the writable layer, the jail's processes killed when it grows "
            "past the limit (no RLIMIT_FSIZE: a sparse file costs only what it holds)",
        )
    if inodes is None:
        by_count = unbounded("inodes", "inodes")
    else:
        by_count = held("inodes", "tmpfs nr_inodes" if upper == "tmpfs" else "host watcher (with disk)")
    return [by_size, by_count]


def check(p: Procs, d: DiskBound, now: float, until: float) -> None:
    """Go on with the walk of the jail's writable layer until ``until``; once it is done, kill the
    jail's processes if its usage is past a bound and grew since the last walk."""
    d.walk = d.walk or _Walk(d.upper, d.inodes)
    d.walked = now
    if not d.walk.step(until):
        return
    usage, overflowed, d.walk = (d.walk.used, d.walk.entries), d.walk.overflowed, None
    over = (d.disk is not None and usage[0] > d.disk) or (d.inodes is not None and usage[1] > d.inodes)
    grew = usage[0] > d.last_usage[0] or usage[1] > d.last_usage[1]
    over, grew = over or overflowed, grew or overflowed  # a tree it could not count may hold anything
    # a command that removes files to get back under is left alone; a killed writer may still be
    # flushing once gone, so the walk after a kill only takes the baseline, not new growth
    if over and grew and not d.settling:
        p.counters["disk_max"] += 1  # first: the killed command's result reads it when it ends
        p.kill_all_but_init(now)
        d.settling = True
    else:
        d.settling = False
    d.last_usage = usage


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
    ``WALK_SLACK`` times the inodes bound (a jail over it that long has been killed since it crossed
    it); bytes cost the walk nothing and are counted whole, so a removal reads as shrinking however
    far past the disk bound the layer is (a walk stopped at a bytes mark would sum a different part
    of the layer each time files go).

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

    def __init__(self, top: Path, inodes: int | None) -> None:
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
                if self.overflowed or (self.inodes is not None and self.entries > self.inodes):
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
