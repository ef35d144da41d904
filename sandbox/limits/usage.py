"""Host side: what a sandbox uses at one instant (``Sandbox.usage()``): CPU time, memory, its writable layer.

Runs in the host process, on the caller's thread. Read from the sandbox's cgroup where it has one
that counts it (``Cgroup.usage``), else summed over the jail's processes in ``/proc`` (the init and
its descendants: each line read to a byte cap, a process gone meanwhile counted as nothing); the
writable layer from its tmpfs (``fstatvfs`` of the layer's descriptor the init handed over at setup,
before anything untrusted ran) or the watcher's last walk of a layer on disk. Every value is the
jail's doing and is used only as a number: nothing read here is followed, parsed past a field, or
waited on. One call reads ``/proc/*/stat`` of the host's processes once (to find the jail's tree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..floor import procstat
from . import proc

TICK = os.sysconf("SC_CLK_TCK")
MEMINFO_MAX = 8192  # bytes of /proc/meminfo read: its MemTotal is on the first line


@dataclass(frozen=True)
class Reading:
    """A jail's use at one instant: CPU seconds of all its processes so far, resident memory and
    page cache in bytes, and the bytes its writable layer holds (None: not measured here)."""

    cpu_seconds: float
    memory: int
    cache: int
    disk: int | None


def from_proc(init_pid: int) -> tuple[float, int]:
    """CPU seconds (its live processes' own and their reaped children's, which the init's reaping
    of orphans gathers) and resident anonymous bytes of the jail whose init is ``init_pid``."""
    cpu_ticks, memory = 0, 0
    for pid in [init_pid, *proc.descendants(proc.children(), init_pid)]:
        fields = procstat.fields(pid) or []
        try:  # utime, stime, cutime, cstime: fields 14 to 17, from field 3 on here
            cpu_ticks += sum(int(f) for f in fields[11:15])
        except ValueError:
            pass
        memory += proc.statm(pid)[1]
    return cpu_ticks / TICK, memory


def layer_bytes(upper_fd: int) -> int:
    """Bytes a tmpfs writable layer holds (its blocks in use)."""
    st = os.fstatvfs(upper_fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def started(init_pid: int) -> float | None:
    """Seconds since boot (``CLOCK_BOOTTIME``) when the init started; None if it is gone."""
    ticks = procstat.start_ticks(init_pid)
    return None if ticks is None else ticks / TICK


def host_memory() -> int:
    """The host's memory in bytes (``MemTotal``)."""
    with open("/proc/meminfo", "rb") as f:
        for line in f.read(MEMINFO_MAX).splitlines():
            if line.startswith(b"MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0
