"""The store of named root filesystems under ``$JAILBOX_CACHE_DIR`` (default
``$XDG_CACHE_HOME/jailbox``, else ``~/.cache/jailbox``), kept 0700 so no other host user reaches
the trees (which may hold setuid files owned by subordinate ids).

Layout::

    rootfs/<quoted name>/tree        the root filesystem a jail uses as its lower layer, as is
    rootfs/<quoted name>/meta.json   an ``Entry``: kind, source, digest, size, image config, id map
    tmp/<quoted name>.<random>/      an entry being made (same layout); renamed into rootfs/ when done
    locks/<quoted name>.lock         flock held while an entry of that name is being made
    blobs/                           the content-addressed blob cache (``blobs.py``)

Making an entry (pull, import and build all do this)::

    store = Store()
    with store.create("slim", source="rootfs/slim.yaml", kind="build") as staging:
        unpack.extract_tar(proc.stdout, staging.tree)      # fill staging.tree
        staging.config = ImageConfig(env={...}, workdir="/testbed")   # optional
    # success: renamed into place atomically, meta.json written; an existing entry is replaced
    # failure or Ctrl-C: the staging tree is removed (as root of the jail's namespace)

``create`` holds the name's lock for the whole block, so two processes making the same name run
one after the other; inside the block ``store.get(name)`` shows what the other one left, and
``staging.abandon()`` keeps it instead. A process killed mid-way leaves a ``tmp/`` (or ``trash/``)
directory that the next ``create`` or ``remove`` of that name removes, and so does ``remove_stale``
(``jailbox cleanup``) once no process holds that name's lock; it also removes ``import-*``
directories no live import holds and stale partial downloads (``blobs.remove_stale``).

As host root, an entry recorded for another map of root's jails (the identity map ``0 0 65536`` of
jailbox before root's jails had a subordinate range, or an earlier range) is shifted into today's
map the first time a jail uses it (``adopt``): every owner moves by the difference, under the
name's lock, and the record is updated.

Reading: ``get(name)`` (exact), ``resolve(name)`` (also an image reference's canonical form, so
``python:3.11-slim`` finds ``docker.io/library/python:3.11-slim``), ``list()``, ``remove(name)``,
``du(name)``, ``require(name)`` (raises ``RootfsNotFound`` listing what exists and how to get it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import stat
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import RootfsError, RootfsNotFound
from ..floor.idmap import IdMap
from ..floor.wire import WireError
from . import blobs, shipped, unpack
from .image import ImageConfig

Kind = Literal["pull", "import", "build"]
MAX_NAME = 200
IMPORT_GRACE = 60.0  # an import locks its directory right after making it


def cache_dir() -> Path:
    env = os.environ.get("JAILBOX_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg).absolute() / "jailbox"


class Entry(BaseModel):
    """One stored root filesystem, as ``meta.json`` records it."""

    model_config = ConfigDict(extra="ignore")

    name: str
    kind: Kind
    source: str
    created: float
    digest: str | None = Field(None, description="manifest digest of a pulled or imported image")
    platform: str | None = None
    size: int = Field(0, description="bytes of file data written when it was made")
    entries: int = 0
    idmap: dict = Field(default_factory=dict, description="the id map its owners were written for")
    config: ImageConfig = Field(default_factory=ImageConfig)
    path: Path = Field(Path(), exclude=True)

    @property
    def tree(self) -> Path:
        return self.path / "tree"


class Staging:
    """An entry being made: fill ``tree``; set ``config``, ``digest``, ``platform`` as known."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = path / "tree"
        self.config = ImageConfig()
        self.digest: str | None = None
        self.platform: str | None = None
        self.size = 0
        self.entries = 0
        self.abandoned = False

    def add_stats(self, result: dict) -> None:
        """Count what an ``unpack`` call reports."""
        self.size += int(result.get("bytes", 0))
        self.entries += int(result.get("entries", 0))

    def abandon(self) -> None:
        """Keep whatever is stored under this name; discard the staging tree."""
        self.abandoned = True


def check_name(name: str) -> str:
    if not name or name in (".", "..") or "\0" in name or name.strip() != name:
        raise RootfsError(f"invalid root filesystem name {name!r}")
    if len(_quote(name)) > MAX_NAME:
        raise RootfsError(f"root filesystem name too long: {name[:80]}...")
    return name


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir()

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = self.root.stat()
        if st.st_uid != os.getuid():
            raise RootfsError(f"{self.root} belongs to uid {st.st_uid}, not to you; set JAILBOX_CACHE_DIR")
        if st.st_mode & 0o077:  # never chmod a directory we did not make (JAILBOX_CACHE_DIR=/tmp...)
            raise RootfsError(
                f"{self.root} is open to other users (mode {oct(st.st_mode & 0o777)}); stored trees may hold "
                f"setuid files, so it must be private: chmod 700 {self.root}, or set JAILBOX_CACHE_DIR elsewhere"
            )
        for sub in ("rootfs", "tmp", "trash", "locks", "blobs"):
            (self.root / sub).mkdir(exist_ok=True, mode=0o700)

    def entry_dir(self, name: str) -> Path:
        return self.root / "rootfs" / _quote(check_name(name))

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive, between processes and threads, for everything that makes ``name``."""
        self.ensure()
        fd = os.open(self.root / "locks" / (_quote(check_name(name)) + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def create(self, name: str, *, source: str, kind: Kind) -> Iterator[Staging]:
        """Make (or replace) entry ``name`` atomically; see the module docstring."""
        final = self.entry_dir(name)
        with self.lock(name):
            self._remove_stale(name)
            staging = Staging(self.root / "tmp" / f"{_quote(name)}.{uuid.uuid4().hex[:8]}")
            staging.path.mkdir(mode=0o700)
            staging.tree.mkdir(mode=0o755)
            try:
                yield staging
                if not staging.abandoned:
                    self._commit(name, source, kind, staging, final)
            finally:
                if staging.path.exists():
                    unpack.rmtree(staging.path)

    def _commit(self, name: str, source: str, kind: Kind, staging: Staging, final: Path) -> None:
        entry = Entry(
            name=name,
            kind=kind,
            source=source,
            created=time.time(),
            digest=staging.digest,
            platform=staging.platform,
            size=staging.size,
            entries=staging.entries,
            idmap=unpack.jail_map().to_wire(),
            config=staging.config,
        )
        meta = staging.path / "meta.json"
        meta.write_text(entry.model_dump_json(indent=2))
        old = None
        if final.exists():
            old = self.root / "trash" / f"{final.name}.{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(staging.path, final)
        if old is not None:
            unpack.rmtree(old)

    def _remove_stale(self, name: str) -> None:
        """What a killed process left of ``name``: staging trees in ``tmp/``, replaced or removed trees
        in ``trash/`` (we hold the name's lock, and every rename and removal happens under it)."""
        prefix = _quote(name) + "."
        for sub in ("tmp", "trash"):
            for path in (self.root / sub).iterdir():
                if path.name.startswith(prefix) and "." not in path.name[len(prefix) :]:
                    unpack.rmtree(path)

    def remove_stale(self, force: bool = False) -> list[Path]:
        """What killed processes left (see the module docstring), removed and listed; a store that is
        not there, or not this user's, is left alone. ``force`` removes partial downloads of any age."""
        try:
            if self.root.stat().st_uid != os.getuid():
                return []
        except FileNotFoundError:
            return []
        removed = blobs.remove_stale(self.root / "blobs", force)
        for sub in ("tmp", "trash"):
            base = self.root / sub
            for path in sorted(base.iterdir()) if base.is_dir() else []:
                if path.name.startswith("import-"):
                    if _younger_than(path, IMPORT_GRACE):
                        continue  # made, and not yet locked, this instant
                    lock = path  # a live import holds a lock on its directory itself
                else:
                    name = path.name.rsplit(".", 1)[0]
                    lock = self.root / "locks" / (name + ".lock")
                with _unless_held(lock) as free:
                    if free:
                        unpack.rmtree(path)
                        removed.append(path)
        return removed

    def get(self, name: str) -> Entry | None:
        try:
            path = self.entry_dir(name)
        except RootfsError:
            return None
        return _read(path)

    def resolve(self, name: str) -> Entry | None:
        """``name`` as stored, or the canonical form of an image reference (``python:3.11``)."""
        entry = self.get(name)
        if entry is not None:
            return entry
        from .reference import Reference

        try:
            canonical = str(Reference.parse(name))
        except RootfsError:
            return None
        return self.get(canonical) if canonical != name else None

    def require(self, name: str) -> Entry:
        entry = self.resolve(name)
        if entry is None:
            raise RootfsNotFound(not_found_message(name, [e.name for e in self.list()]))
        return entry

    def list(self) -> list[Entry]:
        base = self.root / "rootfs"
        if not base.is_dir():
            return []
        found = [_read(p) for p in sorted(base.iterdir())]
        return [e for e in found if e is not None]

    def remove(self, name: str, force: bool = False) -> Entry:
        """Remove an entry; refused while a live sandbox (with a disk writable layer) uses it."""
        entry = self.resolve(name)
        if entry is None:
            raise RootfsNotFound(not_found_message(name, [e.name for e in self.list()]))
        users = [] if force else users_of(entry.tree)
        if users:
            raise RootfsError(
                f"{entry.name} is in use by {len(users)} live sandbox(es) (host pids "
                f"{', '.join(str(u) for u in sorted(set(users)))}); close them first, or force the removal"
            )
        with self.lock(entry.name):
            trash = self.root / "trash" / f"{entry.path.name}.{uuid.uuid4().hex[:8]}"
            os.rename(entry.path, trash)
            unpack.rmtree(trash)
            self._remove_stale(entry.name)
        return entry

    def du(self, name: str) -> dict:
        return unpack.du(self.require(name).tree)

    def adopt(self, entry: Entry) -> Entry:
        """``entry`` owned for today's map of root's jails: as host root, a tree recorded for
        another single-range map is shifted (see the module docstring); otherwise as it is."""
        current = unpack.jail_map()
        if os.getuid() != 0 or not entry.idmap or entry.idmap == current.to_wire():
            return entry
        with self.lock(entry.name):
            fresh = _read(entry.path)  # another process may have shifted it meanwhile
            if fresh is None or fresh.idmap == current.to_wire():
                return fresh or entry
            old = _single_range(fresh)
            new = _single_range(fresh.model_copy(update={"idmap": current.to_wire()}))
            if old is None or new is None:
                raise RootfsError(
                    f"{fresh.name} was stored for the id map {fresh.idmap}, not today's; make it again: "
                    f"jailbox rootfs rm {shlex.quote(fresh.name)}, then pull, import or build it"
                )
            shift_owners(fresh.tree, old, new)
            fresh.idmap = current.to_wire()
            tmp = fresh.path / "meta.json.tmp"
            tmp.write_text(fresh.model_dump_json(indent=2))
            os.replace(tmp, fresh.path / "meta.json")
            return fresh


Ranges = tuple[tuple[int, int], tuple[int, int]]  # (first host uid, count), (first host gid, count)


def _single_range(entry: Entry) -> Ranges | None:
    """The uid and gid ranges of a map of one line each (what root's jails use), else None."""
    try:
        m = IdMap.from_wire(entry.idmap)
    except WireError:
        return None
    found = []
    for text in (m.uid_map, m.gid_map):
        fields = text.split()
        if len(fields) != 3 or fields[0] != "0" or not all(f.isdigit() for f in fields):
            return None
        found.append((int(fields[1]), int(fields[2])))
    return found[0], found[1]


def shift_owners(tree: Path, old: Ranges, new: Ranges) -> None:
    """Move every owner in ``tree`` from the ``old`` ranges to the same place in the ``new`` ones.
    Each entry is reached from its directory's descriptor and changed itself, never through a
    symlink; a hard-linked file is changed once; set-id bits, which chown clears, are put back."""

    def moved(value: int, frm: tuple[int, int], to: tuple[int, int]) -> int:
        offset = value - frm[0]
        return to[0] + offset if 0 <= offset < min(frm[1], to[1]) else value

    seen: set[tuple[int, int]] = set()

    def shift(name: str, dir_fd: int | None) -> None:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
        os.chown(
            name,
            moved(st.st_uid, old[0], new[0]),
            moved(st.st_gid, old[1], new[1]),
            dir_fd=dir_fd,
            follow_symlinks=False,
        )
        if st.st_mode & 0o6000 and not stat.S_ISLNK(st.st_mode):
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode))
            finally:
                os.close(fd)

    shift(str(tree), None)
    for _, dirs, files, fd in os.fwalk(tree, follow_symlinks=False):
        for name in dirs + files:
            shift(name, fd)


def users_of(tree: Path) -> list[int]:
    """Host pids of live sandboxes in the default state directory whose lower layer is ``tree``."""
    from .. import state

    base = state.state_dir() / "sandboxes"
    pids = []
    for path in base.iterdir() if base.is_dir() else []:
        meta = state.read_meta(path)
        if meta.get("lower") == str(tree) and state.owner_alive(meta):
            pids.append(int(meta["host_pid"]))
    return pids


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return True  # gone meanwhile: nothing to remove


@contextlib.contextmanager
def _unless_held(path: Path) -> Iterator[bool]:
    """Whether nobody holds ``path``'s flock (a lock file, made if missing, or a directory), holding it
    meanwhile."""
    flags = os.O_RDONLY | os.O_DIRECTORY if path.is_dir() else os.O_RDWR | os.O_CREAT
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _read(path: Path) -> Entry | None:
    try:
        data = json.loads((path / "meta.json").read_text())
        entry = Entry.model_validate(data)
    except (OSError, ValueError):
        return None
    entry.path = path
    return entry if entry.tree.is_dir() else None


def not_found_message(name: str, existing: list[str]) -> str:
    """What exists and how to get ``name``. ``rootfs build NAME`` is offered only for a shipped
    recipe's name: for any other name it would be an error (and once built the default recipe)."""
    from .reference import Reference

    have = ", ".join(existing) if existing else "none yet"
    recipes = shipped.names()
    arg = shlex.quote(name)
    if name in recipes:
        get = f"Build it with `jailbox rootfs build {arg}` (a shipped recipe)"
    else:
        ways = []
        try:
            Reference.parse(name)
            ways.append(f"`jailbox rootfs pull {arg}` (an image reference)")
        except RootfsError:
            pass
        ways.append(f"`jailbox rootfs import FILE {arg}` (an image archive or rootfs tarball)")
        ways.append(f"`jailbox rootfs build --recipe RECIPE {arg}` (RECIPE: {', '.join(recipes)} or a recipe file)")
        get = "Get it with " + ", ".join(ways[:-1]) + " or " + ways[-1]
    return (
        f"no root filesystem named {name!r} (stored: {have}). {get}; "
        'or give a directory path, or "host" (this machine\'s own system)'
    )
