"""The service's wire protocol, in both the ``jailbox`` client and the per-user service process.

One connection carries one request. Messages are JSON objects framed by ``floor/wire.py`` on a
``SOCK_SEQPACKET`` UNIX socket; the receiver bounds their size (``MAX_MESSAGE``), takes no file
descriptors and decodes each into one of the typed models below, which forbid unknown fields and
coercions. Bytes (stdin, output) travel base64-encoded in chunks of at most ``CHUNK``.
"""

from __future__ import annotations

import base64
import binascii
import socket
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ...sandbox.errors import ServerError
from ...sandbox.floor import wire
from .quick import CHUNK, LOG_NAME, MAX_ARG, MAX_ARGS, MAX_MESSAGE, SOCKET_NAME

__all__ = ["CHUNK", "LOG_NAME", "MAX_MESSAGE", "SOCKET_NAME"]  # the stdlib-only client's, re-exported here

Ref = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Path4k = Annotated[str, Field(min_length=1, max_length=4096)]
SnapshotName = Annotated[str, Field(min_length=1, max_length=128)]  # its rules: Sandbox.snapshot's
MAX_FORK = 64  # children of one jailbox fork
Arg = Annotated[str, Field(max_length=MAX_ARG)]
Data = Annotated[str, Field(max_length=4 * (CHUNK // 3 + 1))]


class ProtocolViolation(ServerError):
    """A peer sent something that is not one of this protocol's messages."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- client -> service ------------------------------------------------------------------------


class Create(_Msg):
    op: Literal["create"]
    config: dict[str, Any]  # a SandboxConfig's JSON form; the service validates it as one
    name: Name | None = None


class Exec(_Msg):
    op: Literal["exec"]
    id: Ref
    argv: list[Arg] = Field(min_length=1, max_length=MAX_ARGS)
    cwd: Path4k | None = None
    env: dict[Annotated[str, Field(max_length=256)], Arg] = Field(default_factory=dict, max_length=1024)
    timeout: float | None = Field(None, gt=0, le=1e7)
    stdin: bool = False  # Input messages and one Eof follow; the client hanging up kills the command


class Run(_Msg):
    """``jailbox exec -- CMD`` from ``quick.py``: once, in a fresh sandbox of the default configuration,
    stdin streamed (Input messages and one Eof follow the Ok), replies as for Exec. ``context`` is the
    client's ``quick.context()``: a different one is refused, and the client runs the command itself."""

    op: Literal["run"]
    argv: list[Arg] = Field(min_length=1, max_length=MAX_ARGS)
    context: dict[Annotated[str, Field(max_length=64)], Any] = Field(max_length=64)


class Input(_Msg):
    op: Literal["stdin"]
    data: Data


class Eof(_Msg):
    op: Literal["eof"]


class Copy(_Msg):
    op: Literal["put", "get"]
    id: Ref
    host: Path4k  # absolute: the service does not share the client's working directory
    jail: Path4k


class List(_Msg):
    op: Literal["ps"]


class Stop(_Msg):
    op: Literal["stop"]
    ids: list[Ref] = Field(default_factory=list, max_length=1024)
    all: bool = False


class Pause(_Msg):
    """``jailbox pause ID`` or ``jailbox resume ID``: ``Ok.changed`` says whether it was not so already."""

    op: Literal["pause", "resume"]
    id: Ref


class Fork(_Msg):
    """``jailbox fork ID -n N``: ``Ok.made`` lists the children, each held as if created."""

    op: Literal["fork"]
    id: Ref
    count: int = Field(ge=1, le=MAX_FORK)


class Snap(_Msg):
    """``jailbox snapshot ID --name NAME``: ``Ok.id`` is the new snapshot's id."""

    op: Literal["snapshot"]
    id: Ref
    name: SnapshotName | None = None


Request = Annotated[Create | Exec | Run | Copy | List | Stop | Pause | Fork | Snap, Field(discriminator="op")]
Stream = Annotated[Input | Eof, Field(discriminator="op")]
REQUEST: TypeAdapter[Create | Exec | Run | Copy | List | Stop | Pause | Fork | Snap] = TypeAdapter(Request)
STREAM: TypeAdapter[Input | Eof] = TypeAdapter(Stream)


# --- service -> client ------------------------------------------------------------------------


class Info(_Msg):
    id: Ref
    name: Name | None
    rootfs: Annotated[str, Field(max_length=4096)]
    created: float
    state: Literal["running", "paused", "dead"]
    limits: dict[Annotated[str, Field(max_length=32)], int | float | None] = Field(max_length=32)  # Limits' fields


class Ok(_Msg):
    ok: Literal[True]
    id: Ref | None = None
    sandboxes: list[Info] = Field(default_factory=list, max_length=4096)
    stopped: list[Ref] = Field(default_factory=list, max_length=4096)
    changed: bool | None = None  # to a Pause: whether the sandbox was not paused (or resumed) already
    made: list[Ref] = Field(default_factory=list, max_length=MAX_FORK)  # to a Fork: the children's ids


class Error(_Msg):
    ok: Literal[False]
    error: Annotated[str, Field(max_length=4096)]


class Output(_Msg):
    stream: Literal["stdout", "stderr"]
    data: Data


class Exited(_Msg):
    exit: int = Field(ge=-255, le=511)
    signal: int | None = Field(None, ge=1, le=128)
    timed_out: bool = False


REPLY: TypeAdapter[Ok | Error] = TypeAdapter(Annotated[Ok | Error, Field(discriminator="ok")])
EXEC_REPLY: TypeAdapter[Output | Exited | Error] = TypeAdapter(Output | Exited | Error)


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def decode_data(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolViolation("data is not base64") from None


def send(sock: socket.socket, msg: BaseModel) -> None:
    wire.send(sock, msg.model_dump(mode="json"))


def receive(sock: socket.socket, adapter: TypeAdapter[Any]) -> Any:
    """The next message as one of ``adapter``'s models; None when the peer closed the connection."""
    try:
        got = wire.recv(sock, max_fds=0, max_bytes=MAX_MESSAGE)
    except wire.WireError as exc:
        raise ProtocolViolation(str(exc)) from None
    if got is None:
        return None
    try:
        return adapter.validate_python(got[0])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        raise ProtocolViolation(f"{where}: {first['msg']}") from None
