"""Host side: the bounds a plain rlimit holds, which the jail's init sets on itself at boot.

Runs in the host process, as a jail is planned (``plan.py``): open files (``RLIMIT_NOFILE``, at most
the hard limit this process has), a file's size where asked (``RLIMIT_FSIZE``), and no core dumps.
The rlimits other bounds use where no cgroup holds them (``RLIMIT_AS`` for memory, ``RLIMIT_NPROC``
for pids) come from those bounds' own modules.
"""

from __future__ import annotations

import resource

from ..config import Limits
from .enforcement import Enforcement, held


def plan(limits: Limits) -> tuple[dict[str, int], list[Enforcement]]:
    """(rlimits the init sets on itself at boot, how each is held)."""
    planned = {"RLIMIT_CORE": 0, "RLIMIT_NOFILE": min(limits.open_files, _hard(resource.RLIMIT_NOFILE))}
    records = [held("open_files", f"rlimit RLIMIT_NOFILE={planned['RLIMIT_NOFILE']}"), held("core_dumps", "off")]
    if limits.file_size is not None:
        planned["RLIMIT_FSIZE"] = limits.file_size
        records.append(held("file_size", "rlimit RLIMIT_FSIZE"))
    return planned, records


def _hard(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20
