"""Messages between host, launcher, child A and the init while a jail is set up, and its steps.

Every message is a frozen dataclass with a ``kind`` on the wire; decoding is strict (the launcher
and A are the host's own processes). A failure names the setup ``Step`` that failed, its errno and
its message, so the host explains it by step and errno (``checks/diagnose.py``) rather than by
the wording of a message. The init's replies are the exception: the host reads them through the
bounded pydantic models of ``sandbox/messages.py``, since untrusted code may have replaced it.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ..floor import wire
from ..floor.idmap import IdMap
from .spec import JailSpec

TRASH = "trash"  # the state directory's folder of closed sandboxes being removed (the launcher sweeps it too)


def fresh_name(host: int, sandbox_id: str) -> str:
    """The name in ``TRASH`` a sandbox directory is made under by host process ``host``, before it
    holds its meta and moves to ``sandboxes/``: the launcher knows it as its host's by its name alone."""
    return f"new-{host}-{sandbox_id}"


class Step(enum.Enum):
    """A step of jail setup, in the order they run."""

    FORK = "fork"  # the launcher forks A
    USERNS = "userns"  # A unshares its user namespace
    ID_MAP = "id_map"  # the launcher writes A's uid/gid maps
    UNSHARE = "unshare"  # A unshares mount, pid, ipc, uts, cgroup (and net) namespaces, forks the init
    STAGE = "stage"  # the init's private tmpfs over the staging directory, generated files
    LOWER = "lower"  # bind of the lower layer
    OVERLAY = "overlay"  # the overlay root (lower + writable layer)
    CA_CERTS = "ca_certs"  # the extra CA certificates appended to the tree's bundles
    BIND = "bind"  # a system or user bind mount
    PROC = "proc"  # /proc, its read-only and masked paths
    SYS = "sys"  # /sys
    DEV = "dev"  # /dev: device binds, devpts, shm, links
    TMP = "tmp"  # /tmp
    WORKDIR = "workdir"  # the working directory
    PIVOT = "pivot"  # pivot_root into the new root
    HOSTNAME = "hostname"  # sethostname
    LOOPBACK = "loopback"  # bring up lo in the jail's own network namespace
    NETWORK = "network"  # the network mode's child side (routes, proxy listener, namespace descriptors)
    LIFELINE = "lifeline"  # wait to be re-parented to the launcher, arm PDEATHSIG
    PRIVILEGES = "privileges"  # no_new_privs, dumpable, shedding capabilities
    RLIMITS = "rlimits"  # setrlimit
    SECCOMP = "seccomp"  # installing the syscall filter
    RMTREE = "rmtree"  # removing a tree inside the jail's id map
    LAYER = "layer"  # copying a writable layer into a read-only one, or squashing layers (child/layers.py)
    PROTOCOL = "protocol"  # a setup process sent nothing, too late or the wrong thing, or failed outside a step


@dataclass(frozen=True)
class Failed:
    """A setup step failed: from A, the launcher (as its reply) or the init."""

    KIND: ClassVar[str] = "failed"
    step: Step  # which step
    errno: int  # its errno (0 when it was no system call)
    error: str  # what happened, for the person reading the error

    @classmethod
    def of(cls, step: Step, exc: BaseException) -> Failed:
        err = getattr(exc, "errno", 0)
        message = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        return cls(step, err if isinstance(err, int) else 0, message)

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "step": self.step.value, "errno": self.errno, "error": self.error}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> Failed:
        try:
            step = Step(wire.typed(f, "step", str))
        except ValueError:
            raise wire.WireError(f"unknown setup step {f['step']!r}") from None
        return cls(step, wire.typed(f, "errno", int), wire.typed(f, "error", str))


class SetupFailed(Exception):
    """Raised inside a setup process; its boundary sends ``failed`` to the waiting side."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.error)
        self.failed = failed


@contextlib.contextmanager
def step(which: Step) -> Iterator[None]:
    """Any exception in the block becomes the failure of ``which`` (an inner step's stays its own)."""
    try:
        yield
    except SetupFailed:
        raise
    except Exception as exc:
        raise SetupFailed(Failed.of(which, exc)) from exc


def failure(exc: BaseException, fallback: Step) -> Failed:
    """What a setup process reports for ``exc``: its step's failure, else one of ``fallback``."""
    return exc.failed if isinstance(exc, SetupFailed) else Failed.of(fallback, exc)


@dataclass(frozen=True)
class CreateRequest:
    """Host -> launcher: make this jail (its control socket and a pidfd of the init come back)."""

    KIND: ClassVar[str] = "create"
    spec: JailSpec  # the whole jail, built once in jail.py

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "spec": self.spec.to_wire()}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> CreateRequest:
        return cls(JailSpec.from_wire(f["spec"]))


@dataclass(frozen=True)
class RmtreeRequest:
    """Host -> launcher: remove a tree whose files belong to subordinate ids (a disk writable layer)."""

    KIND: ClassVar[str] = "rmtree"
    path: str  # absolute host path of the tree
    idmap: IdMap  # the map of the jail that wrote it

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "path": self.path, "idmap": self.idmap.to_wire()}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> RmtreeRequest:
        return cls(wire.typed(f, "path", str), IdMap.from_wire(f["idmap"]))


@dataclass(frozen=True)
class LayerRequest:
    """Host -> launcher: lay the trees of the directories that ride along (after the reply socket),
    in order, into a new directory ``tree`` of ``dir``, a layer's directory the host made (its
    meta.json names the host, so the launcher removes it if the host dies: ``Zygote._half_made``)."""

    KIND: ClassVar[str] = "layer"
    idmap: IdMap | None  # the map of the user namespace to copy in (rootless); None: as the launcher
    shifts: tuple[tuple[str, str], ...]  # per source: (uid, gid) "from to count" triples (child/layers.py)
    dir: str  # absolute host path of the layer's directory
    beneath: bool = False  # a squash: one more descriptor, the lower the result lies on (child/layers.py)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.KIND,
            "idmap": None if self.idmap is None else self.idmap.to_wire(),
            "shifts": [list(s) for s in self.shifts],
            "dir": self.dir,
            "beneath": self.beneath,
        }

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> LayerRequest:
        shifts = wire.typed(f, "shifts", list)
        if not all(isinstance(s, list) and len(s) == 2 and all(isinstance(t, str) for t in s) for s in shifts):
            raise wire.WireError("shifts: expected a list of [uid, gid] strings")
        path = wire.typed(f, "dir", str)
        if not os.path.isabs(path):
            raise wire.WireError(f"dir: not an absolute path: {path!r}")
        return cls(
            None if f["idmap"] is None else IdMap.from_wire(f["idmap"]),
            tuple((s[0], s[1]) for s in shifts),
            path,
            wire.typed(f, "beneath", bool),
        )


@dataclass(frozen=True)
class UsernsReady:
    """A -> launcher: my user namespace exists, write its maps."""

    KIND: ClassVar[str] = "userns"

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> UsernsReady:
        return cls()


@dataclass(frozen=True)
class Go:
    """Launcher -> A: the maps are written, carry on."""

    KIND: ClassVar[str] = "go"

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> Go:
        return cls()


@dataclass(frozen=True)
class InitPid:
    """A -> launcher: the init is forked (pid as the launcher sees it)."""

    KIND: ClassVar[str] = "init_pid"
    pid: int

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "pid": self.pid}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> InitPid:
        return cls(wire.typed(f, "pid", int))


@dataclass(frozen=True)
class Created:
    """Launcher -> host: the jail runs; its control socket and a pidfd of the init ride along."""

    KIND: ClassVar[str] = "created"
    init_pid: int  # as the host sees it

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "init_pid": self.init_pid}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> Created:
        return cls(wire.typed(f, "init_pid", int))


@dataclass(frozen=True)
class Removed:
    """A -> launcher and launcher -> host: whether an rmtree left nothing behind."""

    KIND: ClassVar[str] = "removed"
    done: bool

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "done": self.done}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> Removed:
        return cls(wire.typed(f, "done", bool))


@dataclass(frozen=True)
class Laid:
    """Launcher's child -> host: a ``LayerRequest``'s layer is whole, with this many entries."""

    KIND: ClassVar[str] = "laid"
    entries: int

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "entries": self.entries}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> Laid:
        return cls(wire.typed(f, "entries", int))


@dataclass(frozen=True)
class LauncherUp:
    """Launcher -> host, once on the control socket: it left the host's children; a pidfd of it rides
    along, which is how the host, no longer its parent, sees it end."""

    KIND: ClassVar[str] = "launcher_up"
    pid: int  # as the host sees it

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "pid": self.pid}

    @classmethod
    def from_wire(cls, f: dict[str, Any]) -> LauncherUp:
        return cls(wire.typed(f, "pid", int))


@dataclass(frozen=True)
class InitReady:
    """Init -> host: the jail is built; the network side's descriptors ride along, then an ``O_PATH``
    one of the writable layer's directory (what a checkpoint copies: ``sandbox/layers.py``).

    The host reads this (and the init's ``Failed``) as ``messages.Ready``: the init is untrusted."""

    KIND: ClassVar[str] = "ready"
    seccomp_notify: bool  # refusals are counted by the init's user-notify listener

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.KIND, "seccomp_notify": self.seccomp_notify}


Message = (
    CreateRequest
    | RmtreeRequest
    | LayerRequest
    | UsernsReady
    | Go
    | InitPid
    | Created
    | Removed
    | Laid
    | LauncherUp
    | Failed
)
MESSAGES: dict[str, Any] = {
    cls.KIND: cls
    for cls in (
        CreateRequest,
        RmtreeRequest,
        LayerRequest,
        UsernsReady,
        Go,
        InitPid,
        Created,
        Removed,
        Laid,
        LauncherUp,
        Failed,
    )
}


def decode(obj: object, *expected: type[Message]) -> Message:
    """The message ``obj`` is, which must be one of ``expected`` (a ``Failed`` is always welcome)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise wire.WireError("a message without a kind")
    cls = MESSAGES.get(obj["kind"])
    if cls is None or (cls not in expected and cls is not Failed):
        raise wire.WireError(f"unexpected message {obj['kind']!r}")
    fields = {k: v for k, v in obj.items() if k != "kind"}
    wire.fields_of(cls, fields)
    msg: Message = cls.from_wire(fields)
    return msg
