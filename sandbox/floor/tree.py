"""Removing a tree a jail or an image shaped: runs wherever a tree is removed (the host process, the
launcher, the process it spawns as root of a jail's id map, the rootfs worker).

The tree is the jail's to shape: directories nested deeper than PATH_MAX, than the stack frames of a
recursive removal (``shutil.rmtree`` failed with RecursionError at about a thousand levels, and the
tree stayed on the host's disk) or than the descriptors one open directory a level takes. So the
removal holds one open directory at a time, goes down by name with ``O_NOFOLLOW`` and back up through
``..``, checked against the directory it came from, and never follows a link. A directory left
without permission for its owner is given it back, through its descriptor. Nothing in the jail runs
while its tree is removed, so only the shape is hostile, not its changes; one seen all the same
stops the removal with an error. Entries gone meanwhile (another remover at work) are passed over.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from . import linux as L

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str | Path) -> None:
    """Remove ``path`` and everything below it (nothing if it is gone); OSError if something stays."""
    parent = os.open(os.path.dirname(os.path.abspath(path)) or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_at(parent, os.path.basename(os.path.abspath(path)))
    finally:
        os.close(parent)


def remove_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` of ``dir_fd`` and everything below it (nothing if it is gone), never following
    a link: a link named ``name`` is removed itself."""
    try:
        top = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    names: list[str | bytes] = [name]  # the way down
    ids = [(top.st_dev, top.st_ino)]  # and who each directory on it is
    cookies = [0]  # where each directory on the way is to be read on from
    current = _open(dir_fd, name, top)
    try:
        while True:
            below, cookies[-1] = _next_directory(current, cookies[-1])
            if below is None and cookies[-1]:
                below, cookies[-1] = _next_directory(current, 0)  # what a filesystem whose cookies move held back
            if below is not None:
                try:
                    st = os.stat(below, dir_fd=current, follow_symlinks=False)
                    child = _open(current, below, st)
                except FileNotFoundError:
                    continue  # removed meanwhile (by a launcher tidying after its host, say)
                os.close(current)
                current = child
                names.append(below)
                ids.append((st.st_dev, st.st_ino))
                cookies.append(0)
                continue
            if len(names) == 1:
                break
            up = os.open("..", _DIR, dir_fd=current)
            st = os.fstat(up)
            if (st.st_dev, st.st_ino) != ids[-2]:
                os.close(up)
                raise OSError(errno.ESTALE, "a directory moved while its tree was removed", os.fsdecode(names[-1]))
            os.close(current)
            current = up
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(names.pop(), dir_fd=current)
            ids.pop()
            cookies.pop()
    finally:
        os.close(current)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dir_fd)


def _open(dir_fd: int, name: str | bytes, st: os.stat_result) -> int:
    """Open directory ``name``, which ``st`` describes; one its owner left without read, write or
    search permission is given them first (root needs none)."""
    if st.st_mode & stat.S_IRWXU != stat.S_IRWXU and st.st_uid == os.geteuid():
        held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:  # through the descriptor's own link: what was checked, never what a name points to now
            os.chmod(f"/proc/self/fd/{held}", stat.S_IMODE(os.fstat(held).st_mode) | stat.S_IRWXU)
        finally:
            os.close(held)
    fd = os.open(name, _DIR, dir_fd=dir_fd)
    seen = os.fstat(fd)
    if (seen.st_dev, seen.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise OSError(errno.ESTALE, "a directory was replaced while its tree was removed", name)
    return fd


def _next_directory(fd: int, cookie: int) -> tuple[bytes | None, int]:
    """Unlink every entry of ``fd`` from ``cookie`` on up to its next directory: (that directory's
    name, the cookie after it, where to read on once it is removed), or (None, the cookie where
    reading ended). Reading again from the start each time took ext4 past every block emptied before
    (29 s for 20,000 directories in one, against 10 s resuming)."""
    for entry, kind, after in L.entries_from(fd, cookie):
        if kind == L.DT_UNKNOWN:  # a filesystem that does not say: asked
            with contextlib.suppress(FileNotFoundError):
                kind = L.DT_DIR if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode) else 1
        if kind == L.DT_DIR:
            return entry, after
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry, dir_fd=fd)
        cookie = after
    return None, cookie
