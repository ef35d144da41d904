"""The record of a run: one versioned JSON file, rewritten atomically after every step.

Written by the host process that drives the agent, into a directory the jail never sees.

A crash between steps loses nothing that happened before it. The loader also reads the reference
package's trajectories (``problem_statement``, ``steps`` with ``thought``, ``reasoning_content``,
``action`` as a Python literal, ``observation``), so ``jailbox replay`` works on both.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..sandbox import hostfs

VERSION = 1
ExitStatus = Literal[
    "submitted", "max_steps", "token_limit", "time_limit", "format_errors", "llm_error", "sandbox_error"
]


class ExecFacts(BaseModel):
    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool | None = None
    wall_time: float = 0.0


class Action(BaseModel):
    function: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = None


class Step(BaseModel):
    index: int
    thought: str = ""
    reasoning: str = ""
    actions: list[Action] = Field(default_factory=list)
    observations: list[str] = Field(default_factory=list)
    exec: list[ExecFacts | None] = Field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0
    note: str | None = None  # what the loop told the model instead of running a tool


class Trajectory(BaseModel):
    version: int = VERSION
    problem_statement: str
    config: dict[str, Any] = Field(default_factory=dict)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    exit_status: ExitStatus | None = None
    error: str | None = None
    answer: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0
    started: float = Field(default_factory=time.time)
    finished: float | None = None

    def save(self, path: Path) -> None:
        """Write to a temporary file and rename, through ``hostfs`` (a link left in ``path``'s directory is
        replaced, never written through): a reader never sees a half-written file."""
        with hostfs.Destination(path.parent) as out:
            out.replace(path.name, self.model_dump_json(indent=1).encode())


def load(path: str | Path) -> Trajectory:
    data = json.loads(Path(path).read_text())
    if "version" in data:
        return Trajectory.model_validate(data)
    return _from_reference(data)


def _from_reference(data: dict[str, Any]) -> Trajectory:
    steps = []
    for i, raw in enumerate(data.get("steps", []), 1):
        action = raw.get("action")
        if isinstance(action, str):
            action = ast.literal_eval(action) if action.strip() else None
        actions = [Action(function=action["function"], parameters=action.get("parameters") or {})] if action else []
        steps.append(
            Step(
                index=i,
                thought=raw.get("thought") or "",
                reasoning=raw.get("reasoning_content") or "",
                actions=actions,
                observations=[raw.get("observation") or ""],
            )
        )
    return Trajectory(problem_statement=data.get("problem_statement", ""), steps=steps, config={"source": "reference"})
