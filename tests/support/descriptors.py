"""This test process's open descriptors, counted the way a leak shows and background work does not."""

from __future__ import annotations

import gc
import os
import time

from jailbox.sandbox import removal


def held_fds() -> int:
    """This process's descriptors once the remover of closed sandboxes' directories is idle (it holds
    directories open while it works), the least of ten looks 10 ms apart: the watcher's thread reads
    the jails' /proc and cgroup files one at a time and may hold one at any instant (CI saw one more
    each way), while a descriptor a call leaked stays in every look. Garbage is collected first: a
    socket an earlier test dropped in a reference cycle is closed whenever the collector next runs."""
    assert removal.wait(120)
    gc.collect()
    counts = []
    for _ in range(10):
        counts.append(len(os.listdir("/proc/self/fd")))
        time.sleep(0.01)
    return min(counts)
