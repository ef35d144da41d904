"""Tasks and a scripted model for the batch tests: 'Task <id>: what is A*B?', answered through the tools."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from jailbox.agent.tasks import read_results
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, Step, reply
from support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
BENCH = [*JAILBOX, "bench"]
FOREVER = 3600.0  # a stalled server: only cancelling the request ends the wait


def responder(delay: float = 0.0, delay_for: Callable[[str], float] | None = None):
    """A model that reads 'Task <id>: what is A*B?' and answers it: first by writing answer.txt with
    execute_bash, then by submitting; asked without tools (llm mode) it answers in \\boxed{}. Each reply
    waits ``delay`` seconds, or ``delay_for(task id)``."""

    def respond(request: dict) -> Step:
        messages = request["messages"]
        text = json.dumps(messages)
        a, b = map(int, re.search(r"what is (\d+)\*(\d+)", text).groups())
        wait = delay if delay_for is None else delay_for(task_id(text))
        if "tools" not in request:
            step = reply(f"The product is \\boxed{{{a * b}}}.", usage={"total_tokens": 7})
            return Step(status=step.status, json=step.json, delay=wait)
        if messages[-1]["role"] == "tool":
            call = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
        else:
            command = json.dumps({"command": f"echo {a * b} > /testbed/output/answer.txt"})
            call = {"id": "c", "type": "function", "function": {"name": "execute_bash", "arguments": command}}
        step = reply(
            None,
            tool_calls=[call],
            finish_reason="tool_calls",
            usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        )
        return Step(status=step.status, json=step.json, delay=wait)

    return respond


def task_id(text: str) -> str:
    return re.search(r"Task (t\d+):", text).group(1)


def asked(requests: list) -> set[str]:
    """The ids of the tasks a list of recorded requests came from."""
    return {task_id(json.dumps(r.json)) for r in requests}


def tasks_file(path: Path, n: int) -> Path:
    lines = [
        json.dumps(
            {
                "id": f"t{i}",
                "query": f"Task t{i}: what is {i}*3?",
                "answer": str(i * 3),
                "scorer": "exact",
                "domain": "arith" if i % 2 else "mult",
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_command(tasks: Path, url: str, out: Path, *options: str) -> list[str]:
    return [
        *BENCH,
        str(tasks),
        "--llm_name",
        "m",
        "--llm_base_url",
        url,
        "--api_key",
        "k",
        "--output_dir",
        str(out),
        "--network",  # bench's default is full (slirp4netns per task): these tests are about the batch, not egress
        "none",
        *options,
    ]


def jails_left(state: Path) -> list[str]:
    directory = state / "sandboxes"
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def two_sigints_end_stuck_tasks(tmp_path: Path, state: Path, *options: str, env: dict[str, str] | None = None) -> None:
    """t0-t3 finish; every later task hangs in its first LLM request (the server never answers). Two
    SIGINTs end the run (cutting off the requests), leave no jail, and keep results.jsonl whole."""
    path = tasks_file(tmp_path / "tasks.jsonl", 20)
    out = tmp_path / "out"
    slow = responder(delay_for=lambda tid: 0.0 if int(tid[1:]) < 4 else FOREVER)
    with ScriptedServer(responder=slow) as server:
        proc = subprocess.Popen(
            bench_command(path, server.url, out, "--workers", "4", *options),
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: len(read_results(out / "results.jsonl")) == 4, "the four quick tasks", 120)
        wait_until(lambda: len(asked(server.requests) - {"t0", "t1", "t2", "t3"}) == 4, "four stuck requests", 120)
        assert len(jails_left(state)) == 4
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "the first SIGINT waits for the running tasks"
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "killing the running tasks" in stdout and "Traceback" not in stderr
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and sorted(r.id for r in read_results(out / "results.jsonl")) == ["t0", "t1", "t2", "t3"]
    assert jails_left(state) == []
