"""``Sandbox.usage()``: what a sandbox uses now, from its cgroup or its processes in ``/proc``.

Real jails, as whoever runs pytest (root: a cgroup counts memory; rootless here: ``/proc``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import pytest

from jailbox import Limits, Sandbox
from jailbox.sandbox.errors import SandboxClosed
from jailbox.sandbox.results import SandboxUsage

HOLD = "python3 -c 'import time; x = bytearray(64 << 20); time.sleep(60)' >/dev/null 2>&1 &"


def _until(sb: Sandbox, done: Callable[[SandboxUsage], bool], attempts: int = 100) -> SandboxUsage:
    """The sandbox's usage once ``done(usage)`` holds (the watcher walks a disk layer a little at a time)."""
    for _ in range(attempts):
        used = sb.usage()
        if done(used):
            return used
        time.sleep(0.05)
    raise AssertionError(f"never reached: {used}")


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_cpu_memory_and_disk_grow_with_what_the_jail_does(upper: Literal["disk", "tmpfs"]) -> None:
    with Sandbox(upper=upper) as sb:
        before = sb.usage()
        assert before.memory_total == 2 << 30 and before.disk_total == 4 << 30, before
        assert before.cpu_count >= 1 and before.disk_used is not None, before
        sb.exec(HOLD)
        held = _until(sb, lambda u: u.memory_used >= 64 << 20)
        assert held.memory_used < 256 << 20, held  # the one process, not the host's
        r = sb.exec("python3 -c 'sum(range(30_000_000))'")
        work = r.cpu_user + r.cpu_system  # what the command's own result counts: no wall-clock guess
        spun = sb.usage()
        assert work > 0.1 and spun.cpu_seconds >= held.cpu_seconds + 0.9 * work, (work, held, spun)
        assert 0 < spun.cpu_used_pct <= 100, spun
        sb.exec("head -c 20000000 /dev/zero > /big")
        _until(sb, lambda u: u.disk_used is not None and u.disk_used >= 20_000_000)


@pytest.mark.filterwarnings("ignore::jailbox.sandbox.errors.LimitNotEnforced")  # rootless: no cgroup for cpus
def test_limits_are_the_totals() -> None:
    with Sandbox(limits=Limits(memory="512M", cpus=1.5, disk="1G")) as sb:
        used = sb.usage()
        assert (used.cpu_count, used.memory_total, used.disk_total) == (2, 512 << 20, 1 << 30), used


def test_what_the_jail_names_its_processes_does_not_bend_the_count() -> None:
    """A process's name is the jail's choice and sits in the stat line the CPU time is read from:
    a name with ``)`` and numbers in it leaves the count where the work puts it."""
    with Sandbox() as sb:
        forged = ") R 1 1 1 0 -1 4194560 9 9 9 9 999999999 999999999 999999999 999999999"
        name = 'python3 -c \'open("/proc/self/comm", "w").write("%s"); import time; time.sleep(60)\' &'
        for part in (forged[:15], ") 1 99999999 9", "9 9 9 9 9 9 9"):
            sb.exec(name % part)
        time.sleep(0.3)
        used = sb.usage()
        assert used.cpu_seconds < 60, used  # the names' numbers are not read as times
        assert used.memory_used < 1 << 30, used


def test_a_closed_sandbox_has_no_usage() -> None:
    sb = Sandbox()
    sb.close()
    with pytest.raises(SandboxClosed):
        sb.usage()
