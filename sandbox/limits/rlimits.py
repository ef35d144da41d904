"""Decide how each resource limit is enforced on this host, before the jail is built.

cgroups where usable (v2 delegated, or v1 as root), else an rlimit where one fits (memory as per-process
address space, pids as per-uid process count, which a user namespace makes per-sandbox), else
nothing, said plainly. Core dumps are always off.
"""

from __future__ import annotations

import os
import resource
import warnings

from ..config import Limits
from ..errors import LimitNotEnforced

Enforcement = dict[str, str]


def plan(limits: Limits, upper: str, cgroup: str | None) -> tuple[dict[str, int], Enforcement]:
    """(rlimits the init sets on itself at boot, limit -> how it is enforced)."""
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
            how["pids"] = "rlimit RLIMIT_NPROC: per uid inside this sandbox's user namespace (no cgroup)"
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


def _hard(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20
