"""Host side of resource limits: per-sandbox cgroups where the host allows them.

cgroup v1 (root only): one group per sandbox in the memory, pids and cpu hierarchies, nested under
the caller's own groups. The init is moved in before the jail reports ready, so every command is
inside. Counters read around each command give ``oom_killed`` (the memory group's ``oom_kill``
count, never ``failcnt``) and ``pids_limit_hit`` (the pids group's ``max`` events).

Where no cgroup is usable, ``plan_rlimits`` says what the init enforces with rlimits instead and
``Enforcement`` records, limit by limit, how (or whether) it is enforced.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from sandbox.config import Limits

CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _v1_mounts() -> dict[str, Path]:
    """controller -> mount point of its v1 hierarchy."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(extra) < 3 or extra[0] != "cgroup":
            continue
        for option in extra[2].split(","):
            if option in V1_CONTROLLERS:
                found[option] = Path(fields[4])
    return found


def _own_paths() -> dict[str, str]:
    """controller -> this process's group path in that v1 hierarchy."""
    paths: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                paths[controller] = path
    except (OSError, ValueError):
        pass
    return paths


def v1_usable() -> bool:
    mounts = _v1_mounts()
    return os.geteuid() == 0 and all(c in mounts for c in V1_CONTROLLERS)


class CgroupV1:
    """One sandbox's groups; ``destroy()`` kills what is left in them and removes them."""

    def __init__(self, sandbox_id: str, limits: Limits) -> None:
        mounts, own = _v1_mounts(), _own_paths()
        self.dirs: dict[str, Path] = {}
        for controller in V1_CONTROLLERS:
            parent = mounts[controller] / own.get(controller, "/").lstrip("/") / "jailbox"
            path = parent / sandbox_id
            path.mkdir(parents=True)
            self.dirs[controller] = path
        if limits.memory is not None:
            self._write("memory", "memory.limit_in_bytes", limits.memory)
            swap = limits.memory + (limits.swap or 0)
            if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", swap)
        if limits.pids is not None:
            self._write("pids", "pids.max", limits.pids)
        if limits.cpus is not None:
            self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
            self._write("cpu", "cpu.cfs_quota_us", int(limits.cpus * CPU_PERIOD_US))

    def _write(self, controller: str, name: str, value: int | str) -> None:
        (self.dirs[controller] / name).write_text(str(value))

    def attach(self, pid: int) -> None:
        for controller in V1_CONTROLLERS:
            self._write(controller, "cgroup.procs", pid)

    def counters(self) -> dict[str, int]:
        """Monotonic counters: OOM kills and refused forks so far."""
        return {"oom_kill": self._field("memory", "memory.oom_control", "oom_kill"),
                "pids_max": self._field("pids", "pids.events", "max")}  # fmt: skip

    def _field(self, controller: str, name: str, key: str) -> int:
        try:
            for line in (self.dirs[controller] / name).read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == key:
                    return int(parts[1])
        except (OSError, ValueError):
            pass
        return 0

    def peak_memory(self) -> int:
        try:
            return int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def destroy(self) -> None:
        for _ in range(200):
            remaining = False
            for path in self.dirs.values():
                if not path.exists():
                    continue
                for pid in _pids(path):
                    remaining = True
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    path.rmdir()
                except OSError:
                    remaining = True
            if not remaining:
                return
            time.sleep(0.005)


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
