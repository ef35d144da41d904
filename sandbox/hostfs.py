"""Host side: write files whose names the jail chose, beneath one destination directory and never outside it.

Runs in the host process (``Sandbox.get``, and whatever else writes a jail's output or a record of it onto
the host: the agent's answers, trajectories and task directories). The destination itself is the caller's
choice and is opened as given; everything below it is treated as the jail's: a name is one path component
(no ``/``, ``.``, ``..``, NUL), and every path is walked one component at a time from a directory descriptor
with ``O_NOFOLLOW``. A symlink met on the way, planted now or by an
earlier copy into the same directory, is never followed: where the copy wants a directory or a file, the link
itself is replaced; any other kind of entry in the way is an error. Nothing is chmod-ed through a path (only
through descriptors of entries made or checked here), nothing is chowned, and only regular files,
directories and symlinks are made, with permission bits only (no setuid, setgid or sticky bit). Names are
bytes or ``str`` (``os.fsencode``'s surrogate escapes carry names that are not UTF-8), so a jail cannot block
a copy with an odd name.

``read_source`` is the other direction, a host tree copied into a jail (``Sandbox.put``, ``jailbox cp HOST
ID:PATH``, ``--input_dir``): the source may be a read-write bind a jail rewrites while it is read, so it is
walked the same way. The top path is the caller's and is followed as given; below it each name is opened
from its parent's held descriptor with ``O_NOFOLLOW``, files are read through the descriptor opened, and a
symlink met there is handed back as a link (its target, never followed). A directory swapped for a link
while the walk is in it, or above it, changes nothing: the walk holds the directories themselves, not
their paths. What it reads is bounded: entries, depth, and (if asked) bytes of files.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from .child.requests import MAX_WALK_ENTRIES
from .errors import SandboxFileError
from .floor import linux

PERMISSION_BITS = 0o777
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# a source entry: never through a link, never blocking on a FIFO, never taking a terminal
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
SOURCE_DEPTH = 256
"""Directories deep a tree copied into a jail may go: the walk holds one descriptor per level (a path in the
jail stops at PATH_MAX, about 2,000 levels, anyway)."""


def components(rel: str | bytes) -> list[bytes]:
    """``rel`` as safe single names, or SandboxFileError naming it."""
    raw = os.fsencode(rel)
    parts = raw.split(b"/")
    if not raw or any(p in (b"", b".", b"..") or b"\0" in p for p in parts):
        raise SandboxFileError(errno.EINVAL, "unsafe relative path from the jail", os.fsdecode(raw))
    return parts


class Destination:
    """A host directory held open by descriptor; every write resolves beneath it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self) -> Destination:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def subdir(self, rel: str | bytes) -> Destination:
        """The directory ``rel`` as a destination of its own, made if missing; a symlink or file in its
        place is replaced, never followed (``get`` of a directory: its last name may be the jail's link)."""
        parent, name = self._parent(rel)
        try:
            fd = self._open_dir_replacing(parent, name, rel)
        finally:
            os.close(parent)
        sub = Destination.__new__(Destination)
        sub.path, sub._fd = self.path / _show(rel), fd
        return sub

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def mkdir(self, rel: str | bytes, mode: int) -> None:
        """Make (or keep) the directory ``rel``; a symlink or file in its place is replaced, and only the
        directory itself gets ``mode`` (its owner keeps full access, so the copy can go on into it)."""
        parent, name = self._parent(rel)
        try:
            fd = self._open_dir_replacing(parent, name, rel)
            try:
                os.fchmod(fd, (mode & PERMISSION_BITS) | 0o700)
            finally:
                os.close(fd)
        finally:
            os.close(parent)

    def create(self, rel: str | bytes, mode: int) -> int:
        """A descriptor of the regular file ``rel``, created or truncated, writable; the caller closes it.
        A symlink, FIFO, socket or device in its place is removed first, never opened."""
        parent, name = self._parent(rel)
        try:
            for _ in range(2):
                try:
                    fd = os.open(name, _FILE, mode & PERMISSION_BITS, dir_fd=parent)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                        raise SandboxFileError(exc.errno or 0, exc.strerror or str(exc), _show(rel)) from None
                    self._remove_non_dir(parent, name, rel)
                    continue
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode):
                    os.set_blocking(fd, True)
                    os.ftruncate(fd, 0)
                    os.fchmod(fd, mode & PERMISSION_BITS)
                    return fd
                os.close(fd)  # a FIFO opened without a reader, or some other special file
                self._remove_non_dir(parent, name, rel)
            raise SandboxFileError(errno.EEXIST, "something keeps replacing this file", _show(rel))
        finally:
            os.close(parent)

    def write(self, rel: str | bytes, data: bytes, mode: int = 0o644) -> None:
        fd = self.create(rel, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def replace(self, rel: str | bytes, data: bytes, mode: int = 0o644) -> None:
        """Write ``rel`` whole or not at all: a fresh temporary file beside it, renamed over it, so a reader
        never sees half of it; a symlink in its place is replaced by the rename, never written through."""
        parts = components(rel)
        scratch = b".%s.%s.tmp" % (parts[-1], secrets.token_hex(8).encode())
        self.write(b"/".join([*parts[:-1], scratch]), data, mode)
        parent, name = self._parent(rel)
        try:
            os.rename(scratch, name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            self._remove_non_dir(parent, scratch, rel)
            raise SandboxFileError(exc.errno or 0, exc.strerror or str(exc), _show(rel)) from None
        finally:
            os.close(parent)

    def unlink(self, rel: str | bytes) -> None:
        """Remove whatever is at ``rel`` unless it is a directory (a link or file an earlier copy left);
        nothing there is fine."""
        parent, name = self._parent(rel)
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISDIR(st.st_mode):
                self._remove_non_dir(parent, name, rel)
        finally:
            os.close(parent)

    def symlink(self, rel: str | bytes, target: str | bytes) -> None:
        """Make ``rel`` a symlink to ``target`` (a link is only ever made here, never followed)."""
        parent, name = self._parent(rel)
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISDIR(st.st_mode):
                    raise SandboxFileError(errno.EISDIR, "a directory is in the way of a symlink", _show(rel))
                os.unlink(name, dir_fd=parent)
            os.symlink(os.fsencode(target), name, dir_fd=parent)
        finally:
            os.close(parent)

    def _parent(self, rel: str | bytes) -> tuple[int, bytes]:
        """An open descriptor of ``rel``'s parent (every component a real directory) and its last name."""
        parts = components(rel)
        fd = os.dup(self._fd)
        try:
            for part in parts[:-1]:
                try:
                    nfd = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    what = "a symlink or file is in the way" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
                    raise SandboxFileError(exc.errno or 0, what or exc.strerror or str(exc), _show(rel)) from None
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def _open_dir_replacing(self, parent: int, name: bytes, rel: str | bytes) -> int:
        for _ in range(2):
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            try:
                return os.open(name, _DIR, dir_fd=parent)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise SandboxFileError(exc.errno or 0, exc.strerror or str(exc), _show(rel)) from None
                self._remove_non_dir(parent, name, rel)
        raise SandboxFileError(errno.EEXIST, "something keeps replacing this directory", _show(rel))

    @staticmethod
    def _remove_non_dir(parent: int, name: bytes, rel: str | bytes) -> None:
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SandboxFileError(exc.errno or 0, exc.strerror or str(exc), _show(rel)) from None


def _show(rel: str | bytes) -> str:
    return os.fsdecode(rel) if isinstance(rel, bytes) else rel


def open_beneath(dir_fd: int, rel: str | bytes, directory: bool = False) -> int:
    """A read-only descriptor of ``rel`` (``components``: names only) beneath the held directory ``dir_fd``,
    resolved by the kernel with no symlink followed anywhere on the way (ELOOP) and never above ``dir_fd``,
    without blocking on a FIFO or taking a terminal; a directory if ``directory``. For host code that reads
    what a jail or a model made (``jailbox view``); OSError as ``open`` raises it."""
    components(rel)
    flags = _READ | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0)
    return linux.open_beneath(dir_fd, rel, flags, linux.RESOLVE_NO_SYMLINKS)


@dataclass(frozen=True)
class SourceEntry:
    """One entry of a host tree being copied into a jail. ``fd`` (a file's or directory's, read-only) is the
    walk's and stays open only until the walk moves on; a link has ``fd`` -1 and its ``target``."""

    rel: bytes  # below the top, b"" for the top itself
    kind: Literal["file", "dir", "link"]
    mode: int  # permission bits
    size: int
    fd: int
    target: bytes = b""


def read_source(
    path: str | os.PathLike[str], max_entries: int = MAX_WALK_ENTRIES, max_bytes: int | None = None
) -> Generator[SourceEntry, None, None]:
    """The file or tree at ``path``, the top first, each directory before what it holds, walked from held
    descriptors: ``path`` is followed as given, nothing below it (a link there is an entry of kind "link");
    an entry gone between the listing and its open is left out.
    SandboxFileError (one line, naming the host path) for a FIFO, socket or device, an entry that will not
    open, more than ``max_entries`` entries below the top, a tree deeper than ``SOURCE_DEPTH``, or (if
    given) more than ``max_bytes`` bytes of files, counted as each is opened."""
    shown = os.fspath(path)
    try:
        top = os.open(path, _READ)
    except OSError as exc:
        raise _source_error(exc.errno or 0, exc.strerror or str(exc), shown, b"") from None
    frames: list[tuple[int, bytes, Iterator[tuple[bytes, int, int]]]] = []  # the directories the walk is in
    try:
        first = _entry(top, b"", shown)
        if first.kind == "file" and max_bytes is not None and first.size > max_bytes:
            raise _source_error(errno.EFBIG, f"more than {max_bytes} bytes of files", shown, b"")
        yield first
        if first.kind == "file":
            return
        frames.append((top, b"", linux.entries_from(top, 0)))
        top = -1  # the frame holds it now
        entries, size = 0, 0
        while frames:
            fd, rel, names = frames[-1]
            try:
                name = next(names, (None,))[0]
            except OSError as exc:
                raise _source_error(exc.errno or 0, os.strerror(exc.errno or 0), shown, rel) from None
            if name is None:
                os.close(frames.pop()[0])
                continue
            sub = name if not rel else rel + b"/" + name
            entries += 1
            if entries > max_entries:
                raise _source_error(errno.EFBIG, f"more than {max_entries} files, directories and links", shown, b"")
            child = _open_child(fd, name, shown, sub)
            if child is None:
                continue
            if isinstance(child, SourceEntry):
                yield child
                continue
            try:
                entry = _entry(child, sub, shown)
                size += entry.size if entry.kind == "file" else 0
                if max_bytes is not None and size > max_bytes:
                    raise _source_error(errno.EFBIG, f"more than {max_bytes} bytes of files", shown, b"")
                yield entry
                if entry.kind == "dir":
                    if len(frames) >= SOURCE_DEPTH:
                        raise _source_error(errno.ELOOP, f"deeper than {SOURCE_DEPTH} directories", shown, sub)
                    frames.append((child, sub, linux.entries_from(child, 0)))
                    child = -1  # the frame holds it now
            finally:
                if child >= 0:
                    os.close(child)
    finally:
        if top >= 0:
            os.close(top)
        for fd, _rel, _names in frames:
            os.close(fd)


def _open_child(parent: int, name: bytes, shown: str, rel: bytes) -> int | SourceEntry | None:
    """``name`` in the directory ``parent``: an open descriptor, the link found in its place, or None if it
    is gone (removed or renamed since it was listed: the copy is of the tree as the walk found it)."""
    for _ in range(2):  # a link swapped for something else between the open and the readlink: once more
        try:
            return os.open(name, _READ | os.O_NOFOLLOW, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                why = "a socket, not a file, directory or link" if exc.errno == errno.ENXIO else exc.strerror
                raise _source_error(exc.errno or 0, why or str(exc), shown, rel) from None
        try:
            target = os.readlink(name, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise _source_error(exc.errno or 0, exc.strerror or str(exc), shown, rel) from None
            continue
        return SourceEntry(rel, "link", 0o777, len(target), -1, target)
    raise _source_error(errno.EAGAIN, "it kept changing while it was copied", shown, rel)


def _entry(fd: int, rel: bytes, shown: str) -> SourceEntry:
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        os.set_blocking(fd, True)
        return SourceEntry(rel, "file", stat.S_IMODE(st.st_mode), st.st_size, fd)
    if stat.S_ISDIR(st.st_mode):
        return SourceEntry(rel, "dir", stat.S_IMODE(st.st_mode), st.st_size, fd)
    raise _source_error(errno.EINVAL, "a FIFO, socket or device, not a file, directory or link", shown, rel)


def _source_error(code: int, why: str, shown: str, rel: bytes) -> SandboxFileError:
    return SandboxFileError(code, why, os.path.join(shown, os.fsdecode(rel)) if rel else shown)
