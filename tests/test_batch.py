"""Many tasks at once against a scripted OpenAI-compatible server that answers from each request."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
from conftest import host_tree
from support.batch_tasks import ROOT, asked, bench_command, jails_left, responder, tasks_file
from support.llm_server import ScriptedServer
from support.waits import wait_until

from jailbox.agent.batch import Batch, BatchConfig
from jailbox.agent.llm import LLMConfig
from jailbox.agent.report import summary
from jailbox.agent.tasks import Task, load_tasks, read_results
from jailbox.sandbox.launcher import LAUNCHER


@pytest.mark.slow
def test_fifty_tasks_sixteen_workers_all_scored(tmp_path, _state_dir):
    tasks = load_tasks(tasks_file(tmp_path / "tasks.jsonl", 50))
    with ScriptedServer(responder=responder()) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        results = Batch(tasks, llm, tmp_path / "out", BatchConfig(workers=16)).run()
    assert len(results) == 50 and all(r.score == 1.0 and r.exit_status == "submitted" for r in results)
    assert sorted(r.id for r in read_results(tmp_path / "out" / "results.jsonl")) == sorted(t.id for t in tasks)
    assert (tmp_path / "out" / "tasks" / "t7" / "output" / "answer.txt").read_text() == "21\n"
    assert (tmp_path / "out" / "tasks" / "t7" / "trajectory.json").exists()
    rows = {(r["domain"], r["mode"]): r for r in summary(results)}
    assert rows[("arith", "sandbox")]["tasks"] == 25 and rows[("mult", "sandbox")]["score"] == 1.0
    assert jails_left(_state_dir) == []
    assert {p.pid for p in host_tree()} == {LAUNCHER.pid}


@pytest.mark.slow
def test_killed_midway_then_resumed_without_redoing_work(tmp_path, _state_dir):
    path = tasks_file(tmp_path / "tasks.jsonl", 50)
    out = tmp_path / "out"
    with ScriptedServer(responder=responder(delay=0.2)) as server:
        cmd = bench_command(path, server.url, out, "--workers", "8")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
        wait_until(lambda: len(read_results(out / "results.jsonl")) >= 10, "ten results", 120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        first = {r.id for r in read_results(out / "results.jsonl")}
        assert 10 <= len(first) < 50
        # the dead run's launcher cleans up
        wait_until(lambda: jails_left(_state_dir) == [], "the killed run's jails to go", 30)
        asked_before = len(server.requests)
        r = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        rerun = asked(server.requests[asked_before:])
    assert not rerun & first
    final = read_results(out / "results.jsonl")
    assert sorted(r.id for r in final) == sorted(f"t{i}" for i in range(50)) and all(r.score == 1.0 for r in final)
    assert "| arith | sandbox | 25 | 1.0 |" in (out / "summary.md").read_text()
    assert jails_left(_state_dir) == []


def test_llm_and_sandbox_modes_make_one_comparison_table(tmp_path):
    tasks = [
        Task(id=f"m{i}", query=f"Task m{i}: what is {i}*7?", answer=f"\\boxed{{{i * 7}}}", scorer="math", domain="math")
        for i in range(4)
    ]
    with ScriptedServer(responder=responder()) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        both = []
        for mode in ("llm", "sandbox"):
            both += Batch(tasks, llm, tmp_path / mode, BatchConfig(workers=4, mode=mode)).run()
    rows = summary(both)
    assert [(r["domain"], r["mode"], r["tasks"], r["score"]) for r in rows] == [
        ("math", "llm", 4, 1.0),
        ("math", "sandbox", 4, 1.0),
    ]


def test_kill_ends_running_tasks_and_leaves_no_jail(tmp_path, _state_dir):
    tasks = load_tasks(tasks_file(tmp_path / "tasks.jsonl", 20))
    with ScriptedServer(responder=responder(delay=0.5)) as server:
        batch = Batch(
            tasks, LLMConfig(model="m", base_url=server.url, api_key="k"), tmp_path / "out", BatchConfig(workers=4)
        )
        runner = threading.Thread(target=batch.run)
        runner.start()
        time.sleep(1.0)
        batch.kill()
        runner.join(60)
    assert not runner.is_alive()
    assert len(read_results(tmp_path / "out" / "results.jsonl")) < 20
    assert jails_left(_state_dir) == []


def test_task_files_are_validated(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "problem_statement": "ok"}\n{"id": 1, "query": "dup"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: duplicate task id"):
        load_tasks(bad)
    bad.write_text('{"id": 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_tasks(bad)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"id": 3, "problem_statement": "from the reference format", "extra": 1}\n')
    assert load_tasks(ok)[0].query == "from the reference format"
