"""`jailbox bench --executor ray` on a local Ray cluster that the command starts (own temp dir, no
dashboard, a small object store): the same 50 tasks as the threads run, with the same results."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest
from support.batch_tasks import (
    FOREVER,
    ROOT,
    asked,
    bench_command,
    jails_left,
    responder,
    tasks_file,
    two_sigints_end_stuck_tasks,
)
from support.llm_server import ScriptedServer
from support.waits import wait_until

from jailbox.agent.batch import Batch, BatchConfig, find_executor
from jailbox.agent.llm import LLMConfig
from jailbox.agent.tasks import load_tasks, read_results

# one worker runs the Ray tests one after another (pytest-xdist), each cluster beside other workers'
# tests but not beside another cluster
pytestmark = [pytest.mark.slow, pytest.mark.needs("ray"), pytest.mark.xdist_group("ray")]


@pytest.fixture
def ray_tmpdir():
    """Ray's sockets live under its temp dir and must fit a socket path: a short one in /tmp, per test."""
    path = tempfile.mkdtemp(prefix="jbray-", dir="/tmp")
    yield path
    deadline = time.monotonic() + 60
    while ray_processes(path) and time.monotonic() < deadline:  # ray.shutdown() lets them exit on their own
        time.sleep(0.1)
    left = ray_processes(path)
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


def ray_processes(tmpdir: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if tmpdir in cmdline:
            found.append(f"{proc.pid} {cmdline[:100]}")
    return found


def outcome(results) -> dict:
    return {r.id: (r.exit_status, r.answer, r.score, r.steps, r.tokens) for r in results}


def test_ray_runs_the_same_fifty_tasks_as_threads(tmp_path, _state_dir, ray_tmpdir):
    path = tasks_file(tmp_path / "tasks.jsonl", 50)
    out = tmp_path / "ray-out"
    with ScriptedServer(responder=responder()) as server:
        threads = Batch(
            load_tasks(path),
            LLMConfig(model="m", base_url=server.url, api_key="k"),
            tmp_path / "threads-out",
            BatchConfig(workers=16),
        ).run()
        started = time.monotonic()
        r = subprocess.run(
            bench_command(path, server.url, out, "--workers", "16", "--executor", "ray"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_TMPDIR": ray_tmpdir},
            timeout=600,
        )
        print(f"jailbox bench --executor ray, 50 tasks, 16 workers: {time.monotonic() - started:.1f} s")
    assert r.returncode == 0, r.stderr[-3000:]
    ray_results = read_results(out / "results.jsonl")
    assert len(ray_results) == 50 and all(x.score == 1.0 and x.exit_status == "submitted" for x in ray_results)
    assert outcome(ray_results) == outcome(threads)
    assert (out / "tasks" / "t7" / "output" / "answer.txt").read_text() == "21\n"
    assert (out / "tasks" / "t7" / "trajectory.json").read_text().count('"execute_bash"') >= 1
    assert "| arith | sandbox | 25 | 1.0 |" in (out / "summary.md").read_text()
    assert jails_left(_state_dir) == []


def test_ray_driver_killed_midway_then_resumed(tmp_path, _state_dir, ray_tmpdir):
    """SIGKILL of the driver takes its local cluster and the jails with it; --resume redoes nothing."""
    path = tasks_file(tmp_path / "tasks.jsonl", 50)
    out = tmp_path / "out"
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir}
    with ScriptedServer(responder=responder(delay=0.2)) as server:
        cmd = bench_command(path, server.url, out, "--workers", "8", "--executor", "ray")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_until(lambda: len(read_results(out / "results.jsonl")) >= 10, "ten results", 300)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        first = {r.id for r in read_results(out / "results.jsonl")}
        assert 10 <= len(first) < 50
        wait_until(
            lambda: jails_left(_state_dir) == [] and ray_processes(ray_tmpdir) == [],
            "the killed run's jails and Ray processes to go",
            60,
            every=0.1,
        )
        asked_before = len(server.requests)
        r = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert not asked(server.requests[asked_before:]) & first
    final = read_results(out / "results.jsonl")
    assert sorted(x.id for x in final) == sorted(f"t{i}" for i in range(50)) and all(x.score == 1.0 for x in final)
    assert jails_left(_state_dir) == []


def test_ray_second_sigint_kills_tasks_stuck_in_llm_requests(tmp_path, _state_dir, ray_tmpdir):
    two_sigints_end_stuck_tasks(tmp_path, _state_dir, "--executor", "ray", env={**os.environ, "RAY_TMPDIR": ray_tmpdir})


def test_ray_refuses_a_rootfs_missing_on_a_node(tmp_path, _state_dir, ray_tmpdir):
    path = tasks_file(tmp_path / "tasks.jsonl", 3)
    missing = tmp_path / "no-such-rootfs"
    with ScriptedServer(responder=responder()) as server:
        r = subprocess.run(
            bench_command(path, server.url, tmp_path / "out", "--executor", "ray", "--rootfs", str(missing)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_TMPDIR": ray_tmpdir},
            timeout=600,
        )
        assert server.requests == []
    assert r.returncode == 2
    assert f"rootfs '{missing}' cannot be used on every Ray node" in r.stderr
    assert f"the root filesystem {missing} does not exist there" in r.stderr
    assert read_results(tmp_path / "out" / "results.jsonl") == []
    assert jails_left(_state_dir) == []


def test_ray_kill_ends_tasks_stuck_in_llm_requests(tmp_path, _state_dir, ray_tmpdir, monkeypatch):
    """In-process, as a trainer would: kill() reaches the workers through the hub, each ends its jail and
    cuts off its request; nothing is recorded and no jail is left."""
    monkeypatch.setenv("RAY_TMPDIR", ray_tmpdir)
    tasks = load_tasks(tasks_file(tmp_path / "tasks.jsonl", 6))
    with ScriptedServer(responder=responder(delay=FOREVER)) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        batch = Batch(tasks, llm, tmp_path / "out", BatchConfig(workers=3), executor=find_executor("ray"))
        runner = threading.Thread(target=batch.run)
        runner.start()
        wait_until(lambda: len(server.requests) >= 3, "three requests", 300)
        assert len(server.requests) == 3 and len(jails_left(_state_dir)) == 3
        batch.kill()
        runner.join(300)
        assert not runner.is_alive()
    assert read_results(tmp_path / "out" / "results.jsonl") == []
    assert jails_left(_state_dir) == []


def test_ray_joins_a_running_cluster_by_address(tmp_path, _state_dir, ray_tmpdir):
    """A cluster started with `ray start --head` (token auth on, as Ray 2.59+ does) joined with --ray-address."""
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_TMPDIR"] = ray_tmpdir
    head = [
        *ray_cli,
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=4",
        "--include-dashboard=false",
        "--object-store-memory=100000000",
        f"--temp-dir={ray_tmpdir}",
        "--disable-usage-stats",
    ]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        path = tasks_file(tmp_path / "tasks.jsonl", 8)
        out = tmp_path / "out"
        with ScriptedServer(responder=responder()) as server:
            cmd = bench_command(path, server.url, out, "--workers", "4", "--executor", "ray")
            r = subprocess.run(
                [*cmd, "--ray-address", f"127.0.0.1:{port}"], cwd=ROOT, capture_output=True, text=True, env=env
            )
        assert r.returncode == 0, r.stderr[-3000:]
        results = read_results(out / "results.jsonl")
        assert sorted(x.id for x in results) == sorted(f"t{i}" for i in range(8))
        assert all(x.score == 1.0 for x in results)
        assert jails_left(_state_dir) == []
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)
