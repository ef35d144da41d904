"""How each bound is held on this host: one typed record per bound, rendered to text in one place.

Runs in the host process, as a jail is planned (``plan.py``). Each bound's module says how it holds
its bound as an ``Enforcement``; code reads the record's ``verdict``, never its words, and
``Sandbox.enforcement`` shows ``text()``. A bound the caller asked for that this host cannot hold
(``NOT_ENFORCED``) is warned about once per jail (``LimitNotEnforced``).
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import LimitNotEnforced


class Verdict(enum.Enum):
    """Whether a bound holds; the value is the words ``text()`` puts before the reason."""

    HELD = ""  # held; ``how`` says by what
    NONE_NEEDED = "none needed"  # nothing to hold here (``how`` says why)
    UNBOUNDED = "unbounded"  # the caller opted out (``Limits.X=None``)
    NOT_ENFORCED = "not enforced"  # asked for, and this host cannot hold it: warned
    NOT_HELD = "not held"  # this jail's configuration or this host leaves it to the kernel's own count
    NOT_BOUNDED = "not bounded"  # likewise, for a count the kernel shares with the whole host


@dataclass(frozen=True)
class Enforcement:
    """One bound on one jail: its name in ``Sandbox.enforcement``, its verdict, and how it is held
    (or why it is not)."""

    bound: str
    verdict: Verdict
    how: str

    @property
    def held(self) -> bool:
        return self.verdict in (Verdict.HELD, Verdict.NONE_NEEDED)

    def text(self) -> str:
        return self.how if self.verdict is Verdict.HELD else f"{self.verdict.value}: {self.how}"


def held(bound: str, how: str) -> Enforcement:
    return Enforcement(bound, Verdict.HELD, how)


def unbounded(bound: str, field: str) -> Enforcement:
    """The caller set ``Limits.<field>=None``."""
    return Enforcement(bound, Verdict.UNBOUNDED, f"Limits.{field}=None")


def render(records: Iterable[Enforcement]) -> dict[str, str]:
    """Bound -> its text, as ``Sandbox.enforcement`` shows it."""
    return {record.bound: record.text() for record in records}


def warn_not_enforced(records: Iterable[Enforcement]) -> None:
    """One ``LimitNotEnforced`` naming every bound asked for that this host cannot hold."""
    missing = [record for record in records if record.verdict is Verdict.NOT_ENFORCED]
    if missing:
        details = "; ".join(f"{record.bound}: {record.text()}" for record in missing)
        warnings.warn(f"limits not enforced on this host: {details}", LimitNotEnforced, stacklevel=6)
