"""Host side: the host's open-file table, held for every watched jail (``watch.py``).

Runs in the host process (the watcher's thread). The table (``fs.file-max``, about 10% of memory in
1 KiB files) is one count for every process of the host, root's aside, that no namespace, cgroup or
rlimit divides: a file costs a cgroup some 256 bytes, so one jail under a 2 GiB limit could take them
all, and every other user's ``open()`` would fail with ENFILE. Each sample reads the table's use (one
small read); past 1/``FILES_ALARM`` of it, a jail holding at least 1/``FILES_CULPRIT`` of the table
(its descriptors; if no jail holds that many, its descriptors and the files only a mapping holds)
loses every process but its init, reported as ``oom_killed``. Maps are read for at most
``FILES_TIME`` a sample; a process not read again is charged its last count and a file for each page
its address space grew since.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import proc
from .enforcement import Enforcement, held
from .procs import Procs

HOST_FILES = "/proc/sys/fs/file-nr"  # the host's open files, 0, fs.file-max
FILES_ALARM = 4  # past this share of the host's open-file table, the jails' files are counted
FILES_CULPRIT = 64  # a jail holding less of the table than this share is not what fills it
FILES_TIME = 0.03  # seconds a sample spends reading maps for the host's open-file table, all sandboxes together


@dataclass(eq=False)
class MappedFiles:
    """What the watcher last counted of the files a jail's mappings hold."""

    counts: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid -> files, pages, when


def host_files() -> tuple[int, int]:
    """(files open on the whole host, fs.file-max); (0, 1) where the kernel does not say."""
    try:
        fd = os.open(HOST_FILES, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
        return int(fields[0]), max(1, int(fields[2]))
    except (OSError, ValueError, IndexError):
        return 0, 1


def plan() -> Enforcement:
    """How the host's open-file table is held: for every jail, by the watcher."""
    table = host_files()[1]
    return held(
        "host_files",
        f"host watcher: past 1/{FILES_ALARM} of the host's open-file table (fs.file-max={table}, one count "
        f"for all its processes but root's), a jail holding {table // FILES_CULPRIT} files (descriptors, and "
        "files held only by a mapping) loses every process but its init, reported as oom_killed",
    )


def filling(used: int, table: int) -> bool:
    """Whether the table is past the share where the jails' files are counted."""
    return used * FILES_ALARM > table


def check(jails: Sequence[tuple[Procs, MappedFiles]], tree: dict[int, list[int]], table: int) -> None:
    """The host's open-file table is filling: a jail holding at least 1/FILES_CULPRIT of it loses
    every process but its init (one jail a sample)."""
    # descriptors first, one call a process; mappings, which take reading every one, only if need be,
    # for at most FILES_TIME a sample, and only until the bound is reached (its maps are as long as
    # what a jail holds)
    until = time.monotonic() + FILES_TIME
    for mapped in (False, True):
        for p, files in jails:
            pids = proc.descendants(tree, p.init_pid)
            if mapped:  # the gone forgotten; then the never counted first, the oldest counts next
                files.counts = {pid: files.counts[pid] for pid in pids if pid in files.counts}
                pids.sort(key=lambda pid: files.counts[pid][2] if pid in files.counts else -1.0)
            held = 0
            for pid in pids:
                held += proc.descriptors(pid) + (_mapped(files, pid, until) if mapped else 0)
                if held >= table // FILES_CULPRIT:
                    # all its processes but the init: holders are cheap to fork again from one that holds none
                    p.kill_trees(tree, tree.get(p.init_pid, []))
                    return


def _mapped(files: MappedFiles, pid: int, until: float) -> int:
    """The files only ``pid``'s mappings may hold: counted while the sample has time
    (``proc.mapped_files``), else its last count (0 before the first); either way plus a file for each
    page its address space grew since (a mapping takes one at least). A jail's processes may each have
    65,530 mappings to read: reading them all at every sample kept the watcher from other sandboxes."""
    pages = proc.statm(pid)[0]
    count, seen, when = files.counts.get(pid, (0, pages, -1.0))
    if time.monotonic() < until:
        count, seen, when = proc.mapped_files(pid), pages, time.monotonic()
    files.counts[pid] = (count, seen, when)
    return count + max(0, pages - seen)
