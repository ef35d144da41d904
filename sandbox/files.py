"""Host side of file transfer: the init opens files in the jail's view and hands back descriptors.

No shell, no command line, no tar inside the jail: a path is resolved by the jail's own mount
namespace (so a symlink to ``/etc/shadow`` reads the jail's file), and the bytes move between
descriptors on the host at full speed and with no size limit. Listings from the jail are checked
so a hostile tree cannot make ``get`` write outside its destination.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from .channel import Channel
from .errors import ProtocolError, SandboxFileError
from .messages import Done, Opened, Stat, Walk

CHUNK = 1 << 20


def _copy(src_fd: int, dst_fd: int, limit: int | None = None) -> int:
    copied = 0
    while limit is None or copied < limit:
        want = CHUNK if limit is None else min(CHUNK, limit - copied)
        try:
            n = os.sendfile(dst_fd, src_fd, None, want)
        except OSError:
            data = os.read(src_fd, want)
            n = len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(dst_fd, view) :]
        if n == 0:
            break
        copied += n
    return copied


def _open(channel: Channel, path: str, write: bool, mode: int | None = None) -> tuple[Opened, int]:
    req = {"op": "open", "path": path, "write": write, "mode": mode, "parents": write}
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
    _opened, fd = _open(channel, path, write=False)
    with os.fdopen(fd, "rb") as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise SandboxFileError(27, f"file is larger than max_bytes={max_bytes}", path)  # EFBIG
    return data


def write_file(channel: Channel, path: str, data: bytes, mode: int) -> None:
    _, fd = _open(channel, path, write=True, mode=mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def stat_path(channel: Channel, path: str) -> Stat:
    return channel.call({"op": "stat", "path": path}, Stat, path=path)[0]


def put(channel: Channel, src: Path, dst: str) -> None:
    if not src.exists():
        raise SandboxFileError(2, "No such file or directory", str(src))
    if src.is_dir():
        _mkdir(channel, dst, stat.S_IMODE(src.stat().st_mode))
        for dirpath, dirnames, filenames in os.walk(src):
            rel = os.path.relpath(dirpath, src)
            base = dst if rel == "." else posixpath.join(dst, rel)
            for name in dirnames + filenames:
                host = os.path.join(dirpath, name)
                if os.path.islink(host):
                    channel.call(
                        {"op": "symlink", "target": os.readlink(host), "path": posixpath.join(base, name)},
                        Done,
                        path=posixpath.join(base, name),
                    )
            for name in dirnames:
                host = os.path.join(dirpath, name)
                if not os.path.islink(host):
                    _mkdir(channel, posixpath.join(base, name), stat.S_IMODE(os.stat(host).st_mode))
            for name in filenames:
                host = os.path.join(dirpath, name)
                if not os.path.islink(host):
                    _put_file(channel, Path(host), posixpath.join(base, name))
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    else:
        _put_file(channel, src, dst)


def _mkdir(channel: Channel, path: str, mode: int) -> None:
    channel.call({"op": "mkdir", "path": path, "mode": mode}, Done, path=path)


def _put_file(channel: Channel, src: Path, dst: str) -> None:
    with open(src, "rb") as f:
        _, fd = _open(channel, dst, write=True, mode=stat.S_IMODE(os.fstat(f.fileno()).st_mode))
        try:
            _copy(f.fileno(), fd)
        finally:
            os.close(fd)


def get(channel: Channel, src: str, dst: Path) -> None:
    info = stat_path(channel, src)
    if info.type == "file":
        _get_file(channel, src, dst, info.mode)
        return
    if info.type != "dir":
        raise SandboxFileError(22, "Not a regular file or directory", src)
    walk = channel.call({"op": "walk", "path": src}, Walk, path=src)[0]
    dst.mkdir(parents=True, exist_ok=True)
    dirs = {""}
    for rel, kind, mode, _size, target in walk.entries:
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ProtocolError(f"the jail listed an unsafe path {rel!r}")
        parent = "/".join(parts[:-1])
        if parent not in dirs:
            raise ProtocolError(f"the jail listed {rel!r} outside a listed directory")
        host = dst.joinpath(*parts)
        if kind == "dir":
            host.mkdir(exist_ok=True)
            os.chmod(host, mode | 0o700)
            dirs.add(rel)
        elif kind == "link" and target is not None:
            if host.is_symlink() or host.exists():
                host.unlink()
            os.symlink(target, host)
        elif kind == "file":
            _get_file(channel, posixpath.join(src, rel), host, mode)


def _get_file(channel: Channel, src: str, dst: Path, mode: int) -> None:
    _, fd = _open(channel, src, write=False)
    try:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o777)
        try:
            _copy(fd, out)
            os.fchmod(out, mode & 0o777)
        finally:
            os.close(out)
    finally:
        os.close(fd)
