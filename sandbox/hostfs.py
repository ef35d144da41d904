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
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from types import TracebackType

from .errors import SandboxFileError

PERMISSION_BITS = 0o777
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
