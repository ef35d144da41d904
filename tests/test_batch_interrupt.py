"""Ctrl-C through a real SIGINT to `jailbox bench`, and kill() while LLM requests hang on a stalled server."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

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

from jailbox.agent.batch import Batch, BatchConfig
from jailbox.agent.llm import LLMCancelled, LLMClient, LLMConfig
from jailbox.agent.tasks import Task, read_results


@pytest.mark.slow
def test_first_sigint_lets_running_tasks_finish_and_starts_no_new_one(tmp_path, _state_dir):
    path = tasks_file(tmp_path / "tasks.jsonl", 50)
    out = tmp_path / "out"
    with ScriptedServer(responder=responder(delay=0.3)) as server:
        proc = subprocess.Popen(
            bench_command(path, server.url, out, "--workers", "4"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: len(read_results(out / "results.jsonl")) >= 3, "three results", 120)
        os.kill(proc.pid, signal.SIGINT)
        done_at_signal = len(read_results(out / "results.jsonl"))
        stdout, stderr = proc.communicate(timeout=120)
        started = asked(server.requests)
    assert proc.returncode == 130, stderr
    assert "finishing the running tasks" in stdout and "Traceback" not in stderr
    results = read_results(out / "results.jsonl")
    recorded = {r.id for r in results}
    assert recorded == started, "every task that started finished and was recorded"
    assert len(recorded) <= done_at_signal + 4 < 50, "no task started after the signal"
    assert all(r.exit_status == "submitted" and r.score == 1.0 for r in results)
    assert all((out / "tasks" / r.id / "output" / "answer.txt").exists() for r in results)
    assert jails_left(_state_dir) == []


@pytest.mark.slow
def test_second_sigint_kills_tasks_stuck_in_llm_requests(tmp_path, _state_dir):
    two_sigints_end_stuck_tasks(tmp_path, _state_dir)


@pytest.mark.parametrize("mode", ["sandbox", "llm"])
def test_kill_cuts_off_llm_requests_in_flight(tmp_path, _state_dir, mode):
    tasks = [Task(id=f"t{i}", query=f"Task t{i}: what is {i}*3?", answer=str(i * 3)) for i in range(6)]
    with ScriptedServer(responder=responder(delay=FOREVER)) as server:
        batch = Batch(
            tasks,
            LLMConfig(model="m", base_url=server.url, api_key="k"),
            tmp_path / "out",
            BatchConfig(workers=3, mode=mode),
        )
        runner = threading.Thread(target=batch.run)
        runner.start()
        wait_until(lambda: len(server.requests) == 3, "three requests in flight", 120)
        batch.kill()
        runner.join(120)
        assert not runner.is_alive(), "kill() left a request hanging"
    assert read_results(tmp_path / "out" / "results.jsonl") == []
    assert jails_left(_state_dir) == []


def test_cancel_ends_a_stalled_request_and_refuses_more():
    with ScriptedServer(responder=responder(delay=FOREVER)) as server:
        client = LLMClient(LLMConfig(model="m", base_url=server.url, api_key="k"))
        outcome: list[BaseException] = []

        def ask() -> None:
            try:
                client.complete([{"role": "user", "content": "Task t1: what is 1*3?"}])
            except BaseException as exc:
                outcome.append(exc)

        asking = threading.Thread(target=ask)
        asking.start()
        wait_until(lambda: len(server.requests) == 1, "the request", 120)
        client.cancel()
        asking.join(120)
        assert not asking.is_alive() and isinstance(outcome[0], LLMCancelled)
        with pytest.raises(LLMCancelled):
            client.complete([{"role": "user", "content": "Task t2: what is 2*3?"}])
        assert len(server.requests) == 1
        client.close()
