"""One bounded read of a small kernel file (``/proc``, ``/proc/sys``, a cgroup's files), for every
process role: the host (the watcher, pause, cgroups), the launcher and a jail's init. Stdlib only.

What these files hold may be a jail's choice (a process's name in its stat line, how many
descriptors it passes), so each read takes at most the bytes its caller names. A file the kernel
makes in one piece (a stat or statm line, smaps_rollup, a sysctl, a cgroup's counters) gives all it
holds to one ``read`` large enough, so one is made. Plain descriptors, not ``open()``: these are
read around every exec and at each walk of a jail's processes, where a file object costs about four
times as much.
"""

from __future__ import annotations

import os


def read(path: str, most: int) -> bytes:
    """At most ``most`` bytes of ``path`` in one read; empty when it cannot be opened or read (a
    process gone, a file this kernel lacks), which every caller takes as nothing there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, most)
    except OSError:
        return b""
    finally:
        os.close(fd)
