"""Replies from a running jail's init to the host, one frozen dataclass per kind of answer.

Built by the init (``child/init.py``) and sent with ``to_wire()`` on a request's reply socket. The
host never trusts these shapes: it reads every reply through the bounded models of
``sandbox/messages.py``, whose fields match these one for one (``tests/test_spec.py`` holds them
together), since untrusted code may have taken the init over. Stdlib only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

Kind = Literal["file", "dir", "link", "other"]
Entry = tuple[str, Kind, int, int, "str | None"]  # relative path, kind, permission bits, size, link target


@dataclass(frozen=True)
class _Reply:
    MODEL: ClassVar[str]  # the name of the host's model that reads it (``sandbox/messages.py``)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExitReply(_Reply):
    """A command ended (or could not start: ``error``); its exit code as a shell reports it."""

    MODEL: ClassVar[str] = "Exit"
    exit: int
    signal: int | None  # the signal that ended it
    error: str | None = None  # why it could not be started
    refused: dict[str, int] = field(default_factory=dict)  # refused syscall key -> count
    utime: float = 0.0
    stime: float = 0.0
    maxrss_kb: int = 0


@dataclass(frozen=True)
class PtyOpenedReply(_Reply):
    """A tty command started; the pty's master rides along."""

    MODEL: ClassVar[str] = "PtyOpened"
    pty: Literal[True] = True


@dataclass(frozen=True)
class FailureReply(_Reply):
    """A request failed; ``errno`` is 0 when no system call said why."""

    MODEL: ClassVar[str] = "Failure"
    errno: int
    error: str
    ok: Literal[False] = False


@dataclass(frozen=True)
class DoneReply(_Reply):
    MODEL: ClassVar[str] = "Done"
    ok: Literal[True] = True


@dataclass(frozen=True)
class OpenedReply(_Reply):
    """A file opened for the host; its descriptor rides along."""

    MODEL: ClassVar[str] = "Opened"
    size: int
    mode: int  # permission bits
    ok: Literal[True] = True


@dataclass(frozen=True)
class StatReply(_Reply):
    MODEL: ClassVar[str] = "Stat"
    type: Kind
    size: int
    mode: int  # permission bits
    ok: Literal[True] = True


@dataclass(frozen=True)
class WalkReply(_Reply):
    """A tree listed without following links, at most ``requests.MAX_WALK_ENTRIES`` entries."""

    MODEL: ClassVar[str] = "Walk"
    entries: list[Entry]
    ok: Literal[True] = True

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, "entries": self.entries}  # asdict would copy every entry of a huge listing


Reply = ExitReply | PtyOpenedReply | FailureReply | DoneReply | OpenedReply | StatReply | WalkReply
REPLIES: tuple[type[_Reply], ...] = (
    ExitReply,
    PtyOpenedReply,
    FailureReply,
    DoneReply,
    OpenedReply,
    StatReply,
    WalkReply,
)
