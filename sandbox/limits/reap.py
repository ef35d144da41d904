"""Host side: what a killed host process left, its sandboxes' groups, found and removed.

Runs in the host process. A group's name records its owner (``ID-PID-START-PIDNS``: the host
process, its start time in clock ticks, its pid namespace), so the remains of a host process killed
before its ``destroy()`` ran are found: by the next process that makes a group in the same place
(``reap_once``), and by ``jailbox cleanup`` (``reap_stale``), which looks in every hierarchy, at most
``SEARCH_DEPTH`` deep and ``SEARCH_GROUPS`` groups. Only this user's groups are removed, and only
groups of this pid namespace (another's pids mean other processes).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ..floor import procstat
from .cgroupfs import PARENT_NAME, V2_ROOT, pids, remove_v1, remove_v2, v1_mounts, v2_mounted

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
                if st.st_uid == os.geteuid() and now - st.st_mtime > OLD_IDLE and not pids(Path(entry.path)):
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


def reap_once(parent: Path) -> None:
    """The first time this process uses ``parent``: remove the groups dead owners left in it."""
    if parent not in _REAPED:
        _REAPED.add(parent)
        for group in _stale_groups(parent):
            _remove(group)
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
    roots = [V2_ROOT] if v2_mounted() else list(dict.fromkeys(v1_mounts().values()))
    removed: list[Path] = []
    failed: list[tuple[Path, str]] = []
    for root in roots:
        for parent in _parents(root):
            for group in _stale_groups(parent):
                if _remove(group):
                    removed.append(group)
                else:
                    failed.append((group, "processes in it survived SIGKILL, or it could not be removed"))
            removed.extend(group for group in _abandoned_groups(parent) if _remove_empty(group))
    return removed, failed


def _remove(group: Path) -> bool:
    """Kill what is in ``group`` and remove it; whether it is gone."""
    return remove_v2(group) if v2_mounted() else remove_v1([group])
