"""Messages that come out of a jail, validated before the host acts on them.

The init builds them as ``child/replies.py``'s dataclasses, but it runs inside the jail and untrusted
code may have taken it over, so every field is typed and bounded here, and so is the size of the
message itself: ``Reply.WIRE_LIMIT`` bytes (a listing ``LISTING_LIMIT``), refused before it is parsed.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from .child.protocol import Step

Text = Annotated[str, Field(max_length=4096)]
JailPath = Annotated[str, Field(max_length=4096)]


REPLY_LIMIT = 1 << 20
LISTING_LIMIT = 32 << 20
"""Bytes of one ``Walk``: with at most ``MAX_ENTRIES`` entries, what a ``get()`` of a huge tree costs the host
is bounded (about 200 MiB of parsed listing at worst) whatever names the jail made."""
MAX_ENTRIES = 500_000


class Reply(BaseModel):
    """What every message from the jail is; ``WIRE_LIMIT``: the most bytes the host reads of one."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    WIRE_LIMIT: ClassVar[int] = REPLY_LIMIT


class Ready(Reply):
    """The init's answer to setup (``child/protocol.py``): ready, or the step that failed."""

    kind: Literal["ready", "failed"]
    step: Step | None = None  # a failure's setup step, one of ``Step``'s values
    error: Text | None = None
    errno: int = Field(0, ge=0, le=4096)
    seccomp_notify: bool = False  # the init holds a listener: refusals are named, epoll instances made by its maker


class Exit(Reply):
    exit: int = Field(ge=-255, le=511)
    signal: int | None = Field(None, ge=1, le=128)
    error: Text | None = None  # the command could not be started
    refused: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=256
    )  # refused syscall key -> count
    utime: float = Field(0.0, ge=0, le=1e9)
    stime: float = Field(0.0, ge=0, le=1e9)
    maxrss_kb: int = Field(0, ge=0, le=1 << 40)


class PtyOpened(Reply):
    pty: Literal[True]


class Failure(Reply):
    ok: Literal[False]
    errno: int = Field(0, ge=0, le=4096)
    error: Text = ""


class Done(Reply):
    ok: Literal[True]


class Opened(Reply):
    ok: Literal[True]
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o7777)


class Stat(Reply):
    ok: Literal[True]
    type: Literal["file", "dir", "link", "other"]
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o7777)


def _jail_name(value: object) -> str:
    """A path as the jail's filesystem spells it: any bytes but NUL, so names that are not UTF-8 arrive as
    ``os.fsdecode``'s surrogate escapes (pydantic's own ``str`` refuses those, and a jail could then block
    every copy of its output with one odd name)."""
    if not isinstance(value, str) or len(value) > 4096 or "\0" in value:
        raise ValueError("expected a path of at most 4096 characters")
    return value


AnyName = Annotated[str, PlainValidator(_jail_name)]

Entry = tuple[
    AnyName,
    Literal["file", "dir", "link", "other"],
    Annotated[int, Field(ge=0, le=0o7777)],
    Annotated[int, Field(ge=0)],
    AnyName | None,
]


class Walk(Reply):
    WIRE_LIMIT: ClassVar[int] = LISTING_LIMIT

    ok: Literal[True]
    entries: list[Entry] = Field(max_length=MAX_ENTRIES + 1)
