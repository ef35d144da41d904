"""The host's memory before and after a test that tries to take it (runs in the test process).

A test module that fills memory from a jail imports ``host_keeps_its_memory``, an autouse fixture:
after each test the host still has most of what it had (a floor, not a timing), and the next sandbox
still starts. ``lowest_available`` samples the host's available memory while a jail is at it, from a
thread of the test process, for tests that bound the worst moment rather than what is left after.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from jailbox.sandbox import Sandbox

MiB = 1 << 20


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


@pytest.fixture(autouse=True)
def host_keeps_its_memory() -> Iterator[None]:
    before = mem_available()
    yield
    after = mem_available()
    assert after >= min(before // 2, before - 1024 * MiB), (before, after)
    with Sandbox() as sb:
        assert sb.exec("echo ok").stdout == "ok\n"


@contextlib.contextmanager
def lowest_available(every: float = 0.01) -> Iterator[list[int]]:
    """Sample ``MemAvailable`` every ``every`` seconds while the block runs; the list's one item is the
    lowest value seen (read it after the block)."""
    lowest = [mem_available()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            lowest[0] = min(lowest[0], mem_available())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lowest
    finally:
        stop.set()
        sampler.join()
        lowest[0] = min(lowest[0], mem_available())
