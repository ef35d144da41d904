"""Bursts: a hundred sandboxes asked for at once all start, and nothing is left behind after close(),
a killed host or a killed launcher."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from conftest import jail_processes, pid_namespace_held, run_threads
from support.descriptors import held_fds
from support.waits import wait_until

from jailbox.sandbox import Sandbox, state
from jailbox.sandbox.limits import reap

ROOT = Path(__file__).resolve().parent.parent

HOLDER = r"""
import json, threading
from jailbox.sandbox import Sandbox
from jailbox.sandbox.launcher import LAUNCHER
import psutil
barrier = threading.Barrier(12)
boxes = []
def make():
    barrier.wait()
    sb = Sandbox()
    sb.exec("sleep 1000 &")
    boxes.append(sb)
threads = [threading.Thread(target=make) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
first = psutil.Process(LAUNCHER.pid)
print(json.dumps({
    "inits": [sb.init_pid for sb in boxes],
    "ns": [sb.exec("readlink /proc/self/ns/pid").stdout.strip() for sb in boxes],
    "dirs": [str(sb.dir) for sb in boxes],
    "launchers": [first.pid, *(p.pid for p in first.children() if p.name() == first.name())],
}), flush=True)
threading.Event().wait()
"""


def _snapshot() -> dict:
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    fds = held_fds()  # first: it waits for the remover, whose work shows in every count
    return {
        "processes": sorted(children),
        "fds": fds,
        "mounts": Path("/proc/self/mountinfo").read_text().count("\n"),
    }


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.alone  # counts the host's mounts, which other workers' jails change
@pytest.mark.slow
def test_a_hundred_sandboxes_from_a_hundred_threads_all_start_and_leave_nothing(_state_dir):
    with Sandbox():
        pass  # the launcher now exists: it belongs to the baseline
    before = _snapshot()
    barrier = threading.Barrier(100)
    outputs: dict[int, str] = {}

    def work(n: int) -> None:
        barrier.wait()
        with Sandbox() as sb:
            outputs[n] = sb.exec(f"echo {n}").stdout

    assert run_threads(work, 100) == []
    assert outputs == {n: f"{n}\n" for n in range(100)}
    assert _snapshot() == before
    assert list((_state_dir / "sandboxes").iterdir()) == []


def _hold_a_burst() -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    assert child.stdout is not None
    info = json.loads(child.stdout.readline())
    return child, info


def test_killing_the_host_during_a_burst_ends_the_launcher_and_every_jail(_state_dir):
    child, info = _hold_a_burst()
    assert all(jail_processes(ns) for ns in info["ns"])
    with pid_namespace_held(*info["ns"]):
        child.send_signal(signal.SIGKILL)
        child.wait()
        wait_until(lambda: all(jail_processes(ns) == [] for ns in info["ns"]), "every jail's processes to end", 60)
    wait_until(lambda: all(_gone(pid) for pid in info["launchers"]), "the launchers to end", 60)
    wait_until(lambda: not any(Path(d).exists() for d in info["dirs"]), "the sandbox directories to go", 60)


@pytest.mark.slow
def test_killing_the_launcher_during_a_burst_ends_every_jail(_state_dir):
    child, info = _hold_a_burst()
    try:
        with pid_namespace_held(*info["ns"]):
            os.kill(info["launchers"][0], signal.SIGKILL)
            wait_until(lambda: all(_gone(pid) for pid in info["launchers"]), "the launchers to end", 60)
            wait_until(lambda: all(jail_processes(ns) == [] for ns in info["ns"]), "every jail's processes to end", 60)
        assert all(_gone(pid) for pid in info["inits"])
    finally:
        child.kill()
        child.wait()
    # With its launcher and then its host killed, no process of the burst is left to remove its files and
    # groups: `cleanup` does, and takes exactly those (other tests count what is left in this directory).
    removed, failed = state.cleanup(_state_dir)
    assert failed == [] and sorted(map(str, removed)) == sorted(info["dirs"])
    assert reap.reap_stale()[1] == []
    ids = [Path(d).name for d in info["dirs"]]
    assert [g for i in ids for g in glob.glob(f"/sys/fs/cgroup/**/{i}-*", recursive=True)] == []
