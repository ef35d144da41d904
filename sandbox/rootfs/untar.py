"""Safe tar extraction into one directory: the engine the unpack worker runs (stdlib only).

A member's parent path is walked one component at a time from the target's descriptor, never
letting the kernel follow a link (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``): a
symbolic link met on the way is read and its target walked in turn, so no member can write outside
the target, whatever symlinks earlier members (or layers) created:

- symlinks get the meaning they will have in the jail, where the tree is ``/``: an absolute target
  is walked from the tree's root (``var/run -> /run`` reaches ``<tree>/run``), and in it ``..`` at
  the root stays at the root, as the kernel's ``/..`` does;
- absolute names and ``..`` components are refused; so is any member whose parent path passes
  through a relative symbolic link whose ``..`` climbs above the tree's root (it leaves the tree),
  a link loop (more than 40 links), a link to nothing, and a hard link whose target is not a file
  inside the tree;
- the final component is never followed: an existing entry is replaced, not written through;
- device nodes are skipped and reported (the jail builds its own ``/dev``); FIFOs are kept;
- setuid/setgid bits are kept: commands in a jail run with ``no_new_privs`` (the kernel ignores
  the bits), and the store directory is 0700 so no other host user can reach those files;
- a member larger than ``max_member`` bytes, an archive of more than ``max_entries`` members or
  ``max_total`` bytes, or a name longer than ``PATH_MAX`` is refused, as is a truncated member;
- the headers before a member are judged by their declared size before tarfile reads them (it
  reads each whole): a GNU long name or link ('L', 'K') longer than ``PATH_MAX``, a PAX header
  ('x', 'g') over ``PAX_HEADER_MAX``, global PAX records over ``PAX_GLOBAL_MAX`` in all, more than
  ``MAX_HEADERS`` such headers before one member, a malformed PAX record, and sparse members (their
  maps are headers no field bounds) are refused.

Layers (``layer=True``) also apply OCI whiteouts: ``.wh.NAME`` deletes NAME from the layers below,
``.wh..wh..opq`` empties its directory of everything the layers below put there.

Owners: the caller says which ids exist in the namespace the extraction runs in (``max_id``); an
image id above it becomes 65534 (nobody) where that exists, else 0; ``flatten`` makes everything 0.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from typing import IO, Any

from ..floor.linux import RESOLVE_NO_SYMLINKS, open_beneath
from ..floor.tree import remove_at

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
PATH_MAX = 4096
CHUNK = 1 << 20
MAX_HOPS = 40  # symbolic links followed for one path, the kernel's own limit
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY
NOBODY = 65534
# What tarfile reads whole before the member they describe: GNU 'L'/'K' headers hold a name and its
# NUL, refused anyway past PATH_MAX; one PAX header may take what Go's archive/tar (which writes
# and reads most images) allows; global PAX records stay in memory for the rest of the stream, so
# they share one such budget; tarfile reads a chain of these headers recursively, holding each
# until the member, and real archives put at most 'g', 'x', 'L' and 'K' before one.
NAME_HEADER_MAX = PATH_MAX + 1
PAX_HEADER_MAX = 1 << 20
PAX_GLOBAL_MAX = 1 << 20
MAX_HEADERS = 4
_NAME_HEADERS = {tarfile.GNUTYPE_LONGNAME: "GNU long-name", tarfile.GNUTYPE_LONGLINK: "GNU long-link"}
_PAX_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_SPARSE = "sparse files are refused: their maps are unbounded"

_MEMBER, _RELATIVE, _ABSOLUTE = range(3)  # where a path component came from: the name or a link


class Failed(Exception):
    """A member could not be extracted (disk full, ...); the message starts with the member's name."""


class Unsafe(Failed):
    """A member the extraction refuses; the message starts with the member's name."""


class HeaderRefused(Exception):
    """A header refused before it is read; ``member`` names the member when it is known."""

    def __init__(self, what: str, member: str | None = None) -> None:
        super().__init__(what)
        self.member = member


class _Header(tarfile.TarInfo):
    """A header whose extension headers are refused by their declared size before being read.

    ``_proc_member`` is tarfile's documented hook for subclasses; the ``_proc_gnusparse_*``
    methods are where it would read a PAX sparse map (1.0: from the member's data, unbounded)."""

    def _proc_member(self, tf: _Tar) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise HeaderRefused(f"a GNU sparse header ({_SPARSE})")
        kind = _NAME_HEADERS.get(self.type)
        if kind is None and self.type not in _PAX_HEADERS:
            return super()._proc_member(tf)  # type: ignore[misc]  # typeshed lacks the hook
        kind = kind or ("global PAX" if self.type == tarfile.XGLTYPE else "PAX")
        bound = NAME_HEADER_MAX if self.type in _NAME_HEADERS else PAX_HEADER_MAX
        if self.size > bound:
            raise HeaderRefused(f"a {kind} header claims {self.size} bytes, more than the {bound} it may take")
        if self.type == tarfile.XGLTYPE:
            tf.global_pax += self.size
            if tf.global_pax > PAX_GLOBAL_MAX:
                raise HeaderRefused(f"global PAX headers take more than {PAX_GLOBAL_MAX} bytes in all")
        tf.chain += 1
        try:
            if tf.chain > MAX_HEADERS:
                raise HeaderRefused(f"more than {MAX_HEADERS} extension headers before one member")
            if self.type in _PAX_HEADERS:
                # Judged here, not by tarfile: how lenient its record parser is changed within 3.11
                # (3.11.7 reads a record past its header's end and takes NUL padding for a value).
                block = tf.fileobj.read(self._block(self.size))  # type: ignore[attr-defined]
                _check_pax(block[: self.size], kind)
                stream = tf.fileobj
                tf.fileobj = _Replay(block, stream)  # reads as tarfile's stream does
                try:
                    return super()._proc_member(tf)  # type: ignore[misc]
                finally:
                    tf.fileobj = stream
            return super()._proc_member(tf)  # type: ignore[misc]
        # its own records (the next header's errors come wrapped); typeshed lacks the class
        except tarfile.InvalidHeaderError as exc:  # type: ignore[attr-defined]
            raise HeaderRefused(f"a malformed {kind} header ({exc})") from None
        finally:
            tf.chain -= 1

    def _proc_gnusparse_00(self, next: tarfile.TarInfo, raw_headers: object) -> None:
        raise HeaderRefused(f"a PAX sparse file ({_SPARSE})", next.name)

    def _proc_gnusparse_01(self, next: tarfile.TarInfo, pax_headers: object) -> None:
        raise HeaderRefused(f"a PAX sparse file ({_SPARSE})", next.name)

    def _proc_gnusparse_10(self, next: tarfile.TarInfo, pax_headers: object, tf: object) -> None:
        raise HeaderRefused(f"a PAX sparse file ({_SPARSE})", next.name)


_PAX_LENGTH = re.compile(rb"([0-9]{1,20}) ")


def _check_pax(records: bytes, kind: str) -> None:
    """Refuse PAX records that are not each ``LENGTH KEY=VALUE\\n`` wholly inside the header,
    LENGTH counting the whole record (POSIX); NUL padding after the last record is allowed."""
    pos = 0
    while pos < len(records) and records[pos] != 0:
        match = _PAX_LENGTH.match(records, pos)
        length = int(match.group(1)) if match else 0
        end = pos + length
        if not match or end > len(records) or records[end - 1 : end] != b"\n" or b"=" not in records[match.end() : end]:
            raise HeaderRefused(f"a malformed {kind} header (invalid header)")
        pos = end


class _Replay:
    """The stream tarfile reads, with an extension header's block (already read, to be judged) given
    back first."""

    def __init__(self, block: bytes, stream: Any) -> None:  # tarfile's own stream class, private
        self.block: bytes | None = block
        self.stream = stream

    def read(self, size: int) -> bytes:
        if self.block is None:
            return self.stream.read(size)
        block, self.block = self.block, None  # tarfile's next read is that same block
        return block

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _Tar(tarfile.TarFile):
    """tarfile with bounded headers: what it reads before a member is judged first (``_Header``)."""

    tarinfo = _Header
    chain = 0  # headers ('L', 'K', 'x', 'g') read so far before the coming member
    global_pax = 0  # bytes of global PAX headers in the stream


class ArchiveBounds:
    """What one extraction may write: bytes per member, bytes in all, and members."""

    def __init__(self, max_member: int, max_total: int, max_entries: int) -> None:
        self.max_member = max_member
        self.max_total = max_total
        self.max_entries = max_entries


def members(stream: IO[bytes]) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The members of a tar stream (compressed or not) in order, none kept, each header judged
    before it is read (``_Header``); what is refused raises ``Unsafe`` naming the member, or the one
    before it when the refused header would have named it."""
    tf: tarfile.TarFile | None = None
    last = ""
    count = 0
    while True:
        try:
            if tf is None:  # opening reads the first header: judged as the others
                tf = _Tar.open(fileobj=stream, mode="r|*", errorlevel=2)
            member = tf.next()
        except HeaderRefused as exc:
            raise Unsafe(f"{exc.member or _after(last)}: {exc}") from None
        except MemoryError:  # the worker's own bound (worker.MEMORY_MAX) held a parse these bounds missed
            raise Unsafe(f"{_after(last)}: its header needs more memory than this process may take") from None
        except tarfile.ReadError as exc:
            if count == 0:
                raise Unsafe(f"(archive): not a readable tar stream: {exc}") from None
            raise Unsafe(f"(archive after {count} members): corrupt header: {exc}") from None
        except tarfile.TarError as exc:
            raise Unsafe(f"(archive after {count} members): corrupt header: {exc}") from None
        if member is None:
            return
        # a stream can hold millions of members: keep none (typeshed lacks the attribute)
        tf.members.clear()  # type: ignore[attr-defined]
        count += 1
        yield tf, member
        last = member.name


def _after(last: str) -> str:
    return f"(the member after {last})" if last else "(the first member)"


def clean(member: str, name: str) -> list[str]:
    """The components of an archive path, refusing what could point outside the tree."""
    if len(name.encode(errors="surrogateescape")) > PATH_MAX:
        raise Unsafe(f"{member[:200]}...: name longer than {PATH_MAX} bytes")
    if name.startswith("/"):
        raise Unsafe(f"{member}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Unsafe(f"{member}: '..' in its path")
    return parts


class Extractor:
    def __init__(self, dest: str, *, layer: bool, max_id: int, flatten: bool, limits: ArchiveBounds) -> None:
        self.root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.layer = layer
        self.max_id = max_id
        self.flatten = flatten
        self.limits = limits
        self.entries = 0
        self.bytes = 0
        self.skipped: list[str] = []
        self._dir_times: list[tuple[list[str], int]] = []
        self._touched: set[str] = set()

    def close(self) -> None:
        os.close(self.root)

    # --- the archive ----------------------------------------------------------------------

    def extract(self, stream: IO[bytes]) -> None:
        self._touched = set()
        for tf, member in members(stream):
            self.entries += 1
            if self.entries > self.limits.max_entries:
                raise Unsafe(f"{member.name}: more than {self.limits.max_entries} members in the archive")
            try:
                self._member(tf, member)
            except OSError as exc:
                raise Failed(f"{member.name}: {exc.strerror or exc}") from None
            except (tarfile.TarError, EOFError) as exc:
                raise Unsafe(f"{member.name}: the archive ends inside its data or is corrupt ({exc})") from None
            except (OverflowError, ValueError) as exc:  # a PAX time of inf or nan, which no call takes
                raise Unsafe(f"{member.name}: a header field out of range ({exc})") from None
        self._apply_dir_times()

    def _member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = clean(m.name, m.name)
        if m.size > self.limits.max_member:
            raise Unsafe(f"{m.name}: claims {m.size} bytes, more than the limit of {self.limits.max_member}")
        if m.isreg() and self.bytes + m.size > self.limits.max_total:
            raise Unsafe(f"{m.name}: the archive exceeds {self.limits.max_total} bytes in total")
        if self.layer and parts and parts[-1].startswith(WHITEOUT):
            self._whiteout(m.name, parts)
            return
        if not parts:
            if not m.isdir():
                raise Unsafe(f"{m.name}: would replace the root of the tree")
            self._attrs(self.root, m)
            return
        for i in range(1, len(parts) + 1):  # its parents belong to this layer too (opaque dirs keep them)
            self._touched.add("/".join(parts[:i]))
        if m.ischr() or m.isblk():
            self.skipped.append(f"{m.name}: device node")
            return
        parent = self._parent(m.name, parts[:-1])
        try:
            self._create(tf, m, parent, parts)
        finally:
            os.close(parent)

    def _create(self, tf: tarfile.TarFile, m: tarfile.TarInfo, parent: int, parts: list[str]) -> None:
        name = parts[-1]
        existing = _lstat(parent, name)
        if m.isdir():
            if existing is not None and not stat.S_ISDIR(existing.st_mode):
                os.unlink(name, dir_fd=parent)
                existing = None
            if existing is None:
                os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                self._attrs(fd, m)
            finally:
                os.close(fd)
            self._dir_times.append((parts, int(m.mtime)))
            return
        if existing is not None:
            remove_at(parent, name)
        if m.isreg():
            self._file(tf, m, parent, name)
        elif m.issym():
            if len(m.linkname.encode(errors="surrogateescape")) > PATH_MAX:
                raise Unsafe(f"{m.name}: symlink target longer than {PATH_MAX} bytes")
            os.symlink(m.linkname, name, dir_fd=parent)
            uid, gid = self._ids(m)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
        elif m.islnk():
            self._hardlink(m, parent, name)
        elif m.isfifo():
            os.mkfifo(name, 0o600, dir_fd=parent)
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                uid, gid = self._ids(m)
                os.chown(f"/proc/self/fd/{fd}", uid, gid)
                os.chmod(f"/proc/self/fd/{fd}", m.mode & 0o7777)
            finally:
                os.close(fd)
        else:
            self.skipped.append(f"{m.name}: unsupported member type {m.type!r}")

    def _file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, parent: int, name: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            src = tf.extractfile(m)
            written = 0
            if src is not None:
                while True:
                    chunk = src.read(min(CHUNK, m.size - written))
                    if not chunk:
                        break
                    written += len(chunk)
                    _write_all(fd, chunk)
                    if written >= m.size:
                        break
            if written != m.size:
                raise Unsafe(f"{m.name}: the archive ends inside its data ({written} of {m.size} bytes)")
            self.bytes += written
            self._attrs(fd, m)
        finally:
            os.close(fd)

    def _hardlink(self, m: tarfile.TarInfo, parent: int, name: str) -> None:
        target = clean(m.name, m.linkname)
        if not target:
            raise Unsafe(f"{m.name}: hard link to the root of the tree")
        tparent = self._open_dir(m.name, target[:-1], create=False)
        try:
            st = _lstat(tparent, target[-1])
            if st is None:
                raise Unsafe(f"{m.name}: hard link to {m.linkname}, which is not in the tree")
            if stat.S_ISDIR(st.st_mode):
                raise Unsafe(f"{m.name}: hard link to a directory ({m.linkname})")
            os.link(target[-1], name, src_dir_fd=tparent, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(tparent)

    def _whiteout(self, member: str, parts: list[str]) -> None:
        name = parts[-1]
        if name.startswith(WHITEOUT + WHITEOUT) and name != OPAQUE:
            return  # aufs bookkeeping (.wh..wh.plnk and the like): nothing to apply
        parent = self._open_dir(member, parts[:-1], create=True)
        try:
            if name == OPAQUE:
                self._prune(parent, "/".join(parts[:-1]))
                return
            victim = name[len(WHITEOUT) :]
            if victim in ("", ".", ".."):
                raise Unsafe(f"{member}: a whiteout of {victim!r}")
            st = _lstat(parent, victim)
            if st is not None:
                remove_at(parent, victim)
        finally:
            os.close(parent)

    def _prune(self, dir_fd: int, prefix: str) -> None:
        """Remove everything under ``prefix`` that this layer did not put there (opaque dir)."""
        for child in os.listdir(dir_fd):
            rel = f"{prefix}/{child}" if prefix else child
            st = _lstat(dir_fd, child)
            if st is None:
                continue
            if rel not in self._touched:
                remove_at(dir_fd, child)
            elif stat.S_ISDIR(st.st_mode):
                fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    self._prune(fd, rel)
                finally:
                    os.close(fd)

    # --- paths and attributes ------------------------------------------------------------

    def _parent(self, member: str, parts: list[str]) -> int:
        return self._open_dir(member, parts, create=True)

    def _open_dir(self, member: str, parts: list[str], create: bool) -> int:
        """A descriptor of the directory ``parts`` under the root, created if missing (owner 0).

        The kernel never follows a link here: each component is opened alone with
        RESOLVE_NO_SYMLINKS, and a symlink's target is pushed back on the path to walk (from the
        root if absolute), so the jail's meaning of the link is what counts. ``names`` is the
        real, link-free path walked so far: ``..`` reopens its parent from the root, since
        RESOLVE_BENEATH refuses ``..`` from a descriptor. Only the member's own missing
        components are created, never one a link names (that link leads nowhere).
        """
        todo = [(part, _MEMBER) for part in reversed(parts)]
        names: list[str] = []
        hops = 0
        cur = os.dup(self.root)
        try:
            while todo:
                name, origin = todo.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if names:
                        names.pop()
                    elif origin != _ABSOLUTE:  # the root's '..' is the root only for an absolute link
                        raise Unsafe(f"{member}: its path goes through a symbolic link that leaves the tree")
                    nxt = self._reopen(member, names)
                else:
                    child = self._child(member, cur, name, create=create, linked=origin != _MEMBER)
                    if child is None:  # a symlink: walk its target instead
                        hops += 1
                        if hops > MAX_HOPS:
                            raise Unsafe(f"{member}: its path goes through a symbolic link loop")
                        target = os.readlink(name, dir_fd=cur)
                        kind = _ABSOLUTE if target.startswith("/") else _RELATIVE
                        todo.extend((part, kind) for part in reversed(target.split("/")))
                        if kind != _ABSOLUTE:
                            continue
                        names = []
                        nxt = os.dup(self.root)
                    else:
                        names.append(name)
                        nxt = child
                os.close(cur)
                cur = nxt
        except BaseException:
            os.close(cur)
            raise
        return cur

    def _child(self, member: str, cur: int, name: str, create: bool, linked: bool) -> int | None:
        """The directory ``name`` in ``cur``, None if it is a symlink. If missing, made when
        ``create``, unless a link named it (``linked``): that link leads nowhere."""
        try:
            return open_beneath(cur, name, DIR_FLAGS, RESOLVE_NO_SYMLINKS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            if exc.errno == errno.ENOENT and linked:
                raise Unsafe(f"{member}: its path goes through a symbolic link that leads nowhere") from None
            if exc.errno != errno.ENOENT or not create:
                raise _path_error(member, exc) from None
        os.mkdir(name, 0o755, dir_fd=cur)
        os.chown(name, 0, 0, dir_fd=cur, follow_symlinks=False)
        return open_beneath(cur, name, DIR_FLAGS, RESOLVE_NO_SYMLINKS)

    def _reopen(self, member: str, names: list[str]) -> int:
        try:
            return open_beneath(self.root, "/".join(names), DIR_FLAGS, RESOLVE_NO_SYMLINKS)
        except OSError as exc:
            raise _path_error(member, exc) from None

    def _ids(self, m: tarfile.TarInfo) -> tuple[int, int]:
        if self.flatten:
            return 0, 0
        return self._map(m.uid), self._map(m.gid)

    def _map(self, value: int) -> int:
        if 0 <= value <= self.max_id:
            return value
        return NOBODY if NOBODY <= self.max_id else 0

    def _attrs(self, fd: int, m: tarfile.TarInfo) -> None:
        uid, gid = self._ids(m)
        os.fchown(fd, uid, gid)
        os.fchmod(fd, m.mode & 0o7777)  # after chown, which clears setuid bits
        if not m.isdir():
            os.utime(fd, (int(m.mtime), int(m.mtime)))

    def _apply_dir_times(self) -> None:
        for parts, mtime in reversed(self._dir_times):
            try:
                parent = self._open_dir("/".join(parts), parts[:-1], create=False)
            except (Failed, OSError):
                continue  # removed by a later whiteout or replaced
            try:
                fd = os.open(parts[-1], DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError:
                continue
            finally:
                os.close(parent)
            try:
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
        self._dir_times = []


def _path_error(member: str, exc: OSError) -> Unsafe:
    if exc.errno == errno.EXDEV:
        return Unsafe(f"{member}: its path goes through a symbolic link that leaves the tree")
    if exc.errno == errno.ELOOP:
        return Unsafe(f"{member}: its path goes through a symbolic link loop")
    if exc.errno == errno.ENOTDIR:
        return Unsafe(f"{member}: a parent in its path is not a directory")
    if exc.errno == errno.ENOENT:
        return Unsafe(f"{member}: refers to a directory that is not in the tree")
    return Unsafe(f"{member}: {exc.strerror}")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
