"""Decide how each resource limit is enforced on this host, before the jail is built.

cgroups where usable (v2 delegated, or v1 as root), else an rlimit where one fits (memory as per-process
address space, pids as per-uid process count, which a user namespace makes per-sandbox), else
nothing, said plainly. Core dumps are always off. The bounds all sandboxes share (the pids budget,
the per-user kernel counters) are stated here too; ``budget.py`` decides them.
"""

from __future__ import annotations

import os
import resource
import warnings

from ..config import Limits
from ..errors import LimitNotEnforced
from . import budget

Enforcement = dict[str, str]


def plan(
    limits: Limits, upper: str, cgroup: str | None, pids_budget: int, counters: dict[str, int], userns: bool
) -> tuple[dict[str, int], Enforcement]:
    """(rlimits the init sets on itself at boot, limit -> how it is enforced); ``pids_budget`` and
    ``counters`` are the bounds all sandboxes share (``budget.py``)."""
    rlimits = {"RLIMIT_CORE": 0, "RLIMIT_NOFILE": min(limits.open_files, _hard(resource.RLIMIT_NOFILE))}
    how: Enforcement = {"open_files": f"rlimit RLIMIT_NOFILE={rlimits['RLIMIT_NOFILE']}", "core_dumps": "off"}
    if limits.file_size is not None:
        rlimits["RLIMIT_FSIZE"] = limits.file_size
        how["file_size"] = "rlimit RLIMIT_FSIZE"
    if limits.memory is not None:
        if cgroup:
            how["memory"] = f"{cgroup} memory (no swap beyond Limits.swap)"
        else:
            rlimits["RLIMIT_AS"] = limits.memory
            how["memory"] = "rlimit RLIMIT_AS: per process address space, not the sandbox total (no cgroup)"
    if limits.pids is not None:
        if cgroup:
            how["pids"] = f"{cgroup} pids"
        elif os.getuid() == 0:
            how["pids"] = "not enforced: no cgroup, and RLIMIT_NPROC does not bind uid 0 of the host"
        else:
            rlimits["RLIMIT_NPROC"] = limits.pids
            how["pids"] = "rlimit RLIMIT_NPROC: all processes of this sandbox's user namespace, every uid (no cgroup)"
    how["pids_budget"] = _budget_enforcement(pids_budget, cgroup, userns)
    how["kernel_counters"] = budget.describe_counters(counters, userns)
    if limits.cpus is not None:
        how["cpus"] = f"{cgroup} cpu quota" if cgroup else "not enforced: no usable cgroup"
    if limits.disk is not None:
        if upper == "tmpfs":
            how["disk"] = "tmpfs size of the writable layer"
        else:
            how["disk"] = "not enforced: a disk writable layer has no quota; use upper='tmpfs'"
    missing = {k: v for k, v in how.items() if v.startswith("not enforced")}
    if missing:
        details = "; ".join(f"{k}: {v}" for k, v in missing.items())
        warnings.warn(f"limits not enforced on this host: {details}", LimitNotEnforced, stacklevel=5)
    return rlimits, how


def nproc_budget(pids_budget: int, userns: bool) -> int | None:
    """The RLIMIT_NPROC the launcher sets before it creates the jail's user namespace, if it binds:
    the kernel ignores it for uid 0 of the host, whose processes the pids cgroup bounds instead."""
    return pids_budget if userns and os.getuid() != 0 else None


def _budget_enforcement(pids_budget: int, cgroup: str | None, userns: bool) -> str:
    held = []
    if cgroup:
        held.append(f"{cgroup} pids.max={pids_budget} on the jailbox group all sandboxes are created in")
    if nproc_budget(pids_budget, userns) is not None:
        held.append(
            f"RLIMIT_NPROC={pids_budget} of the user namespace's creator: forks fail while this user has that many"
        )
    return "; ".join(held) or "not enforced: no pids cgroup, and RLIMIT_NPROC does not bind uid 0 of the host"


def _hard(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20
