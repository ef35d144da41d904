"""Resource limits and the per-command resource report, on whatever this host allows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import eventually_usable

from jailbox.sandbox import Sandbox
from jailbox.sandbox.config import Limits
from jailbox.sandbox.errors import LimitNotEnforced

MEMORY_BOMB = "python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'"
FORK_BOMB = "for i in $(seq 200); do sleep 2 & done; wait"


def test_ordinary_command_reports_plausible_cpu_and_memory(sb):
    r = sb.exec("python3 -c 'x = bytearray(100 * 1024 * 1024); n = sum(range(3 * 10**6))'")
    assert r.exit_code == 0, r.stderr
    assert 100 * 1024 * 1024 <= r.peak_memory < 1024 * 1024 * 1024
    assert r.cpu_user > 0
    assert r.cpu_user + r.cpu_system <= r.wall_time * 2.05  # two cores at most
    idle = sb.exec("sleep 0.2")
    assert idle.cpu_user + idle.cpu_system < idle.wall_time


@pytest.mark.cgroup
def test_memory_bomb_is_oom_killed_and_reported():
    with Sandbox(limits=Limits(memory="128M")) as sb:
        assert sb.enforcement["memory"].startswith("cgroup v")
        r = sb.exec(MEMORY_BOMB)
        assert (r.signal, r.oom_killed) == (signal.SIGKILL, True)
        ok = sb.exec("echo fine")
        assert (ok.stdout, ok.oom_killed) == ("fine\n", False)


@pytest.mark.cgroup
def test_fork_bomb_hits_the_pids_cap_and_the_sandbox_survives():
    with Sandbox(limits=Limits(pids=32)) as sb:
        assert sb.enforcement["pids"] in ("cgroup v1 pids", "cgroup v2 pids")
        r = sb.exec(FORK_BOMB, timeout=60)
        assert r.pids_limit_hit is True
        assert "Resource temporarily unavailable" in r.stderr
        sb.exec("pkill sleep; true")
        after = eventually_usable(sb)
        assert after.stdout == "usable\n"
        assert sb.exec("true").pids_limit_hit is False


@pytest.mark.cgroup
def test_cpu_quota_caps_cpu_time_per_wall_second():
    with Sandbox(limits=Limits(cpus=0.25)) as sb:
        r = sb.exec("timeout 1 sh -c 'while :; do :; done'; true")
        used = r.cpu_user + r.cpu_system
        assert used <= 0.25 * r.wall_time * 1.5 + 0.05


@pytest.mark.nocgroup
@pytest.mark.rootless
def test_without_cgroups_rlimits_hold_and_the_gaps_are_reported():
    with pytest.warns(LimitNotEnforced, match="cpus: not enforced"):
        sb = Sandbox(limits=Limits(memory="256M", pids=32, cpus=1))
    with sb:
        assert sb.enforcement["memory"].startswith("host watcher") and "RLIMIT_AS" in sb.enforcement["memory"]
        assert sb.enforcement["pids"].startswith("rlimit RLIMIT_NPROC")
        r = sb.exec(MEMORY_BOMB)
        assert r.exit_code == 1 and "MemoryError" in r.stderr and r.oom_killed is False
        r = sb.exec(FORK_BOMB, timeout=60)
        assert "Resource temporarily unavailable" in r.stderr and r.pids_limit_hit is None
        assert eventually_usable(sb).stdout == "usable\n"


def test_file_size_open_files_and_core_dumps():
    with Sandbox(limits=Limits(file_size="1M", open_files=256)) as sb:
        assert sb.exec("ulimit -n; ulimit -c").stdout == "256\n0\n"
        r = sb.exec("head -c 2M /dev/zero > /testbed/big")
        assert r.exit_code != 0
        assert sb.exec("stat -c %s /testbed/big").stdout == f"{1024 * 1024}\n"


def test_disk_cap_on_a_tmpfs_writable_layer():
    with Sandbox(upper="tmpfs", limits=Limits(disk="16M")) as sb:
        assert sb.enforcement["disk"] == "tmpfs size of the writable layer"
        r = sb.exec("head -c 32M /dev/zero > /testbed/fill")
        assert r.exit_code != 0 and "No space left on device" in r.stderr
        held = int(sb.exec("stat -c %s /testbed/fill").stdout)
        assert 15 << 20 <= held <= 16 << 20, held  # the layer's size, not the 32M asked for
        r = sb.exec("rm /testbed/fill && echo still > /testbed/small && cat /testbed/small")
        assert r.stdout == "still\n", r.stderr


def test_disk_cap_on_a_disk_layer_is_held_by_the_host_watcher():
    with Sandbox(limits=Limits(disk="16M")) as sb:
        assert sb.enforcement["disk"].startswith("host watcher")
        assert sb.enforcement["inodes"] == "host watcher (with disk)"
        r = sb.exec("for i in $(seq 64); do head -c 1M /dev/zero; sleep 0.01; done > /testbed/fill", timeout=60)
        assert r.disk_limit_hit is True and r.signal == signal.SIGKILL, (r.exit_code, r.stderr)
        held = int(sb.exec("stat -c %s /testbed/fill").stdout)
        assert 15 << 20 <= held < 32 << 20, held  # killed at the cap (16-18M measured), not at 64M
        r = sb.exec("rm /testbed/fill && echo still > /testbed/small && cat /testbed/small")
        assert r.stdout == "still\n" and r.disk_limit_hit is False, r.stderr


def test_limits_are_validated():
    with pytest.raises(ValueError, match="cannot read size"):
        Limits(memory="lots")
    with pytest.raises(ValueError):
        Limits(cpus=0)
    assert Limits(memory="1.5G").memory == 3 << 29


def test_sandbox_stats_add_up_its_commands(sb):
    results = [sb.exec("python3 -c 'sum(range(10**6))'"), sb.exec("sleep 5", timeout=0.2), sb.exec("unshare -r true")]
    stats = sb.stats()
    assert stats.execs == 3 and stats.timeouts == 1
    assert stats.refused_syscalls == {"unshare": 1}
    assert abs(stats.cpu_user - sum(r.cpu_user for r in results)) < 1e-6
    assert stats.peak_memory == max(r.peak_memory for r in results) > 0
    assert abs(stats.wall_time - sum(r.wall_time for r in results)) < 1e-6
    sb.reset()
    assert sb.stats().execs == 0


# Root on a host without usable cgroups (a container, hierarchies not mounted), seen here by
# unmounting them in a mount namespace of the test's own: memory by the watcher and RLIMIT_AS,
# pids by RLIMIT_NPROC of the jail's user namespace (its processes are subordinate ids, which it
# binds; before, root's jails had no pids bound there), and doctor says so.
UNMOUNTED = ("unshare", "-m", "sh", "-c", 'umount -R /sys/fs/cgroup 2>/dev/null; exec "$@"', "sh")
WITHOUT_CGROUPS = f"""
import json, warnings
from jailbox.sandbox import Limits, Sandbox
from jailbox.sandbox.checks import doctor
from jailbox.sandbox.limits import cgroupfs, cgroups
warnings.simplefilter("ignore")
with Sandbox(limits=Limits(memory="256M", pids=32)) as sb:
    memory, fork = sb.exec({MEMORY_BOMB!r}), sb.exec({FORK_BOMB!r}, timeout=60)
    print(json.dumps({{
        "cgroups": cgroups.v1_usable() or cgroupfs.v2_mounted(), "enforcement": sb.enforcement,
        "memory": [memory.exit_code, memory.stderr], "fork": fork.stderr, "next": sb.exec("echo ok").stdout,
        "doctor": doctor.cgroup(doctor.Host()).detail,
    }}))
"""


@pytest.mark.root
def test_root_without_cgroups_holds_pids_and_memory_and_says_how():
    r = subprocess.run(
        [*UNMOUNTED, sys.executable, "-c", WITHOUT_CGROUPS],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.splitlines()[-1])
    assert found["cgroups"] is False
    assert found["enforcement"]["memory"].startswith("host watcher")
    assert found["enforcement"]["pids"].startswith("rlimit RLIMIT_NPROC")
    assert "RLIMIT_NPROC=" in found["enforcement"]["pids_budget"]
    assert found["memory"][0] == 1 and "MemoryError" in found["memory"][1]
    assert "Resource temporarily unavailable" in found["fork"]
    assert found["next"] == "ok\n"
    assert "pids via RLIMIT_NPROC" in found["doctor"]
