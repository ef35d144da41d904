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
(``pids.max``, ``budget.py``). A group's name records its owner (``ID-PID-START-PIDNS``: the
host process, its start time in clock ticks, its pid namespace), so the remains of a host process
killed before its ``destroy()`` ran are found and removed: by the next process that makes a group
in the same place, and by ``jailbox cleanup`` (``reap_stale``), which looks in every hierarchy.
Counters read around each command give ``oom_killed`` (``oom_kill`` in memory.events or
memory.oom_control, never ``failcnt``) and ``pids_limit_hit`` (``max`` in pids.events).

``freeze()`` and ``thaw()`` stop and continue every process of the group (``freezer.state`` on v1,
``cgroup.freeze`` on v2), waiting at most ``FREEZE_WAIT`` for the kernel to report it frozen. A v1
frozen process does not die of SIGKILL until thawed, so teardown thaws after it kills.

Both back ends implement ``Cgroup`` (an interface, as libcgroups' ``CgroupManager``), which is all
the jail holds. Where no cgroup is usable, ``plan.py`` says what the init enforces with
rlimits instead and records, limit by limit, how (or whether) each is enforced.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..config import Limits
from ..floor import procstat, small

CPU_PERIOD_US = 100_000
# what counters() reports on v1: (name, controller, file, key in the file)
TCP_LIMIT = "memory.kmem.tcp.limit_in_bytes"
V1_COUNTERS = (("oom_kill", "memory", "memory.oom_control", b"oom_kill"), ("pids_max", "pids", "pids.events", b"max"))
FIELDS_MAX = 4096  # bytes read of a counters file (memory.oom_control is under 100)
V1_CONTROLLERS = ("memory", "pids", "cpu")
V1_FREEZER = "freezer"  # made for every v1 sandbox group where mounted: pause() needs no limit
# seconds freeze() waits for the kernel to report every process frozen: one in an uninterruptible wait
# (disk writeback on a loaded host) freezes only once out of it; 2 s was once not enough, with load 16
FREEZE_WAIT = 10.0
FREEZE_POLL = 0.0005  # seconds between two looks at the group's state while it freezes
V2_ROOT = Path("/sys/fs/cgroup")
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
            if option in V1_CONTROLLERS or option == V1_FREEZER:
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


class CgroupV1(Cgroup):
    """One sandbox's groups; ``destroy()`` kills what is left in them and removes them."""

    kind = "cgroup v1"

    def __init__(self, sandbox_id: str, limits: Limits, pids_budget: int, inet: tuple[int, int]) -> None:
        """``inet``: (bytes of TCP and UDP buffers this sandbox may hold, all sandboxes of the
        ``jailbox`` group together), shares of the host's one count (``sockets.inet_bound``)."""
        mounts, own = _v1_mounts(), _own_paths()
        self.dirs: dict[str, Path] = {}
        # Only the hierarchies a limit needs: attaching a process to a v1 group costs about 0.2 ms each.
        wanted = {"memory": limits.memory, "pids": limits.pids, "cpu": limits.cpus}
        made = [c for c in V1_CONTROLLERS if wanted[c] is not None] + [V1_FREEZER] * (V1_FREEZER in mounts)
        for controller in made:
            parent = mounts[controller] / own.get(controller, "/").lstrip("/") / "jailbox"
            parent.mkdir(parents=True, exist_ok=True)
            _reap_once(parent)
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
        self._write(V1_FREEZER, "freezer.state", "FROZEN")
        if _wait_for(lambda: small.read(state, 16).strip() == b"FROZEN"):
            return True
        self.thaw()
        return False

    def thaw(self) -> None:
        self._write(V1_FREEZER, "freezer.state", "THAWED")

    def destroy(self) -> None:
        _remove_v1(list(self.dirs.values()))


def _remove_v1(paths: list[Path]) -> bool:
    """Kill what is in the groups (v1 has no cgroup.kill) and remove them; whether they are gone."""
    freezer = _v1_mounts().get(V1_FREEZER)
    for _ in range(200):
        remaining = False
        for path in paths:
            if not path.exists():
                continue
            for pid in _pids(path):
                remaining = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                if freezer is not None:
                    _thaw_v1(pid, freezer)
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining = True
        if not remaining:
            return True
        time.sleep(0.005)
    return False


def _thaw_v1(pid: int, freezer: Path) -> None:
    """Thaw the group of the freezer hierarchy (mounted at ``freezer``) that ``pid`` is in, whichever
    hierarchy it is being removed from: a frozen process dies of SIGKILL only once thawed, and every
    process of that group is the same sandbox's, killed too."""
    try:
        lines = small.read(f"/proc/{pid}/cgroup", FIELDS_MAX).decode().splitlines()
    except UnicodeDecodeError:
        return
    for line in lines:
        controllers, _, group = line.partition(":")[2].partition(":")
        if V1_FREEZER in controllers.split(",") and group.startswith("/") and group != "/":
            try:
                (freezer / group.lstrip("/") / "freezer.state").write_text("THAWED")
            except OSError:
                pass


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def v2_mounted() -> bool:
    return (V2_ROOT / "cgroup.controllers").exists()


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
            base = group / "jailbox"
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
        _reap_once(parent)
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
        _remove_v2(self.path)


def _remove_v2(path: Path) -> bool:
    """Kill what is in the group and remove it; whether it is gone."""
    if not path.exists():
        return True
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        for pid in _pids(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for _ in range(200):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.005)
    return False


# --- what a killed host process left --------------------------------------------------------------

PARENT_NAME = "jailbox"
SEARCH_DEPTH = 8  # how deep below a hierarchy's root ``reap_stale`` looks for ``jailbox`` groups
SEARCH_GROUPS = 20_000  # and how many groups it visits at most (a systemd host has a few hundred)
OLD_NAME = re.compile(r"[0-9a-f]{12}")  # a bare sandbox id: how groups were named before they named an owner
OLD_IDLE = 60.0  # seconds an empty group of the old naming stays untouched (its maker may be attaching)


def _owner() -> str:
    """This process as group names record it: pid, start time (clock ticks since boot), pid namespace.
    Not cached: a forked child is another owner."""
    return f"{os.getpid()}-{procstat.start_ticks(os.getpid())}-{os.stat('/proc/self/ns/pid').st_ino}"


def group_name(sandbox_id: str) -> str:
    return f"{sandbox_id}-{_owner()}"


def _stale(name: str) -> bool:
    """A group of ours whose owner is gone. Groups of another pid namespace (whose pids mean other
    processes) and names we did not make are left alone."""
    parts = name.split("-")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return False
    pid, start, pidns = (int(p) for p in parts[1:])
    if pidns != os.stat("/proc/self/ns/pid").st_ino:
        return False
    return procstat.start_ticks(pid) != start


def _stale_groups(parent: Path) -> list[Path]:
    """Groups in ``parent`` that this user made (another's are not ours to remove) for dead owners."""
    found = []
    try:
        for entry in os.scandir(parent):
            if entry.is_dir(follow_symlinks=False) and _stale(entry.name):
                if entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                    found.append(Path(entry.path))
    except OSError:
        pass
    return found


def _abandoned_groups(parent: Path) -> list[Path]:
    """Empty groups of the old naming (no owner recorded), this user's, untouched for ``OLD_IDLE``.
    Nothing in them is killed: they are only removed, and ``rmdir`` refuses a group that has a
    process or a child, so one in use by a process of an older jailbox stays."""
    found = []
    now = time.time()
    try:
        for entry in os.scandir(parent):
            if entry.is_dir(follow_symlinks=False) and OLD_NAME.fullmatch(entry.name):
                st = entry.stat(follow_symlinks=False)
                if st.st_uid == os.geteuid() and now - st.st_mtime > OLD_IDLE and not _pids(Path(entry.path)):
                    found.append(Path(entry.path))
    except OSError:
        pass
    return found


def _remove_empty(group: Path) -> bool:
    try:
        group.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


_REAPED: set[Path] = set()


def _reap_once(parent: Path) -> None:
    """The first time this process uses ``parent``: remove the groups dead owners left in it."""
    if parent not in _REAPED:
        _REAPED.add(parent)
        for group in _stale_groups(parent):
            if v2_mounted():
                _remove_v2(group)
            else:
                _remove_v1([group])
        for group in _abandoned_groups(parent):
            _remove_empty(group)


def _parents(root: Path) -> list[Path]:
    """Every ``jailbox`` group below ``root`` (bounded: depth and count), without following links."""
    found: list[Path] = []
    level, visited = [root], 0
    for _ in range(SEARCH_DEPTH):
        below: list[Path] = []
        for group in level:
            try:
                entries = list(os.scandir(group))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                visited += 1
                if visited > SEARCH_GROUPS:
                    return found
                if entry.name == PARENT_NAME:
                    found.append(Path(entry.path))
                else:
                    below.append(Path(entry.path))
        level = below
    return found


def reap_stale() -> tuple[list[Path], list[tuple[Path, str]]]:
    """Kill and remove every sandbox group whose host process is gone, in every hierarchy.
    Returns (removed, failed)."""
    roots = [V2_ROOT] if v2_mounted() else list(dict.fromkeys(_v1_mounts().values()))
    removed: list[Path] = []
    failed: list[tuple[Path, str]] = []
    for root in roots:
        for parent in _parents(root):
            for group in _stale_groups(parent):
                gone = _remove_v2(group) if v2_mounted() else _remove_v1([group])
                if gone:
                    removed.append(group)
                else:
                    failed.append((group, "processes in it survived SIGKILL, or it could not be removed"))
            removed.extend(group for group in _abandoned_groups(parent) if _remove_empty(group))
    return removed, failed


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
