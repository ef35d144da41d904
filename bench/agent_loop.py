"""Agent loop overhead per step: everything the loop does except waiting for the model and running
the command (building messages, calling the tool, recording and saving the trajectory)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results import CaseResult, Row
from bench.settings import Settings
from bench.timing import Summary
from jailbox.agent.llm import Completion, Usage, UsageTotals
from jailbox.agent.loop import Agent, AgentConfig
from jailbox.sandbox import Sandbox


class InstantModel:
    """Answers at once with one ``execute_bash true`` call per step: the model's time is zero."""

    def __init__(self) -> None:
        self.usage = UsageTotals()
        self.calls = 0

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        self.calls += 1
        call = {
            "id": f"call_{self.calls}",
            "type": "function",
            "function": {"name": "execute_bash", "arguments": json.dumps({"command": "true"})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return Completion(
            message=message, finish_reason="tool_calls", usage=Usage(), max_tokens_used=None, latency=0.0, attempts=1
        )


def agent_loop(settings: Settings) -> CaseResult:
    steps = settings.agent_steps
    with Sandbox() as sb, tempfile.TemporaryDirectory() as tmp:
        agent = Agent(
            InstantModel(),
            sb,
            config=AgentConfig(max_steps=steps),
            trajectory_path=Path(tmp) / "trajectory.json",
        )
        stamps: list[float] = []
        agent.on_step = lambda _: stamps.append(time.perf_counter())
        start = time.perf_counter()
        trajectory = agent.run("benchmark")
    per_step = [b - a for a, b in zip([start, *stamps[:-1]], stamps, strict=True)]
    commands = [sum(e.wall_time for e in step.exec if e) for step in trajectory.steps]
    overhead = Summary.of([(total - command) * 1000 for total, command in zip(per_step, commands, strict=True)])
    command = Summary.of([c * 1000 for c in commands])
    return CaseResult(
        [
            Row(
                "agent loop overhead per step (no model, no command)",
                "ms",
                overhead,
                "the command itself (exec of true)",
                command,
            )
        ]
    )
