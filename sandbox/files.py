"""Host side of file transfer: the init opens files in the jail's view and hands back descriptors.

No shell, no command line, no tar inside the jail: a path is resolved by the jail's own mount
namespace (so a symlink to ``/etc/shadow`` reads the jail's file), and the bytes move between
descriptors on the host at full speed, holes kept (a sparse file costs the host what it costs the
jail's disk). What ``get`` writes on the host goes through ``hostfs.Destination``: the jail's names
never leave the destination, whatever links the jail or an earlier copy left there. What ``put`` reads on
the host comes through ``hostfs.read_source``: nothing below the source's own path is followed, whatever
links a jail writing the source swaps in while it is read.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from contextlib import closing
from pathlib import Path

from . import hostfs
from .channel import Channel
from .child.requests import MAX_WALK_ENTRIES, MkdirRequest, OpenRequest, StatRequest, SymlinkRequest, WalkRequest
from .errors import ProtocolError, SandboxFileError
from .messages import Done, Opened, Stat, Walk

CHUNK = 1 << 20
READ_LIMIT = 64 << 20
"""What ``read_file`` takes of a file when the caller names no ``max_bytes``."""


def copy_data(src_fd: int, dst_fd: int, size: int | None = None) -> int:
    """Copy a regular file's bytes keeping its holes: a sparse file costs the destination what it costs
    the source (the jail's disk), not its apparent size. Copies ``size`` bytes at most (the file's size
    now if None: a file still growing is cut there). Returns the apparent size."""
    size = os.fstat(src_fd).st_size if size is None else size
    end = 0
    for start, stop in _data_extents(src_fd, size):
        end = start + _copy_range(src_fd, dst_fd, start, stop - start)
    os.ftruncate(dst_fd, max(size, end))
    return size


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of each stretch of data below ``size``, by SEEK_DATA/SEEK_HOLE."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support here: one extent
                yield pos, size
                return
            raise
        stop = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if stop <= start:
            return
        yield start, stop
        pos = stop


def _copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> int:
    """Copy ``count`` bytes at ``offset`` to the same offset; fewer if the source shrank meanwhile."""
    os.lseek(dst_fd, offset, os.SEEK_SET)
    done = 0
    while done < count:
        want = min(count - done, CHUNK)
        try:
            n = os.sendfile(dst_fd, src_fd, offset + done, want)
        except OSError:
            data = os.pread(src_fd, want, offset + done)
            view = memoryview(data)
            while view:
                view = view[os.write(dst_fd, view) :]
            n = len(data)
        if n == 0:
            break
        done += n
    return done


def _open(channel: Channel, path: str, write: bool, mode: int | None = None) -> tuple[Opened, int]:
    req = OpenRequest(path=path, write=write, mode=mode, parents=write)
    opened, fds = channel.call(req, Opened, max_fds=1, path=path)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"open {path}: expected one descriptor, got {len(fds)}")
    fd = fds[0]
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProtocolError(f"open {path}: the jail returned something that is not a regular file")
    return opened, fd


def read_file(channel: Channel, path: str, max_bytes: int | None) -> bytes:
    """The file's bytes, at most ``max_bytes`` (``READ_LIMIT`` if None): a larger file is refused,
    by its size before a byte is read, or once the read passes the cap (a file still growing)."""
    cap = READ_LIMIT if max_bytes is None else max_bytes
    _opened, fd = _open(channel, path, write=False)
    try:
        size = os.fstat(fd).st_size
        parts = [] if size > cap else [os.read(fd, size + 1)]  # one allocation for the usual case
        got = len(parts[0]) if parts else size
        while parts and parts[-1] and got <= cap:
            parts.append(os.read(fd, min(CHUNK, cap + 1 - got)))
            got += len(parts[-1])
    finally:
        os.close(fd)
    if got > cap:
        asked = f"max_bytes={cap}" if max_bytes is not None else f"{cap} bytes (the default; pass max_bytes=N)"
        raise SandboxFileError(errno.EFBIG, f"file is larger than {asked}", path)
    parts = [part for part in parts if part]  # the read that found the end is empty: not joined (a copy)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def write_file(channel: Channel, path: str, data: bytes | Iterable[bytes], mode: int) -> None:
    """Write ``data``, or each chunk of it as it comes (a stream is never held whole)."""
    _, fd = _open(channel, path, write=True, mode=mode)
    with os.fdopen(fd, "wb") as f:
        for chunk in (data,) if isinstance(data, bytes) else data:
            f.write(chunk)


def stat_path(channel: Channel, path: str) -> Stat:
    return channel.call(StatRequest(path), Stat, path=path)[0]


def put(
    channel: Channel, src: Path, dst: str, max_entries: int = MAX_WALK_ENTRIES, max_bytes: int | None = None
) -> None:
    """Copy the host file or tree ``src`` to ``dst`` in the jail. ``src`` is followed as given; below it
    nothing is (``hostfs.read_source``): links are copied as links, files are read through the descriptors
    the walk opened, so a jail that rewrites the source while it is copied cannot swap a host directory in.
    Bounded by ``max_entries`` entries (and ``max_bytes`` bytes of files, if given)."""
    with closing(hostfs.read_source(src, max_entries, max_bytes)) as walk:  # its descriptors, even on an error here
        for entry in walk:
            target = posixpath.join(dst, os.fsdecode(entry.rel)) if entry.rel else dst
            if entry.kind == "dir":
                _mkdir(channel, target, entry.mode)
            elif entry.kind == "link":
                channel.call(SymlinkRequest(path=target, target=os.fsdecode(entry.target)), Done, path=target)
            else:
                _, fd = _open(channel, target, write=True, mode=entry.mode)
                try:
                    copy_data(entry.fd, fd, entry.size)  # the size counted against the bounds
                finally:
                    os.close(fd)


def _mkdir(channel: Channel, path: str, mode: int) -> None:
    channel.call(MkdirRequest(path, mode), Done, path=path)


def get(channel: Channel, src: str, dst: Path) -> None:
    """Copy ``src`` out of the jail to ``dst``. Every name below ``dst`` is the jail's: written through
    ``hostfs.Destination``, which never follows a link and makes only files, directories and links."""
    dst = Path(os.path.abspath(dst))
    info = stat_path(channel, src)
    if info.type == "file":
        with hostfs.Destination(dst.parent) as out:
            _get_file(channel, src, out, os.fsencode(dst.name), info.mode)
        return
    if info.type != "dir":
        raise SandboxFileError(22, "Not a regular file or directory", src)
    try:
        walk = channel.call(WalkRequest(src), Walk, path=src)[0]
    except ProtocolError as exc:  # over Walk's bounds too: copy the tree in parts
        raise ProtocolError(f"the jail's listing of {src} was refused: {exc}") from None
    dirs = {""}
    with hostfs.Destination(dst.parent) as above, above.subdir(dst.name) as out:  # dst's own name, as below it
        for rel, kind, mode, _size, target in walk.entries:
            parts = hostfs.components(rel)
            parent = "/".join(os.fsdecode(p) for p in parts[:-1])
            if parent not in dirs:
                raise ProtocolError(f"the jail listed {rel!r} outside a listed directory")
            if kind == "dir":
                out.mkdir(rel, mode)
                dirs.add(rel)
            elif kind == "link" and target is not None:
                out.symlink(rel, target)
            elif kind == "file":
                _get_file(channel, posixpath.join(src, rel), out, rel, mode)


def _get_file(channel: Channel, src: str, out: hostfs.Destination, rel: str | bytes, mode: int) -> None:
    _, fd = _open(channel, src, write=False)
    try:
        dst_fd = out.create(rel, mode)
        try:
            copy_data(fd, dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(fd)
