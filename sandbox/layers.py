"""Host side of filesystem branching: read-only layers cut from a live jail's writable layer, and
the checkpoints that name them (``Sandbox.checkpoint``, ``rollback``, ``fork``).

A layer is a directory ``sandboxes/layer-ID/tree`` of the state directory, in the overlay's own
format (whiteouts, opaque marks), its owners the ids the jail's lower is stored with, so a later
jail mounts it as a plain lower directory (``JailSpec.layers``), idmapped as its lower is. It is
made whole or not at all: a copy that fails is removed, and a host killed mid-copy leaves a
directory whose meta names it dead, which its launcher and ``jailbox cleanup`` remove. Every jail
and checkpoint over a layer holds it; the last release removes it.

The copy itself runs in a child of the launcher (``child/layers.py``), never in the jail: the jail's
init is not asked for anything, and the writable layer is reached through the descriptor its init
handed over during setup, before anything untrusted ran.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Protocol

from . import state
from .child.layers import MAX_LAYERS
from .child.protocol import Failed, Laid, LayerRequest, decode
from .child.spec import JailSpec
from .config import SandboxConfig
from .errors import BranchError
from .floor import wire
from .floor.idmap import IdMap
from .launcher import LAUNCHER, REMOVE_TIMEOUT

ALL_IDS = "0 0 4294967295"  # a jail without a user namespace: host ids as they are


class Jail(Protocol):
    """What a cut needs of a running jail (``jail.Jail``)."""

    config: SandboxConfig
    layers: tuple[Layer, ...]
    upper: int  # O_PATH descriptor of its writable layer's directory
    spec: JailSpec  # its lower: what a squashed layer lies on

    @property
    def id_map(self) -> IdMap: ...

    @property
    def disk_ids(self) -> IdMap: ...


class Layer:
    """One read-only layer on disk; removed once its last holder (a jail or a checkpoint) lets go,
    unless it is ``kept`` (a durable snapshot's: then the descriptor of its shared lock is closed)."""

    def __init__(self, path: Path, removal: IdMap | None, kept: int | None = None) -> None:
        self.dir = path
        self._removal = removal  # the map its files' owners belong to (to remove it rootless)
        self._kept = kept
        self._lock = threading.Lock()
        self._holders = 1  # whoever made it

    @property
    def tree(self) -> Path:
        return self.dir / "tree"

    def hold(self) -> None:
        with self._lock:
            if self._holders <= 0:
                raise BranchError("this checkpoint's layers are already removed")
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            last = self._holders == 0
        if last and self._kept is not None:
            os.close(self._kept)  # snapshots.remove may take it now
        elif last:
            state.remove_sandbox_dir(self.dir, self._removal)


class Checkpoint:
    """The filesystem of a sandbox at one instant (``Sandbox.checkpoint()``): what ``rollback`` goes
    back to. Processes are not part of it. Valid until its sandbox rolls back to an older one or
    closes."""

    def __init__(self, layers: tuple[Layer, ...], owner: object) -> None:
        for layer in layers:
            layer.hold()
        self.layers = layers  # topmost first
        self.owner = owner  # the Sandbox it was taken of
        self.valid = True

    def drop(self) -> None:
        if self.valid:
            self.valid = False
            for layer in self.layers:
                layer.release()

    def __repr__(self) -> str:
        return f"<Checkpoint {len(self.layers)} layers {'valid' if self.valid else 'dropped'}>"


def cut(jail: Jail, into: Path | None = None, whole: bool = False) -> tuple[Layer, ...]:
    """The layers of ``jail``'s filesystem now, topmost first: its writable layer copied into a new
    one over the layers it runs on; past ``MAX_LAYERS``, or if ``whole``, those are squashed with it
    into one. The new layer (in a new directory ``into``, default one of the state directory's) is
    held once for the caller, who releases it when done handing it out."""
    squash = whole or len(jail.layers) + 1 > MAX_LAYERS
    below = jail.layers if squash else ()
    kept = () if squash else jail.layers
    base = state.state_dir(jail.config.state_dir)
    path = into if into is not None else base / "sandboxes" / f"layer-{uuid.uuid4().hex[:12]}"
    removal = None if not jail.config.userns else jail.disk_ids
    path.mkdir(mode=0o700)
    try:
        state.write_meta(
            path,
            host_pid=os.getpid(),
            host_start=state.own_start(),
            **({"idmap": removal.to_wire()} if removal else {}),
        )
        sources: list[int] = []
        try:
            for layer in reversed(below):  # bottom first, then the writable layer
                sources.append(os.open(layer.tree, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
            sources.append(jail.upper)
            if squash:
                sources.append(os.open(jail.spec.lower, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
            in_ns, layer_shift, upper_shift = _shifts(jail)
            request = LayerRequest(in_ns, (*(layer_shift for _ in below), upper_shift), str(path), squash)
            reply, _ = LAUNCHER.request(request.to_wire(), 0, REMOVE_TIMEOUT, tuple(sources))
        finally:
            for fd in sources:
                if fd != jail.upper:
                    os.close(fd)
        try:
            laid = decode(reply, Laid)
        except wire.WireError as exc:
            raise BranchError(f"bad reply from the jailbox launcher while copying a layer: {exc}") from None
        if isinstance(laid, Failed):
            raise BranchError(f"copying the sandbox's writable layer failed: {laid.error}")
    except BaseException:
        state.remove_sandbox_dir(path, removal)
        raise
    return (Layer(path, removal), *kept)


def _shifts(jail: Jail) -> tuple[IdMap | None, tuple[str, str], tuple[str, str]]:
    """Where the copy runs (a user namespace with the jail's map, or None: as the launcher), and
    how ids read from a layer and from the writable layer become the new layer's ("from to count")."""
    if not jail.config.userns:
        return None, (ALL_IDS, ALL_IDS), (ALL_IDS, ALL_IDS)
    disk = jail.disk_ids
    if os.getuid() != 0:  # rootless: inside the jail's map, every id is seen as the jail sees it
        inside = (_identity(disk.uid_map, 0), _identity(disk.gid_map, 0))
        return disk, inside, inside
    # host root: ids on the host, from the jail's own (when it has some) to the shared range
    on_disk = (_identity(disk.uid_map, 1), _identity(disk.gid_map, 1))
    mine = jail.id_map
    return None, on_disk, (_compose(mine.uid_map, disk.uid_map), _compose(mine.gid_map, disk.gid_map))


def _rows(text: str) -> list[tuple[int, int, int]]:
    numbers = [int(n) for n in text.split()]
    return [(numbers[i], numbers[i + 1], numbers[i + 2]) for i in range(0, len(numbers), 3)]


def _identity(text: str, column: int) -> str:
    """Each range of a map's ``column`` (0: inside, 1: outside) onto itself."""
    return "".join(f"{row[column]} {row[column]} {row[2]}\n" for row in _rows(text))


def _compose(src: str, dst: str) -> str:
    """Host ids of map ``src`` onto the host ids of map ``dst`` that stand for the same jail ids."""
    out = []
    for inside, outside, count in _rows(src):
        for inside2, outside2, count2 in _rows(dst):
            low, high = max(inside, inside2), min(inside + count, inside2 + count2)
            if low < high:
                out.append(f"{outside + low - inside} {outside2 + low - inside2} {high - low}\n")
    return "".join(out)
