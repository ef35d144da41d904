"""Host side: the cgroup filesystems as they are, and removing a group with what is in it.

Runs in the host process. Where each v1 hierarchy is mounted (``v1_mounts``), whether v2 is
(``v2_mounted``), a group's processes, and removal: a group's processes are killed (v2's
``cgroup.kill``; on v1, each one, thawed first if frozen, since a frozen process dies of SIGKILL only
once thawed) and the group removed, waiting at most a second for the kernel to let it go. Used by
the back ends (``cgroups.py``) and by the removal of what dead host processes left (``reap.py``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ..floor import small

PARENT_NAME = "jailbox"  # the group every sandbox's group is made in, in each hierarchy
FIELDS_MAX = 4096  # bytes read of a counters file (memory.oom_control is under 100) or /proc/PID/cgroup
V1_CONTROLLERS = ("memory", "pids", "cpu")
V1_FREEZER = "freezer"  # made for every v1 sandbox group where mounted: pause() needs no limit
V2_ROOT = Path("/sys/fs/cgroup")


def v1_mounts() -> dict[str, Path]:
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


def v2_mounted() -> bool:
    return (V2_ROOT / "cgroup.controllers").exists()


def remove_v1(paths: list[Path]) -> bool:
    """Kill what is in the groups (v1 has no cgroup.kill) and remove them; whether they are gone."""
    freezer = v1_mounts().get(V1_FREEZER)
    for _ in range(200):
        remaining = False
        for path in paths:
            if not path.exists():
                continue
            for pid in pids(path):
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


def pids(path: Path) -> list[int]:
    """The processes in the group at ``path`` (none if it cannot be read)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_v2(path: Path) -> bool:
    """Kill what is in the group and remove it; whether it is gone."""
    if not path.exists():
        return True
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        for pid in pids(path):
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
