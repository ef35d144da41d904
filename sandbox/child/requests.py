"""Requests from the host to a running jail's init, one frozen dataclass per operation it serves.

Built on the host (``sandbox.py``, ``execution.py``, ``files.py``) and sent with ``to_wire()`` over
the jail's control socket; decoded once by the init (``child/init.py``) with ``decode_request``.
Decoding is strict (an unknown op, an unknown or missing key or a wrong type is a ``WireError``),
and the init answers such a request with an error instead of acting on a guess. Descriptors ride
along outside these objects: stdio pipes and the reply socket of an exec, pipes to drain, and the
reply socket, always last, of every request but the one-way ``kill`` and ``drain``. The answers
are ``child/replies.py``'s. Stdlib only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, ClassVar

from ..floor import wire

MAX_REQUEST = 16 << 20  # bytes of one request the init reads; the host refuses a larger one before sending
MAX_WALK_ENTRIES = 500_000  # entries of one listing (walk) the init sends back; more is EFBIG


@dataclass(frozen=True)
class _Request:
    OP: ClassVar[str]  # the ``op`` key that names the request on the wire
    ONE_WAY: ClassVar[bool] = False  # no reply socket rides along (nobody waits for an answer)

    def to_wire(self) -> dict[str, Any]:
        # shallow: fields are plain values (the JSON encoder takes tuples and dicts as they are) or one
        # nested dataclass; asdict()'s deep copy of every exec's environment cost more than the send
        wired: dict[str, Any] = {"op": self.OP}
        for field in fields(self):
            value = getattr(self, field.name)
            wired[field.name] = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        return wired


@dataclass(frozen=True)
class RunAs:
    """The ids an exec switches to before it starts the command (``SandboxConfig.user``)."""

    uid: int  # uid inside the jail's user namespace
    gid: int  # primary gid inside the jail's user namespace
    groups: tuple[int, ...]  # supplementary gids (from the tree's /etc/group)

    @classmethod
    def from_wire(cls, obj: object) -> RunAs:
        f = wire.fields_of(cls, obj)
        return cls(uid=wire.typed(f, "uid", int), gid=wire.typed(f, "gid", int), groups=_ints(f, "groups"))


@dataclass(frozen=True)
class ExecRequest(_Request):
    """Start a command; stdin, stdout, stderr and the reply socket ride along, in that order. The
    reply (``messages.Exit``, after ``messages.PtyOpened`` for a tty) comes when it exits."""

    OP: ClassVar[str] = "exec"
    id: int  # the command's id, unique in its sandbox: a later ``kill`` names it, refusals count for it
    argv: tuple[str, ...] | None  # the command to execute (PATH-searched); None when ``shell`` is given
    shell: str | None  # a shell command line, run with the jail's bash or sh -c; None when ``argv`` is given
    cwd: str  # absolute working directory inside the jail
    env: dict[str, str]  # the command's whole environment
    tty: bool  # run on a new pty of the jail's devpts, whose master comes back (ignores the stdio pipes)
    user: RunAs | None  # switch to these ids first; None: stay root of the jail

    @classmethod
    def from_wire(cls, obj: object) -> ExecRequest:
        f = wire.fields_of(cls, obj)
        argv = None if f["argv"] is None else _strings(f, "argv")
        shell = None if f["shell"] is None else wire.typed(f, "shell", str)
        if (argv is None) == (shell is None):
            raise wire.WireError("exec: exactly one of argv and shell")
        if argv is not None and not argv:
            raise wire.WireError("argv: empty")
        return cls(
            id=wire.typed(f, "id", int),
            argv=argv,
            shell=shell,
            cwd=wire.typed(f, "cwd", str),
            env=_env(f, "env"),
            tty=wire.typed(f, "tty", bool),
            user=None if f["user"] is None else RunAs.from_wire(f["user"]),
        )


@dataclass(frozen=True)
class KillRequest(_Request):
    """Kill a command's whole tree, daemonised descendants included (its timeout passed)."""

    OP: ClassVar[str] = "kill"
    ONE_WAY: ClassVar[bool] = True
    id: int  # the ``ExecRequest.id`` of the command

    @classmethod
    def from_wire(cls, obj: object) -> KillRequest:
        f = wire.fields_of(cls, obj)
        return cls(id=wire.typed(f, "id", int))


@dataclass(frozen=True)
class DrainRequest(_Request):
    """Adopt the read ends of output pipes that a finished command's background children still hold
    (they ride along), and read them until EOF so those writers never die of SIGPIPE."""

    OP: ClassVar[str] = "drain"
    ONE_WAY: ClassVar[bool] = True

    @classmethod
    def from_wire(cls, obj: object) -> DrainRequest:
        wire.fields_of(cls, obj)
        return cls()


@dataclass(frozen=True)
class OpenRequest(_Request):
    """Open a regular file as the jail sees it; its descriptor comes back with ``messages.Opened``."""

    OP: ClassVar[str] = "open"
    path: str  # absolute path inside the jail (symlinks resolve inside the jail)
    write: bool  # create or truncate it for writing; else open it for reading
    mode: int | None  # permission bits a written file gets; None: 0644 for a new file, an old one's kept
    parents: bool  # when writing, create missing parent directories first

    @classmethod
    def from_wire(cls, obj: object) -> OpenRequest:
        f = wire.fields_of(cls, obj)
        return cls(
            path=wire.typed(f, "path", str),
            write=wire.typed(f, "write", bool),
            mode=None if f["mode"] is None else wire.typed(f, "mode", int),
            parents=wire.typed(f, "parents", bool),
        )


@dataclass(frozen=True)
class StatRequest(_Request):
    """Type, size and permission bits of a path (following symlinks), as ``messages.Stat``."""

    OP: ClassVar[str] = "stat"
    path: str  # absolute path inside the jail

    @classmethod
    def from_wire(cls, obj: object) -> StatRequest:
        f = wire.fields_of(cls, obj)
        return cls(path=wire.typed(f, "path", str))


@dataclass(frozen=True)
class MkdirRequest(_Request):
    """Create a directory and its missing parents (an existing one is fine), then set its mode."""

    OP: ClassVar[str] = "mkdir"
    path: str  # absolute path inside the jail
    mode: int  # the directory's permission bits

    @classmethod
    def from_wire(cls, obj: object) -> MkdirRequest:
        f = wire.fields_of(cls, obj)
        return cls(path=wire.typed(f, "path", str), mode=wire.typed(f, "mode", int))


@dataclass(frozen=True)
class WalkRequest(_Request):
    """List a tree without following symlinks, as ``messages.Walk``."""

    OP: ClassVar[str] = "walk"
    path: str  # absolute path inside the jail of the tree's top directory

    @classmethod
    def from_wire(cls, obj: object) -> WalkRequest:
        f = wire.fields_of(cls, obj)
        return cls(path=wire.typed(f, "path", str))


@dataclass(frozen=True)
class SymlinkRequest(_Request):
    """Create a symlink, replacing a file or link already there (not a directory)."""

    OP: ClassVar[str] = "symlink"
    path: str  # absolute path inside the jail of the link itself
    target: str  # what the link points to, verbatim

    @classmethod
    def from_wire(cls, obj: object) -> SymlinkRequest:
        f = wire.fields_of(cls, obj)
        return cls(path=wire.typed(f, "path", str), target=wire.typed(f, "target", str))


@dataclass(frozen=True)
class ConnectRequest(_Request):
    """Open a TCP connection to ``port`` on the jail's own loopback, from inside its network namespace;
    the socket comes back with ``messages.Done``, its connection possibly still under way."""

    OP: ClassVar[str] = "connect"
    port: int  # 1 to 65535
    ipv6: bool  # to ::1; else to 127.0.0.1

    @classmethod
    def from_wire(cls, obj: object) -> ConnectRequest:
        f = wire.fields_of(cls, obj)
        port = wire.typed(f, "port", int)
        if not 1 <= port <= 65535:
            raise wire.WireError(f"port: {port} is not 1 to 65535")
        return cls(port=port, ipv6=wire.typed(f, "ipv6", bool))


Request = (
    ExecRequest
    | KillRequest
    | DrainRequest
    | OpenRequest
    | StatRequest
    | MkdirRequest
    | WalkRequest
    | SymlinkRequest
    | ConnectRequest
)
REQUESTS: dict[str, type[Request]] = {
    cls.OP: cls
    for cls in (
        ExecRequest,
        KillRequest,
        DrainRequest,
        OpenRequest,
        StatRequest,
        MkdirRequest,
        WalkRequest,
        SymlinkRequest,
        ConnectRequest,
    )
}


def decode_request(obj: object) -> Request:
    """The request ``obj`` is, picked by its ``op``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("op"), str):
        raise wire.WireError("a request without an op")
    cls = REQUESTS.get(obj["op"])
    if cls is None:
        raise wire.WireError(f"unknown request {obj['op']!r}")
    return cls.from_wire({k: v for k, v in obj.items() if k != "op"})


def wants_reply(obj: object) -> bool:
    """Whether the last descriptor of ``obj`` is its reply socket: decided before decoding, so that a
    malformed request still gets its error answered (every op but the one-way ones carries one)."""
    op = obj.get("op") if isinstance(obj, dict) else None
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    return cls is None or not cls.ONE_WAY


def _ints(fields: dict[str, Any], name: str) -> tuple[int, ...]:
    items = wire.typed(fields, name, list)
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        raise wire.WireError(f"{name}: expected a list of integers")
    return tuple(items)


def _strings(fields: dict[str, Any], name: str) -> tuple[str, ...]:
    items = wire.typed(fields, name, list)
    if not all(isinstance(item, str) for item in items):
        raise wire.WireError(f"{name}: expected a list of strings")
    return tuple(items)


def _env(fields: dict[str, Any], name: str) -> dict[str, str]:
    items = wire.typed(fields, name, dict)
    if not all(isinstance(key, str) and isinstance(value, str) for key, value in items.items()):
        raise wire.WireError(f"{name}: expected a map of str to str")
    return dict(items)
