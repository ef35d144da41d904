"""Tasks and a scripted model for the batch tests: 'Task <id>: what is A*B?', answered through the tools."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from llm_server import Step, reply

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-c", "import cli; cli.main()", "bench"]
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
        *options,
    ]


def jails_left(state: Path) -> list[str]:
    directory = state / "sandboxes"
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []
