"""The library's bounds as flags, typed as ``docker run`` users type them (``-m 64m``, ``--cpus 0.1``,
``--pids-limit 16``, ``--disk 8m``, ``--inodes 200``), on every command that makes a jail: each one reaches
the jail and holds there. Real CLI processes, real jails, a scripted model for ``run`` and ``bench``.

Every probe is one the default bounds let through (256 MiB of memory, 64 processes, 16 MiB in /tmp, 1,000
files; CPU as the host gives it: 0.4 of a second per second on the loaded 2-core VM, against 0.2 that the
quota allows), so a flag that did not reach the jail fails its test. ``jailbox create``'s are in
``test_service.py``, beside its other tests."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.batch_tasks import bench_command
from support.bound_probe import BOUNDS, PROBE, PROBE_LINE, held
from support.cli import JAILBOX
from support.llm_server import ScriptedServer
from test_run_outputs import jailbox_run, obeying, observation, run_dir

from jailbox.agent.tasks import read_results

ROOT = Path(__file__).resolve().parent.parent
HANG = 300  # seconds: a hang guard only, never a measure


def jailbox(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, cwd=ROOT, timeout=HANG, **kw)


# --- exec: each bound on the writable layer itself, and every spelling --------------------------------


@pytest.mark.cgroup
@pytest.mark.parametrize(
    ("flags", "command"),
    [
        (["--disk", "8m"], "head -c 64M /dev/zero > /testbed/fill; sleep 60; echo survived"),
        (["--inodes", "200"], "for i in $(seq 2000); do : > /testbed/f$i; done; sleep 60; echo survived"),
    ],
    ids=["disk", "inodes"],
)
def test_exec_bounds_the_writable_layer(flags: list[str], command: str) -> None:
    """Past its bound, the layer's writer is killed by the host's watcher (on a disk layer, the default)."""
    r = jailbox("exec", *flags, "--", "sh", "-c", command)
    assert (r.returncode, r.stdout) == (128 + 9, ""), r.stderr


@pytest.mark.cgroup
def test_exec_takes_the_long_spellings_too() -> None:
    r = jailbox("exec", "--memory", "64M", "--pids", "16", "--", "python3", "-c", PROBE)
    assert r.returncode == 0, r.stderr
    got = dict(re.findall(r"^(memory|pids) (\S+)$", r.stdout, re.M))
    assert int(got["memory"]) == -9 and 0 < int(got["pids"]) < 16, r.stdout


# --- the other commands: every bound at once ------------------------------------------------------


@pytest.mark.cgroup
def test_exec_takes_every_bound_at_once() -> None:
    r = jailbox("exec", *BOUNDS, "--", "sh", "-c", PROBE_LINE)
    assert r.returncode == 0, r.stderr
    held(r.stdout)


@pytest.mark.slow
@pytest.mark.cgroup
def test_shell_takes_every_bound() -> None:
    pid, master = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execv(sys.executable, [*JAILBOX, "shell", *BOUNDS])
    os.write(master, f"{PROBE_LINE}; exit\n".encode())
    output = b""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the shell exited: the pty is gone
                break
            if not chunk:
                break
            output += chunk
    _, status = os.waitpid(pid, 0)
    os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, output
    text = output.decode(errors="replace").replace("\r", "")
    held(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text))  # a terminal's line ends and escapes (bracketed paste)


@pytest.mark.slow
@pytest.mark.cgroup
def test_run_takes_every_bound(tmp_path: Path) -> None:
    with ScriptedServer(responder=obeying) as server:
        r = jailbox_run(server, tmp_path / "out", PROBE_LINE, "--network", "none", "--rootfs", "host", *BOUNDS)
    held(observation(run_dir(r)))


@pytest.mark.slow
@pytest.mark.cgroup
def test_bench_takes_every_bound(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    task = {"id": "t0", "query": f"RUN: {PROBE_LINE} > /testbed/output/answer.txt", "answer": "-"}
    tasks.write_text(json.dumps(task) + "\n")
    with ScriptedServer(responder=obeying) as server:
        command = bench_command(tasks, server.url, tmp_path / "out", "--rootfs", "host", *BOUNDS)
        r = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=HANG)
    assert r.returncode == 0, r.stderr
    [result] = read_results(tmp_path / "out" / "results.jsonl")
    held(result.answer or "")


# --- --timeout, where a command has a lifetime: exec's command (test_cli.py), an agent's run ----------


@pytest.mark.slow
def test_run_and_bench_take_timeout_as_the_time_limit(tmp_path: Path) -> None:
    """The model's one command takes a second, past the half second given: the run ends before step 2."""
    with ScriptedServer(responder=obeying) as server:
        r = jailbox_run(
            server, tmp_path / "run", "sleep 1", "--network", "none", "--rootfs", "host", "--timeout", "0.5"
        )
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text(json.dumps({"id": "t0", "query": "RUN: sleep 1", "answer": "-"}) + "\n")
        command = bench_command(tasks, server.url, tmp_path / "bench", "--rootfs", "host", "--timeout", "0.5")
        b = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=HANG)
    assert r.returncode == 1, r.stderr
    assert (json.loads(r.stdout)["exit_status"], json.loads(r.stdout)["steps"]) == ("time_limit", 1)
    assert b.returncode == 0, b.stderr
    [result] = read_results(tmp_path / "bench" / "results.jsonl")
    assert (result.exit_status, result.steps) == ("time_limit", 1)
