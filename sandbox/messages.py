"""Messages that come out of a jail, validated before the host acts on them.

The init runs inside the jail and untrusted code may have taken it over, so every field is
typed and bounded here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from .child.protocol import Step

Text = Annotated[str, Field(max_length=4096)]
JailPath = Annotated[str, Field(max_length=4096)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Ready(_Msg):
    """The init's answer to setup (``child/protocol.py``): ready, or the step that failed."""

    kind: Literal["ready", "failed"]
    step: Step | None = None  # a failure's setup step, one of ``Step``'s values
    error: Text | None = None
    errno: int = Field(0, ge=0, le=4096)


class Exit(_Msg):
    exit: int = Field(ge=-255, le=511)
    signal: int | None = Field(None, ge=1, le=128)
    error: Text | None = None  # the command could not be started
    refused: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=256
    )  # refused syscall key -> count
    utime: float = Field(0.0, ge=0, le=1e9)
    stime: float = Field(0.0, ge=0, le=1e9)
    maxrss_kb: int = Field(0, ge=0, le=1 << 40)


class PtyOpened(_Msg):
    pty: Literal[True]


class Failure(_Msg):
    ok: Literal[False]
    errno: int = Field(0, ge=0, le=4096)
    error: Text = ""


class Done(_Msg):
    ok: Literal[True]


class Opened(_Msg):
    ok: Literal[True]
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o7777)


class Stat(_Msg):
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


class Walk(_Msg):
    ok: Literal[True]
    entries: list[Entry] = Field(max_length=500_001)
