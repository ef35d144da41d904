"""One task of a batch, in the process that runs it (a driver thread, or a Ray worker).

Each task gets its own fresh sandbox, closed whatever happens, and its own LLM client. A ``Guard``
bounds a process's tasks: its gate bounds how many sandboxes start at once (creation is the expensive
burst), and ``kill()`` ends every live sandbox and cuts off every LLM request in flight at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ..sandbox import Sandbox, SandboxConfig
from ..sandbox.errors import AgentError, SandboxError
from . import llm_prompt
from . import prompts as prompt_configs
from .llm import LLMClient, LLMConfig, LLMError
from .loop import AgentConfig
from .run import check_copy_out, prepare, run_in
from .tasks import Mode, Task, TaskResult
from .trajectory import Step

Stepped = Callable[[str, int, int], None]
"""Told ``(task_id, step, tokens)`` after each agent step of a running task; ``tokens`` is its total so far."""


class Job(BaseModel):
    """What every task of a batch shares; sent as is to the Ray workers that run them."""

    llm: LLMConfig
    sandbox: SandboxConfig
    agent: AgentConfig
    mode: Mode
    inputs_root: Path | None = Field(None, description="where @path input files are, on every node that runs tasks")
    copy_out: list[str] = Field(default_factory=list, description="paths of the jail's output copied beside answer.txt")

    @field_validator("copy_out")
    @classmethod
    def _copy_out(cls, paths: list[str]) -> list[str]:
        return [check_copy_out(p) for p in paths]


class TaskKilled(AgentError):
    """The batch was killed while this task ran."""


class Guard:
    """One process's hold on its running tasks: the start gate, and every live sandbox and LLM client,
    which ``kill()`` ends at once (an LLM request in flight included)."""

    def __init__(self, gate: AbstractContextManager[Any]) -> None:
        self.gate = gate
        self.killed = threading.Event()
        self._enders: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, end: Callable[[], None]) -> Iterator[None]:
        """While inside, ``kill()`` calls ``end``; ending at once if the batch is already killed."""
        with self._lock:
            killed = self.killed.is_set()
            self._enders[id(end)] = end
        try:
            if killed:
                end()
                raise TaskKilled("the batch was killed")
            yield
        finally:
            with self._lock:
                self._enders.pop(id(end), None)

    def kill(self) -> None:
        with self._lock:
            self.killed.set()
            enders = list(self._enders.values())
        for end in enders:
            end()


def execute(task: Task, job: Job, directory: Path, guard: Guard, stepped: Stepped | None = None) -> TaskResult | None:
    """One task in its own fresh sandbox (closed whatever happens), its trajectory and ``output/answer.txt``
    in ``directory`` (which exists, and which the jail never sees); None when the batch was killed meanwhile.
    Scoring is the driver's."""
    started = time.monotonic()
    try:
        result = _llm_only(task, job, guard) if job.mode == "llm" else _in_sandbox(task, job, directory, guard, stepped)
    except (SandboxError, LLMError, OSError, ValueError, TaskKilled) as exc:
        result = TaskResult(
            id=task.id,
            domain=task.domain,
            mode=job.mode,
            # the jail (its config included: a missing rootfs) or the endpoint failed, not the model's work;
            # a task's own bad input is the task's
            exit_status="llm_error"
            if isinstance(exc, LLMError)
            else "sandbox_error"
            if isinstance(exc, SandboxError)
            else "error",
            expected=task.answer,
            error=f"{type(exc).__name__}: {exc}",
        )
    if guard.killed.is_set():
        return None
    result.wall_seconds = time.monotonic() - started
    return result


def _in_sandbox(task: Task, job: Job, directory: Path, guard: Guard, stepped: Stepped | None) -> TaskResult:
    prompts = prompt_configs.load(task.prompt_config)
    agent = job.agent.model_copy(
        update={k: v for k, v in (("max_steps", task.max_steps), ("time_limit", task.time_limit)) if v is not None}
    )
    tokens = 0

    def on_step(step: Step) -> None:
        nonlocal tokens
        tokens += step.prompt_tokens + step.completion_tokens
        if stepped is not None:
            stepped(task.id, step.index, tokens)

    with guard.gate:
        if guard.killed.is_set():
            raise TaskKilled("the batch was killed")
        sb = Sandbox(job.sandbox)
    with sb, guard.hold(sb.close), LLMClient(job.llm) as client, guard.hold(client.cancel):
        prepare(sb, prompts, task, job.inputs_root)
        trajectory = run_in(
            sb,
            client,
            task.query,
            directory,
            prompts,
            agent,
            on_step,
            describe={"task": task.id},
            outputs="output",
            copy_out=job.copy_out,
        )
    return TaskResult(
        id=task.id,
        domain=task.domain,
        mode="sandbox",
        exit_status=trajectory.exit_status or "error",
        answer=trajectory.answer,
        expected=task.answer,
        steps=len(trajectory.steps),
        tokens=trajectory.prompt_tokens + trajectory.completion_tokens,
        llm_seconds=trajectory.llm_seconds,
        sandbox_seconds=trajectory.sandbox_seconds,
        error=trajectory.error,
    )


def _llm_only(task: Task, job: Job, guard: Guard) -> TaskResult:
    """The same model answering directly, no tools: the baseline the sandbox's gain is measured against."""
    with LLMClient(job.llm) as client, guard.hold(client.cancel):
        completion = client.complete([{"role": "user", "content": llm_prompt.build(task, job.inputs_root)}])
    answer = str(completion.message.get("content") or "").strip()
    return TaskResult(
        id=task.id,
        domain=task.domain,
        mode="llm",
        exit_status="answered",
        answer=answer,
        expected=task.answer,
        steps=1,
        tokens=completion.usage.total_tokens,
        llm_seconds=completion.latency,
    )
