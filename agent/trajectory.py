"""The record of a run: one versioned JSON file, rewritten atomically after every step.

Written by the host process that drives the agent, into a directory the jail never sees.

A crash between steps loses nothing that happened before it. ``reference()`` is the same run in the
reference package's format (written beside this record, for tools built to read the reference's). The
loader also reads the reference package's trajectories (``problem_statement``, ``steps`` with ``thought``,
``reasoning_content``, ``action`` as a Python literal, ``observation``), so ``jailbox replay`` works on both.
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
    calls_from_text: bool = False  # the server left the calls as text, read by the client (False in older records)


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
            out.replace(path.name, _json_bytes(self.model_dump(mode="json"), indent=1))

    def reference(self) -> dict[str, Any]:
        """The run in the reference package's format: ``problem_statement``, ``steps`` of ``thought``,
        ``reasoning_content``, ``action`` (``{"function", "parameters"}``), ``observation`` and ``metadata``
        (``step``, and ``exec_time``: the model's seconds for that step), and ``metadata.total_steps``. The
        reference answers one tool call per reply; a reply whose several calls jailbox ran becomes one step per
        call, the reply's text on the first. A reply without a call is a step with an empty action whose
        observation is what the model was told, as the reference records it."""
        steps: list[dict[str, Any]] = []
        for step in self.steps:
            calls = [(a.function, a.parameters, o) for a, o in zip(step.actions, step.observations, strict=False)]
            for n, (function, parameters, observation) in enumerate(calls or [("", {}, step.note or "")]):
                steps.append(
                    {
                        "thought": step.thought if n == 0 else "",
                        "reasoning_content": step.reasoning if n == 0 else "",
                        "action": {"function": function, "parameters": parameters},
                        "observation": observation,
                        "metadata": {"step": step.index, "exec_time": step.llm_seconds if n == 0 else 0.0},
                    }
                )
        metadata = {"total_steps": len(self.steps)}
        return {"problem_statement": self.problem_statement, "steps": steps, "metadata": metadata}

    def save_reference(self, path: Path) -> None:
        """``reference()`` written as ``save`` writes the record (atomically, through ``hostfs``)."""
        with hostfs.Destination(path.parent) as out:
            out.replace(path.name, _json_bytes(self.reference(), indent=2))


def _json_bytes(value: Any, indent: int) -> bytes:
    """UTF-8 JSON; all-ASCII escapes when a string holds a lone surrogate (a server may send ``"\\ud800"``,
    which no UTF-8 encoder takes), so such a reply is recorded, not fatal, and reads back as it came."""
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value, indent=indent).encode()


def load(path: str | Path) -> Trajectory:
    return from_json(json.loads(Path(path).read_text()))


def from_json(data: Any) -> Trajectory:
    """A record already parsed: jailbox's (it has ``version``) or the reference package's."""
    if isinstance(data, dict) and "version" in data:
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
