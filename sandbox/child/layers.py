"""Copying a jail's writable layer into a read-only one, and squashing layers: runs in the launcher's
child that answers a ``LayerRequest`` (as host root for root's jails, as root of a user namespace
with the jail's map for rootless ones, so it can read files of subordinate ids and give them back).

Every source is data from the jail, which may still be changing it: it is walked from held
directory descriptors, each name opened with ``O_NOFOLLOW`` (a directory swapped for a link to a
host path is copied as that link, or skipped, never followed), every kind decided by ``fstat`` of
what was opened, a file's bytes bounded by the size seen then. The destination is a fresh directory
of the host's own that no jail can reach. Depth, entries and owners are bounded: ids outside the
shifts the host gave are refused, so a layer holds owners in the jail's range only.

Sources are applied in order with the overlay's own rules, so one function both copies an upper
(onto an empty directory) and squashes a chain of layers (bottom first): a whiteout (a character
device 0/0) removes what is below and stays, to hide it in the layers beneath too; an opaque
directory (its ``*.overlay.opaque`` xattr) replaces what is below; any other directory merges.
Stdlib only.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

from ..floor.tree import remove_at

MAX_LAYERS = 16  # read-only layers under one jail's writable one: a checkpoint past it squashes them into one
MAX_DEPTH = 256  # directories open at once along one path: each holds two descriptors here
MAX_ENTRIES = 1 << 22  # entries of one request, over all sources: far above what a jail's tmpfs holds
OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
KEEP, ABSENT = -2, -1  # what is beneath a directory being laid: not probed (keep whiteouts); nothing
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Shift:
    """How ids read from a source become the layer's: "from to count" triples (ids outside refused)."""

    def __init__(self, triples: str) -> None:
        numbers = [int(n) for n in triples.split()]
        self.rows = [tuple(numbers[i : i + 3]) for i in range(0, len(numbers), 3)]

    def __call__(self, value: int) -> int:
        for start, to, count in self.rows:
            if start <= value < start + count:
                return to + value - start
        raise OSError(errno.EOVERFLOW, f"owner {value} is outside the jail's range")


class Budget:
    def __init__(self) -> None:
        self.entries = 0

    def take(self) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise OSError(errno.EFBIG, f"more than {MAX_ENTRIES} entries in the layers")


def apply(src: int, dst: int, uids: Shift, gids: Shift, budget: Budget, beneath: int | None = None) -> None:
    """Lay the tree of directory ``src`` over the tree of directory ``dst`` (both descriptors),
    overlay-wise; the root's own owner, mode and opaque mark too. ``beneath``: for a squash, the
    lower the result will lie on directly; a whiteout in a directory that is not there (or is
    opaque) hides nothing, and is dropped: the overlay reads such a directory of a read-only layer
    as it is, whiteouts listed, since it merges nothing there."""
    links: dict[tuple[int, int], str] = {}  # a source inode seen with other links -> its path in dst
    top = os.open(".", _DIR, dir_fd=src)
    out = os.open(".", _DIR, dir_fd=dst)
    stack: list[tuple[int, int, int, os.stat_result, str, Iterator[str]]] = []
    try:
        under = KEEP if beneath is None else os.open(".", _DIR, dir_fd=beneath)
        stack.append((top, out, under, os.fstat(top), "", iter(sorted(os.listdir(top)))))
        while stack:
            s, d, u, st, path, names = stack[-1]
            name = next(names, None)
            if name is None:
                _finish_dir(s, d, st, uids, gids)
                stack.pop()
                _close(s, d, u)
                continue
            budget.take()
            below = _entry(s, d, u, name, f"{path}{name}", uids, gids, links, dst)
            if below is not None:
                if len(stack) >= MAX_DEPTH:
                    _close(*below)
                    raise OSError(errno.ELOOP, f"directories nested deeper than {MAX_DEPTH}", path + name)
                child, child_out, child_under = below
                stack.append(
                    (child, child_out, child_under, os.fstat(child), f"{path}{name}/", iter(sorted(os.listdir(child))))
                )
    finally:
        for s, d, u, *_ in stack:
            _close(s, d, u)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _under(parent: int, name: str, opaque: bool) -> int:
    """The directory ``name`` beneath, below ``parent`` (``KEEP``: not probed; ``ABSENT``: none)."""
    if parent == KEEP:
        return KEEP
    if parent == ABSENT or opaque:
        return ABSENT
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except OSError as exc:
        return ABSENT if exc.errno == errno.ELOOP else KEEP  # a link is not merged; unreadable: keep all


def _entry(
    src: int,
    dst: int,
    under: int,
    name: str,
    path: str,
    uids: Shift,
    gids: Shift,
    links: dict[tuple[int, int], str],
    root: int,
) -> tuple[int, int, int] | None:
    """Lay one entry of ``src`` over ``dst``; a directory comes back as (its source, its copy, the
    same directory beneath) to walk."""
    try:
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
    except FileNotFoundError:
        return None  # gone meanwhile
    if stat.S_ISDIR(st.st_mode):
        try:
            child = os.open(name, _DIR, dir_fd=src)
        except (FileNotFoundError, NotADirectoryError):
            return None  # replaced meanwhile (by a link: never followed); the next cut sees what it became
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            return None
        try:
            child_out = _dir_below(child, dst, name)
        except BaseException:
            os.close(child)
            raise
        try:
            return child, child_out, _under(under, name, _opaque(child) or _opaque(child_out))
        except BaseException:
            _close(child, child_out)
            raise
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: hides what is below, here and beneath
        remove_at(dst, name)
        if under == ABSENT:
            return None  # nothing beneath to hide
        os.mknod(name, stat.S_IFCHR | 0o000, 0, dir_fd=dst)
        os.chown(name, uids(st.st_uid), gids(st.st_gid), dir_fd=dst, follow_symlinks=False)
        return None
    remove_at(dst, name)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=src)
        except (FileNotFoundError, OSError):
            return None  # replaced meanwhile
        os.symlink(target, name, dir_fd=dst)
        os.chown(name, uids(st.st_uid), gids(st.st_gid), dir_fd=dst, follow_symlinks=False)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
    elif stat.S_ISREG(st.st_mode):
        _copy_file(src, dst, name, path, uids, gids, links, root)
    elif stat.S_ISFIFO(st.st_mode):
        os.mkfifo(name, 0o600, dir_fd=dst)
        _own(dst, name, st, uids, gids)
    # other kinds (sockets, devices a jail cannot make) do not outlive their processes: not kept
    return None


def _dir_below(child: int, dst: int, name: str) -> int:
    """The directory ``name`` of ``dst`` to copy ``child`` into: merged with one below, unless
    ``child`` is opaque or what is below is not a directory."""
    try:
        below = os.stat(name, dir_fd=dst, follow_symlinks=False)
        keep = stat.S_ISDIR(below.st_mode) and not _opaque(child)
    except FileNotFoundError:
        keep = False
    if not keep:
        remove_at(dst, name)
        os.mkdir(name, 0o700, dir_fd=dst)
    return os.open(name, _DIR, dir_fd=dst)


def _opaque(fd: int) -> bool:
    for key in OPAQUE:
        try:
            if os.getxattr(fd, key) == b"y":
                return True
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise
    return False


def _finish_dir(src: int, dst: int, st: os.stat_result, uids: Shift, gids: Shift) -> None:
    os.fchown(dst, uids(st.st_uid), gids(st.st_gid))
    os.fchmod(dst, stat.S_IMODE(st.st_mode))
    _copy_xattrs(src, dst)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_file(
    src: int, dst: int, name: str, path: str, uids: Shift, gids: Shift, links: dict[tuple[int, int], str], root: int
) -> None:
    try:
        fd = os.open(name, _FILE, dir_fd=src)
    except (FileNotFoundError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno in (errno.ELOOP, errno.EACCES, errno.ENXIO):
            return  # gone, or replaced by a link or a node meanwhile
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            os.link(links[key], name, src_dir_fd=root, dst_dir_fd=dst, follow_symlinks=False)
            return
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
        try:
            _copy_data(fd, out, st.st_size)
            os.fchown(out, uids(st.st_uid), gids(st.st_gid))
            os.fchmod(out, stat.S_IMODE(st.st_mode))  # after chown, which clears set-id bits
            _copy_xattrs(fd, out)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
        if st.st_nlink > 1:
            links[key] = path
    finally:
        os.close(fd)


def _copy_data(src: int, dst: int, size: int) -> None:
    """The bytes of ``src`` up to ``size``, holes kept as holes (SEEK_DATA/SEEK_HOLE)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            break  # only a hole is left
        if start >= size:
            break
        end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        while start < end:
            done = _copy_range(src, dst, start, end - start)
            if done == 0:
                end = start  # shrunk meanwhile: what is left reads as a hole
                break
            start += done
        offset = end
    os.ftruncate(dst, size)


def _copy_range(src: int, dst: int, offset: int, count: int) -> int:
    try:
        return os.copy_file_range(src, dst, min(count, 1 << 30), offset, offset)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    os.lseek(dst, offset, os.SEEK_SET)
    return os.sendfile(dst, src, offset, min(count, 1 << 30))


def _own(dst: int, name: str, st: os.stat_result, uids: Shift, gids: Shift) -> None:
    os.chown(name, uids(st.st_uid), gids(st.st_gid), dir_fd=dst, follow_symlinks=False)
    os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=dst)  # a fifo made just now in our own tree
    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)


def _copy_xattrs(src: int, dst: int) -> None:
    """The opaque mark, and the jail's own ``user.*`` attributes; the overlay's other bookkeeping
    (origin, impure, redirect) names the upper it was made in and is dropped."""
    try:
        keys = os.listxattr(src)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return
        raise
    for key in keys:
        if key in OPAQUE or (key.startswith("user.") and not key.startswith("user.overlay.")):
            try:
                os.setxattr(dst, key, os.getxattr(src, key))
            except OSError as exc:
                if exc.errno != errno.ENODATA:  # removed meanwhile
                    raise
