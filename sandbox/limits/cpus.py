"""Host side: CPU time per wall second, which only a cgroup's quota holds.

Runs in the host process, as a jail is planned (``plan.py``)."""

from __future__ import annotations

from .enforcement import Enforcement, Verdict, held


def plan(cpus: float | None, cgroup: str | None) -> list[Enforcement]:
    """How ``Limits.cpus`` is held (nothing to say when it is not set)."""
    if cpus is None:
        return []
    if cgroup:
        return [held("cpus", f"{cgroup} cpu quota")]
    return [Enforcement("cpus", Verdict.NOT_ENFORCED, "no usable cgroup")]
