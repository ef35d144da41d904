"""A gym-style view of one task in a jail, for RL trainers that drive the model themselves.

``reset(task)`` gives a fresh jail and the first prompt, ``step(tool, arguments)`` runs one of the
paper's tools, and the step that submits carries the reward from the task's scorer. ``tools_schema`` is
what ``jailbox run`` offers for the task's prompt config (``PromptConfig.tool_schemas``: ``submit`` names
that config's answer file), so a trainer sends the model the same schemas. The same
object may be used from several threads; each environment owns at most one jail at a time.

Runs in the trainer's process. A task is held to the batch's rules: its scorer is one of ``scorers``
(by name), its ``@path`` inputs are beneath ``inputs_root``, and at most ``ANSWER_LIMIT`` bytes of the
answer are read back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..sandbox import Sandbox, SandboxConfig, SandboxPool
from ..sandbox.errors import SandboxError
from . import prompts as prompt_configs
from .loop import read_answer
from .outcomes import Failure, InfraError, is_infra
from .run import prepare
from .scoring import Scorer, load_scorers, score
from .tasks import Task, check_task
from .tools import ToolResult, Tools


class StepResult(BaseModel):
    """One step's result. ``failure``: ``"infra"`` when the jail died under the step (the episode is over
    and its reward means nothing: retry or drop it), ``"task"`` when a submitted answer scored nothing."""

    observation: str
    done: bool
    reward: float
    answer: str | None = None
    tool: ToolResult | None = None
    failure: Failure | None = None


class Environment:
    def __init__(
        self,
        sandbox: SandboxConfig | None = None,
        pool: SandboxPool | None = None,
        command_timeout: float = 120.0,
        scorers: Mapping[str, Scorer] | None = None,
        inputs_root: Path | None = None,
    ) -> None:
        self.config = sandbox or SandboxConfig()
        self.pool = pool
        self.command_timeout = command_timeout
        self.scorers = load_scorers() if scorers is None else scorers
        self.inputs_root = inputs_root
        self._lock = threading.Lock()
        self._sb: Sandbox | None = None
        self._tools: Tools | None = None
        self._task: Task | None = None
        self._done = True
        self._output_dir = "/testbed/output"
        self.tools_schema: list[dict[str, Any]] = prompt_configs.PromptConfig().tool_schemas()
        """The tools for the episode begun last (before any, for the default prompt config)."""

    def reset(self, task: Task) -> str:
        """A fresh jail for ``task``; returns the instance prompt the model starts from."""
        with self._lock:
            self._close()
            check_task(task, self.scorers)
            prompts = prompt_configs.load(task.prompt_config)
            try:
                sb = self.pool.acquire() if self.pool is not None else Sandbox(self.config)
            except SandboxError as exc:
                if is_infra(exc):
                    raise InfraError(f"the episode's jail did not start: {type(exc).__name__}: {exc}") from exc
                raise
            try:
                prepare(sb, prompts, task, self.inputs_root)
            except BaseException as exc:
                sb.close()
                if isinstance(exc, SandboxError) and is_infra(exc):
                    raise InfraError(f"the episode's jail failed: {type(exc).__name__}: {exc}") from exc
                raise
            self._sb, self._task, self._done = sb, task, False
            self._tools = Tools(sb, timeout=self.command_timeout)
            self._output_dir = prompts.output_dir
            self.tools_schema = prompts.tool_schemas()
            return prompts.instance(task.query)

    def step(self, tool: str, arguments: str | dict[str, Any] | None = None) -> StepResult:
        with self._lock:
            if self._done or self._tools is None or self._task is None:
                raise RuntimeError("call reset(task) first: the episode is over or has not started")
            assert self._sb is not None
            try:
                result = self._tools.call(tool, arguments)
                if not result.submitted:
                    return StepResult(observation=result.observation, done=False, reward=0.0, tool=result)
                data, _ = read_answer(self._sb, self._output_dir)
            except SandboxError as exc:
                if not is_infra(exc):
                    raise
                self._done = True  # the jail is gone: the episode ends, measured nothing
                why = f"{type(exc).__name__}: {exc}"
                return StepResult(observation=f"infrastructure failure: {why}", done=True, reward=0.0, failure="infra")
            self._done = True
            answer = None if data is None else data.decode(errors="replace").strip()
            expected = self._task.answer
            reward = 0.0 if expected is None else score(answer, expected, self._task.scorer, self.scorers)
            return StepResult(
                observation=result.observation,
                done=True,
                reward=reward,
                answer=answer,
                tool=result,
                failure="task" if reward <= 0 else None,
            )

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._sb is not None:
            self._sb.close()
        self._sb, self._tools, self._task, self._done = None, None, None, True

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
