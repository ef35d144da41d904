"""Durable snapshots: a sandbox's filesystem kept in the user's store, to start sandboxes from
(``Sandbox.snapshot()``, ``Sandbox(snapshot=...)``, ``jailbox snapshot``). Runs in the host process.

Layout, under the store's root (``$JAILBOX_CACHE_DIR``, kept 0700: no other host user reads or uses
a snapshot)::

    snapshots/snap-<12 hex>/tree       one layer (``layers.py``'s format): the sandbox's layers and
                                       its writable layer squashed, owners as its lower stores them
    snapshots/snap-<12 hex>/meta.json  a ``Snapshot``, the id map of its owners, the image's identity
    snapshots/snap-<12 hex>/lock       flock: shared while a jail of a live host runs over it
    snapshots/tmp-<12 hex>/            one being made; renamed into place once whole
    snapshots/names.lock               flock: one writer of the names at a time

A snapshot is made whole or not at all: the launcher's child copies into ``tmp-ID`` (its meta names
the host, so the launcher removes it if the host dies mid-copy, as it does a half-made layer), the
final meta (naming no host) is written, and the directory renamed into place. A jail over it mounts
its tree read-only as its one layer, idmapped as its lower is: nothing is copied to start one.

The tree holds what the jail made, as a stored image does: kept in the user's private store, copied
without following links, owners in the jail's range only (``child/layers.py``); set-id bits are
kept (a stored image has them too), devices are not (only the overlay's whiteouts).
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from . import layers, state
from .config import SNAPSHOT_ID, SNAPSHOT_NAME
from .errors import BranchError, SnapshotNotFound
from .floor.idmap import IdMap
from .floor.wire import WireError

NAME, ID = SNAPSHOT_NAME, SNAPSHOT_ID
MAX_META = 1 << 16  # bytes of one meta.json read back (the host wrote it: far below)
MAX_SNAPSHOTS = 100_000  # entries of snapshots/ looked at by one listing


class Snapshot(BaseModel):
    """One durable snapshot in the user's store."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(description="snap-<12 hex>, made when it was taken")
    name: str | None = Field(None, description="the name given, unless a newer snapshot took it")
    created: float = Field(description="when it was taken (unix seconds)")
    size: int = Field(description="bytes of file data in its tree")
    image: str = Field(description="the root filesystem it was made over (a stored name, a path or host)")
    source: str = Field(description="the id of the sandbox it was taken of")


class _Record(Snapshot):
    """meta.json: the snapshot, and what a jail over it must match."""

    idmap: dict | None = None  # the map its owners are stored for (None: host ids as they are)
    image_created: float | None = None  # the stored image's own ``created``: a replaced image is refused


def root() -> Path:
    from .rootfs.store import Store

    store = Store()
    store.ensure()
    path = store.root / "snapshots"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def check_name(name: str, field: str = "name") -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BranchError(
            f"{field}: {name!r} is not a snapshot name: letters, digits and ._:/+@- up to 128, "
            "starting with a letter or digit, e.g. 'repo-ready'"
        )
    return name


def list() -> builtins.list[Snapshot]:  # read as snapshots.list(): the builtin is builtins.list here
    """Every snapshot in the store, newest first."""
    return [Snapshot.model_validate(r.model_dump()) for r in _records(root())]


def get(ref: str) -> Snapshot:
    """The snapshot whose id or name is ``ref``; ``SnapshotNotFound`` names the ones there are."""
    return Snapshot.model_validate(_find(root(), ref).model_dump())


def remove(ref: str) -> Snapshot:
    """Remove a snapshot; ``BranchError`` while a jail of a live host runs over it."""
    base = root()
    record = _find(base, ref)
    path = base / record.id
    with _locked(path / "lock", fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
        if not held:
            raise BranchError(f"snapshot {record.id} is in use by a running sandbox; close it, then remove")
        trash = base / f"tmp-{uuid.uuid4().hex[:12]}"
        os.rename(path, trash)  # gone from the listing at once; a crash below leaves only a tmp- dir
    state.remove_sandbox_dir(trash, _idmap(record))
    return Snapshot.model_validate(record.model_dump())


def take(jail: layers.Jail, source: str, name: str | None) -> Snapshot:
    """Keep ``jail``'s filesystem (paused by the caller) as a new snapshot."""
    if name is not None:
        check_name(name)
    base = root()
    _remove_stale(base)
    ident = f"snap-{uuid.uuid4().hex[:12]}"
    staging = base / f"tmp-{ident[5:]}"
    made = layers.cut(jail, into=staging, whole=True)[0]
    try:
        record = _Record(
            id=ident,
            name=name,
            created=time.time(),
            size=_size(made.tree),
            image=_image(jail.config.rootfs),
            source=source,
            idmap=None if not jail.config.userns else jail.disk_ids.to_wire(),
            image_created=_image_created(jail.config.rootfs),
        )
        with _locked(base / "names.lock", fcntl.LOCK_EX) as _:
            if name is not None:
                for other in _records(base):
                    if other.name == name:  # a name moves to the newest snapshot given it
                        _write(base / other.id, other.model_copy(update={"name": None}))
            _write(staging, record)  # names no host: the launcher leaves it alone from here
            os.rename(staging, base / ident)
    except BaseException:
        made.release()  # removes the staging directory
        raise
    return Snapshot.model_validate(record.model_dump())


def open_layer(ref: str, config_rootfs: str, rootfs_set: bool, disk_ids: IdMap | None) -> tuple[str, layers.Layer]:
    """The snapshot ``ref`` as a layer to start a jail over, held (shared lock) until its last
    holder lets go; and the root filesystem it goes over. Refused if the jail's ids or image differ."""
    base = root()
    record = _find(base, ref)
    if rootfs_set and _image(config_rootfs) != record.image:
        raise BranchError(
            f"snapshot: {ref} was made over rootfs {record.image!r}, not {config_rootfs!r}; "
            f"leave rootfs unset, e.g. Sandbox(snapshot={ref!r})"
        )
    stored_for = _idmap(record)
    if (stored_for is None) != (disk_ids is None) or (
        stored_for is not None and disk_ids is not None and stored_for.to_wire() != disk_ids.to_wire()
    ):
        raise BranchError(
            f"snapshot: {ref} was stored for other ids than this sandbox's "
            f"({'no user namespace' if stored_for is None else 'user namespace ids ' + stored_for.uid_map.strip()}); "
            "start it with the userns and idmap settings it was taken with"
        )
    if record.image_created is not None and _image_created(record.image) != record.image_created:
        raise BranchError(
            f"snapshot: the root filesystem {record.image!r} was replaced since {record.id} was made over it; "
            "the snapshot's changes no longer apply (take a new snapshot over the current image)"
        )
    path = base / record.id
    try:
        fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        raise SnapshotNotFound(f"snapshot {record.id} was removed meanwhile") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise BranchError(f"snapshot {record.id} is being removed") from None
    if not (path / "tree").is_dir():  # removed between the lookup and the lock
        os.close(fd)
        raise SnapshotNotFound(f"snapshot {record.id} was removed meanwhile")
    return record.image, layers.Layer(path, None, kept=fd)


# --- the store's records ------------------------------------------------------------------------


def _records(base: Path) -> builtins.list[_Record]:
    found = []
    with os.scandir(base) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_SNAPSHOTS:
                break
            if ID.fullmatch(entry.name):
                record = _read(base / entry.name)
                if record is not None and record.id == entry.name:
                    found.append(record)
    return sorted(found, key=lambda r: r.created, reverse=True)


def _find(base: Path, ref: str) -> _Record:
    if not isinstance(ref, str) or not (ID.fullmatch(ref) or NAME.fullmatch(ref)):
        raise SnapshotNotFound(
            f"snapshot: {ref!r} is not a snapshot id or name, e.g. 'snap-0123456789ab' or 'repo-ready'"
        )
    if ID.fullmatch(ref):
        record = _read(base / ref)
        if record is not None and record.id == ref:
            return record
    records = _records(base)
    for record in records:
        if record.name == ref:
            return record
    known = (
        ", ".join(r.name or r.id for r in records[:10])
        or "none yet; take one with sb.snapshot() or jailbox snapshot ID"
    )
    raise SnapshotNotFound(f"snapshot: no snapshot has the id or name {ref!r} (there are: {known})")


def _read(path: Path) -> _Record | None:
    try:
        fd = os.open(path / "meta.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            return _Record.model_validate_json(f.read(MAX_META))
    except (OSError, ValueError):
        return None


def _write(path: Path, record: _Record) -> None:
    tmp = path / "meta.json.tmp"
    tmp.write_text(record.model_dump_json())
    os.replace(tmp, path / "meta.json")


def _idmap(record: _Record) -> IdMap | None:
    try:
        return None if record.idmap is None else IdMap.from_wire(record.idmap)
    except WireError:
        return None


def _remove_stale(base: Path) -> None:
    """``tmp-`` directories whose maker is gone (killed mid-copy, or mid-removal)."""
    with os.scandir(base) as entries:
        stale = [Path(e.path) for i, e in enumerate(entries) if i < MAX_SNAPSHOTS and e.name.startswith("tmp-")]
    for path in stale:
        meta = state.read_meta(path)
        if state.owner_alive(meta) or time.time() - _mtime(path) < state.META_GRACE:
            continue
        with contextlib.suppress(Exception):
            state.remove_sandbox_dir(path, _meta_map(meta))


def _meta_map(meta: dict) -> IdMap | None:
    """The id map a ``tmp-`` directory's meta records: a staging one's, or a removed snapshot's."""
    try:
        return IdMap.from_wire(meta["idmap"]) if isinstance(meta.get("idmap"), dict) else None
    except WireError:
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(tree: Path) -> int:
    total = 0
    for top, _dirs, names in os.walk(tree):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _image(rootfs: str) -> str:
    from .rootfs.resolve import is_path

    return str(Path(rootfs).expanduser().absolute()) if is_path(rootfs) else rootfs


def _image_created(rootfs: str) -> float | None:
    from .rootfs.resolve import stored

    entry = stored(rootfs)
    return None if entry is None else entry.created


@contextlib.contextmanager
def _locked(path: Path, how: int) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
