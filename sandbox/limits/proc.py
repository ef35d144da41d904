"""Host side: what the watcher reads of a jail's processes in ``/proc``, each read bounded.

Runs in the host process (the watcher's thread and a sandbox's reader thread). A jail's processes
choose what these files hold (their names, their mappings' paths, how many descriptors and mappings
they have), so every read has a byte cap, and a failure (a process gone, a pid recycled) reads as
nothing held rather than raising into the watcher.
"""

from __future__ import annotations

import os

from ..floor import procstat, small

PAGE = os.sysconf("SC_PAGE_SIZE")
ROLLUP_KEYS = (b"Pss_Anon:", b"Pss_Shmem:", b"SwapPss:")
MAPS_MAX = 16 << 20  # bytes of one process's /proc/PID/maps read (vm.max_map_count's 65,530 mappings)
MAP_COUNT = "/proc/sys/vm/max_map_count"


def children() -> dict[int, list[int]]:
    """Parent pid -> child pids, of every process on the host (``/proc/PID/stat``, readable by all)."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = procstat.parent(int(name))
            if parent:
                found.setdefault(parent, []).append(int(name))
    return found


def descendants(tree: dict[int, list[int]], pid: int) -> list[int]:
    """Every process below ``pid`` in ``tree`` (as ``children`` gives it)."""
    found: list[int] = []
    stack = list(tree.get(pid, ()))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(tree.get(child, ()))
    return found


def statm(pid: int) -> tuple[int, int]:
    """(pages of address space, bytes resident but not file-backed) of ``pid``."""
    fields = small.read(f"/proc/{pid}/statm", 256).split()
    try:
        return int(fields[0]), max(0, int(fields[1]) - int(fields[2])) * PAGE
    except (ValueError, IndexError):
        return 0, 0


def proportional(pid: int) -> int:
    """This process's share of anonymous, shared-memory and swapped pages (smaps_rollup), in bytes;
    where that cannot be read (nothing read: the kernel always writes its header), its resident
    anonymous bytes."""
    total = 0
    rollup = small.read(f"/proc/{pid}/smaps_rollup", 4096)
    if not rollup:
        return statm(pid)[1]
    try:
        for line in rollup.splitlines():
            if line.startswith(ROLLUP_KEYS):
                total += int(line.split()[1]) * 1024
    except (ValueError, IndexError):
        return statm(pid)[1]
    return total


def descriptors(pid: int) -> int:
    """How many descriptors ``pid`` has open: the size Linux (6.2 and later) gives ``/proc/PID/fd``,
    one call however many there are (0 on older kernels, where descriptors go uncharged)."""
    try:
        return os.stat(f"/proc/{pid}/fd").st_size
    except OSError:
        return 0


def sockets(pid: int, most: int) -> tuple[int, int]:
    """(sockets, descriptors looked at) of ``pid``'s open descriptors, at most ``most`` looked at."""
    count = looked = 0
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                if looked >= most:
                    break
                looked += 1
                try:
                    count += os.readlink(entry.path).startswith("socket:")
                except OSError:
                    continue
    except OSError:
        pass
    return count, looked


def count_maps(pid: int, most: int) -> int:
    """How many mappings ``pid`` holds, counted up to ``most``: the lines of its maps (at most
    ``MAPS_MAX`` bytes of them: a file's path may be 4 KiB)."""
    count = read = 0
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        while count < most and read < MAPS_MAX and (chunk := os.read(fd, 1 << 16)):
            read += len(chunk)
            count += chunk.count(b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)
    return count


def mapped_files(pid: int) -> int:
    """The files ``pid``'s mappings hold (a file mapped and then closed stays open in the kernel's
    table). At most ``MAPS_MAX`` bytes of its maps are read."""
    mapped = 0
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        left = MAPS_MAX
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            left -= len(chunk)
            # a file's mapping ends in its path, an anonymous one in nothing or [name]; a path of the
            # jail's own holding " /" counts twice, against itself
            mapped += chunk.count(b" /") + chunk.count(b" anon_inode:")
    except OSError:
        pass
    finally:
        os.close(fd)
    return mapped


def map_count_max() -> int:
    """vm.max_map_count: the most mappings one process may hold."""
    try:
        return int(small.read(MAP_COUNT, 64))
    except ValueError:  # unreadable (nothing read), or not a number
        return 65530
