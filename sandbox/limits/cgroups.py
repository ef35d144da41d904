"""Host side of resource limits: per-sandbox cgroups where the host allows them.

cgroup v2: one group per sandbox under a delegated subtree: the one named by
``$JAILBOX_CGROUP_PARENT``, else (root) ``/sys/fs/cgroup/jailbox``, else the nearest ancestor of the
caller's own group that the caller owns and that holds no processes (what
``systemd-run --user --scope -p Delegate=yes`` gives). Limits ``memory.max``, ``memory.swap.max``,
``pids.max``, ``cpu.max``; teardown with ``cgroup.kill``.

cgroup v1 (root only): one group per sandbox in the memory, pids and cpu hierarchies, nested under
the caller's own groups, and in the freezer hierarchy where it is mounted (``Sandbox.pause()``).

Either way the init is moved in before the jail reports ready, so every command is inside.
The ``jailbox`` group every sandbox's group is created in holds the pids budget all of them share
(``pids.max``, ``budget.py``). A group's name records its owner, so what a host process killed
before its ``destroy()`` ran left is found and removed (``reap.py``); removal itself, and where the
hierarchies are, is ``cgroupfs.py``.
Counters read around each command give ``oom_killed`` (``oom_kill`` in memory.events or
memory.oom_control, never ``failcnt``) and ``pids_limit_hit`` (``max`` in pids.events).

``freeze()`` and ``thaw()`` stop and continue every process of the group (``freezer.state`` on v1,
``cgroup.freeze`` on v2), waiting at most ``FREEZE_WAIT`` for the kernel to report it frozen. v1's
freezer tries each task once per write of ``FROZEN``: one running in the kernel then, that goes on to
sleep where a signal does not wake it (a ``vfork`` parent whose child froze before its ``exec``), is
never frozen, and the group stays ``FREEZING``; so the write is repeated every ``FREEZE_RETRY``
(a sleeping task is frozen where it sleeps), as runc and youki do. A v1 frozen process does not die of
SIGKILL until thawed, so teardown thaws after it kills.

Both back ends implement ``Cgroup`` (an interface, as libcgroups' ``CgroupManager``), which is all
the jail holds. Where no cgroup is usable, ``plan.py`` says what the init enforces with
rlimits instead and records, limit by limit, how (or whether) each is enforced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..config import Limits
from ..floor import small
from .cgroupfs import (
    FIELDS_MAX,
    PARENT_NAME,
    V1_CONTROLLERS,
    V1_FREEZER,
    V2_ROOT,
    remove_v1,
    remove_v2,
    v1_mounts,
    v2_mounted,
)
from .reap import group_name, reap_once

CPU_PERIOD_US = 100_000
# what counters() reports on v1: (name, controller, file, key in the file)
TCP_LIMIT = "memory.kmem.tcp.limit_in_bytes"
V1_COUNTERS = (("oom_kill", "memory", "memory.oom_control", b"oom_kill"), ("pids_max", "pids", "pids.events", b"max"))
# seconds freeze() waits for the kernel to report every process frozen: one in an uninterruptible wait
# (disk writeback on a loaded host) freezes only once out of it; 2 s was once not enough, with load 16
FREEZE_WAIT = 10.0
FREEZE_POLL = 0.0005  # seconds between two looks at the group's state while it freezes
FREEZE_RETRY = 0.02  # seconds between two writes of v1's FROZEN while the group is still FREEZING
V2_CONTROLLERS = ("memory", "pids", "cpu")


class Cgroup(Protocol):
    """One sandbox's cgroup, whichever version backs it."""

    kind: str  # how ``Sandbox.enforcement`` names it: "cgroup v1" or "cgroup v2"
    can_freeze: bool  # whether ``freeze()`` is there (v1: where the freezer hierarchy is mounted)

    def attach(self, pid: int) -> None:
        """Move ``pid`` (the jail's init, before it reports ready) into the group."""

    def counters(self) -> dict[str, int]:
        """Monotonic counters: ``oom_kill`` and ``pids_max`` events so far."""

    def usage(self) -> dict[str, int]:
        """What the group counts of its processes now, where it counts it: ``cpu_ns`` (CPU time so
        far), ``memory`` (bytes charged, page cache left out) and ``cache`` (page cache bytes)."""

    def freeze(self) -> bool:
        """Stop every process in the group; whether the kernel reported it frozen within
        ``FREEZE_WAIT`` (if not, the group is thawed again)."""

    def thaw(self) -> None:
        """Continue every process in the group."""

    def destroy(self) -> None:
        """Kill what is left in the group and remove it."""


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
    mounts = v1_mounts()
    return os.geteuid() == 0 and all(c in mounts for c in V1_CONTROLLERS)


class CgroupV1(Cgroup):
    """One sandbox's groups; ``destroy()`` kills what is left in them and removes them."""

    kind = "cgroup v1"

    def __init__(self, sandbox_id: str, limits: Limits, pids_budget: int, inet: tuple[int, int]) -> None:
        """``inet``: (bytes of TCP and UDP buffers this sandbox may hold, all sandboxes of the
        ``jailbox`` group together), shares of the host's one count (``sockets.inet_bound``)."""
        mounts, own = v1_mounts(), _own_paths()
        self.dirs: dict[str, Path] = {}
        # Only the hierarchies a limit needs: attaching a process to a v1 group costs about 0.2 ms each.
        wanted = {"memory": limits.memory, "pids": limits.pids, "cpu": limits.cpus}
        made = [c for c in V1_CONTROLLERS if wanted[c] is not None] + [V1_FREEZER] * (V1_FREEZER in mounts)
        for controller in made:
            parent = mounts[controller] / own.get(controller, "/").lstrip("/") / PARENT_NAME
            parent.mkdir(parents=True, exist_ok=True)
            reap_once(parent)
            if controller == "pids":
                (parent / "pids.max").write_text(str(pids_budget))
            if controller == "memory" and (parent / TCP_LIMIT).exists():
                (parent / TCP_LIMIT).write_text(str(inet[1]))
            path = parent / group_name(sandbox_id)
            path.mkdir()
            self.dirs[controller] = path
        self.can_freeze = V1_FREEZER in self.dirs
        self._counted = [  # read around every exec: the paths are made once
            (name, str(self.dirs[controller] / file), key)
            for name, controller, file, key in V1_COUNTERS
            if controller in self.dirs
        ]
        if limits.memory is not None:
            self._write("memory", "memory.limit_in_bytes", limits.memory)
            swap = limits.memory + (limits.swap or 0)
            if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", swap)
            # v1 leaves socket buffers out of memory.limit_in_bytes; this counts them (TCP and UDP) on
            # their own, against the sandbox's share of the host's tcp_mem/udp_mem
            if (self.dirs["memory"] / TCP_LIMIT).exists():
                self._write("memory", TCP_LIMIT, inet[0])
        if limits.pids is not None:
            self._write("pids", "pids.max", limits.pids)
        if limits.cpus is not None:
            self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
            self._write("cpu", "cpu.cfs_quota_us", int(limits.cpus * CPU_PERIOD_US))

    def _write(self, controller: str, name: str, value: int | str) -> None:
        (self.dirs[controller] / name).write_text(str(value))

    def attach(self, pid: int) -> None:
        for controller in self.dirs:
            self._write(controller, "cgroup.procs", pid)

    def counters(self) -> dict[str, int]:
        """Monotonic counters: OOM kills and refused forks so far (for the hierarchies in use)."""
        return {name: _field(path, key) for name, path, key in self._counted}

    def usage(self) -> dict[str, int]:
        found: dict[str, int] = {}
        cpu = self.dirs.get("cpu")
        if cpu is not None and (cpu / "cpuacct.usage").exists():  # cpuacct mounted with cpu
            found["cpu_ns"] = _number(str(cpu / "cpuacct.usage"))
        memory = self.dirs.get("memory")
        if memory is not None:
            cache = _field(str(memory / "memory.stat"), b"total_cache")
            found["memory"] = max(0, _number(str(memory / "memory.usage_in_bytes")) - cache)
            found["cache"] = cache
        return found

    def freeze(self) -> bool:
        state = str(self.dirs[V1_FREEZER] / "freezer.state")
        retry = 0.0

        def frozen() -> bool:
            nonlocal retry
            if time.monotonic() >= retry:  # again: the tasks the last write missed (see the module)
                self._write(V1_FREEZER, "freezer.state", "FROZEN")
                retry = time.monotonic() + FREEZE_RETRY
            return small.read(state, 16).strip() == b"FROZEN"

        if _wait_for(frozen):
            return True
        self.thaw()
        return False

    def thaw(self) -> None:
        self._write(V1_FREEZER, "freezer.state", "THAWED")

    def destroy(self) -> None:
        remove_v1(list(self.dirs.values()))


def _v2_own() -> Path:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return V2_ROOT / line[3:].lstrip("/")
    except OSError:
        pass
    return V2_ROOT


def _writable(group: Path) -> bool:
    return all(os.access(group / name, os.W_OK) for name in ("", "cgroup.procs", "cgroup.subtree_control"))


def _enable(group: Path) -> None:
    """Delegate the controllers to ``group``'s children (fails if it holds processes itself)."""
    available = (group / "cgroup.controllers").read_text().split()
    wanted = [c for c in V2_CONTROLLERS if c in available]
    enabled = (group / "cgroup.subtree_control").read_text().split()
    missing = [c for c in wanted if c not in enabled]
    if missing:
        (group / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


def v2_parent() -> tuple[Path | None, str]:
    """(the group sandboxes are created in, or None; how it was found or why there is none)."""
    if not v2_mounted():
        return None, "no cgroup v2 hierarchy"
    named = os.environ.get("JAILBOX_CGROUP_PARENT")
    if named:
        candidates = [V2_ROOT / named.lstrip("/") if not named.startswith(str(V2_ROOT)) else Path(named)]
    elif os.geteuid() == 0:
        candidates = [V2_ROOT]
    else:
        own = _v2_own()
        candidates = [p for p in own.parents if p != V2_ROOT.parent and str(p).startswith(str(V2_ROOT))]
    for group in candidates:
        if not _writable(group):
            continue
        try:
            _enable(group)
            base = group / PARENT_NAME
            base.mkdir(exist_ok=True)
            _enable(base)
            return base, f"delegated at {group}"
        except OSError:
            continue
    return None, "no delegated cgroup this user may write (run under systemd-run --user --scope -p Delegate=yes)"


class CgroupV2(Cgroup):
    """One sandbox's group in a delegated v2 subtree."""

    kind = "cgroup v2"
    can_freeze = True

    def __init__(self, parent: Path, sandbox_id: str, limits: Limits, pids_budget: int) -> None:
        reap_once(parent)
        (parent / "pids.max").write_text(str(pids_budget))
        self.path = parent / group_name(sandbox_id)
        self.path.mkdir()
        self._memory_events = str(self.path / "memory.events")  # read around every exec: paths made once
        self._pids_events = str(self.path / "pids.events")
        if limits.memory is not None:
            self._write("memory.max", limits.memory)
            self._write("memory.swap.max", limits.swap or 0)
        if limits.pids is not None:
            self._write("pids.max", limits.pids)
        if limits.cpus is not None:
            self._write("cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")

    def _write(self, name: str, value: int | str) -> None:
        (self.path / name).write_text(str(value))

    def attach(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    def counters(self) -> dict[str, int]:
        return {"oom_kill": _field(self._memory_events, b"oom_kill"),
                "pids_max": _field(self._pids_events, b"max")}  # fmt: skip

    def usage(self) -> dict[str, int]:
        found = {"cpu_ns": _field(str(self.path / "cpu.stat"), b"usage_usec") * 1000}
        if (self.path / "memory.current").exists():  # the memory controller is enabled for it
            cache = _field(str(self.path / "memory.stat"), b"file")
            found["memory"] = max(0, _number(str(self.path / "memory.current")) - cache)
            found["cache"] = cache
        return found

    def freeze(self) -> bool:
        events = str(self.path / "cgroup.events")
        self._write("cgroup.freeze", 1)
        if _wait_for(lambda: _field(events, b"frozen") == 1):
            return True
        self.thaw()
        return False

    def thaw(self) -> None:
        self._write("cgroup.freeze", 0)

    def destroy(self) -> None:
        remove_v2(self.path)


def _wait_for(done: Callable[[], bool]) -> bool:
    """Whether ``done()`` came true within ``FREEZE_WAIT``."""
    deadline = time.monotonic() + FREEZE_WAIT
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(FREEZE_POLL)
    return True


def _field(path: str, key: bytes) -> int:
    """``key``'s value in a cgroup's flat-keyed file (0 if absent). Read around every exec, so with
    plain descriptors (``floor/small.py``): a quarter of the time ``Path.read_text()`` took."""
    for line in small.read(path, FIELDS_MAX).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return 0
    return 0


def _number(path: str) -> int:
    """A cgroup file holding one number (0 if it cannot be read)."""
    try:
        return int(small.read(path, FIELDS_MAX).strip() or 0)
    except ValueError:
        return 0
