"""Many tasks at once: a fresh jail per task, N workers, results appended as each task ends.

``results.jsonl`` is the run's memory: every finished task is one line, flushed and synced, so a
crashed or interrupted run resumes (``resume=True``) without redoing finished work. Each task's
sandbox is closed whatever happens; a cap bounds how many jails start at once (creation is the
expensive burst) on top of the worker count that bounds how many live. Where tasks run is an
``Executor``'s business (threads here, Ray in ``agent.ray_executor``); the driver loop, the scoring and
the results file are the same for both.
"""

from __future__ import annotations

import json
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..sandbox import Sandbox, SandboxConfig
from ..sandbox.errors import SandboxError
from . import prompts as prompt_configs
from .llm import LLMClient, LLMConfig, LLMError
from .loop import AgentConfig
from .run import prepare, run_in
from .scoring import score
from .trajectory import Step

Mode = Literal["sandbox", "llm"]
LLM_MODE_SUFFIX = "\n\nAnswer directly. Put the final answer in \\boxed{}."


class Task(BaseModel):
    """One row of a tasks file: ``id``, ``query`` (or ``problem_statement``), and what scores it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    query: str
    answer: str | None = None
    scorer: str = "exact"
    domain: str = "general"
    input_files: dict[str, str] = Field(default_factory=dict, description="jail path -> inline text or @host path")
    prompt_config: str | None = None
    max_steps: int | None = None
    time_limit: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "query" not in data and "problem_statement" in data:
                data["query"] = data["problem_statement"]
            if "id" in data:
                data["id"] = str(data["id"])
        return data


class TaskResult(BaseModel):
    id: str
    domain: str
    mode: Mode
    exit_status: str
    answer: str | None = None
    expected: str | None = None
    score: float = 0.0
    steps: int = 0
    tokens: int = 0
    llm_seconds: float = 0.0
    sandbox_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: str | None = None


class BatchConfig(BaseModel):
    workers: int = Field(4, ge=1, description="tasks (so live sandboxes) at once")
    max_starting: int = Field(4, ge=1, description="sandboxes being created at once")
    mode: Mode = "sandbox"
    resume: bool = False
    executor: Literal["threads", "ray"] = "threads"
    ray_address: str | None = Field(None, description="a running Ray cluster; None: $RAY_ADDRESS, else a local one")
    task_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves per task")


def load_tasks(path: str | Path) -> list[Task]:
    """JSONL, one task per line; errors name the line."""
    tasks, seen = [], set()
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = Task.model_validate(json.loads(line))
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        if task.id in seen:
            raise ValueError(f"{path}:{number}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    return tasks


class Job(BaseModel):
    """What every task of a batch shares; sent as is to the Ray workers that run them."""

    llm: LLMConfig
    sandbox: SandboxConfig
    agent: AgentConfig
    mode: Mode


class ExecutorError(Exception):
    """An executor cannot run this batch (Ray missing, a worker node without the root filesystem)."""


class TaskKilled(Exception):
    """The batch was killed while this task ran."""


class Observer:
    """Told what the batch does (the live display is one). ``stepped`` comes from worker threads."""

    def started(self, task: Task) -> None:
        """A task was handed to the executor."""

    def stepped(self, task_id: str, step: int, tokens: int) -> None:
        """A running task finished agent step ``step``; ``tokens`` is its total so far."""

    def finished(self, result: TaskResult) -> None:
        """A task ended and its result is recorded."""


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


def task_dir(out_dir: Path, task_id: str) -> Path:
    return out_dir / "tasks" / _safe(task_id)


def execute(
    task: Task, job: Job, directory: Path, guard: Guard, stepped: Callable[[str, int, int], None] | None = None
) -> TaskResult | None:
    """One task in its own fresh sandbox (closed whatever happens), its trajectory and output under
    ``directory``; None when the batch was killed meanwhile. Scoring is the driver's."""
    started = time.monotonic()
    try:
        result = _llm_only(task, job, guard) if job.mode == "llm" else _in_sandbox(task, job, directory, guard, stepped)
    except (SandboxError, LLMError, OSError, ValueError, TaskKilled) as exc:
        result = TaskResult(
            id=task.id,
            domain=task.domain,
            mode=job.mode,
            exit_status="error",
            expected=task.answer,
            error=f"{type(exc).__name__}: {exc}",
        )
    if guard.killed.is_set():
        return None
    result.wall_seconds = time.monotonic() - started
    return result


def _in_sandbox(
    task: Task, job: Job, directory: Path, guard: Guard, stepped: Callable[[str, int, int], None] | None
) -> TaskResult:
    prompts = prompt_configs.load(task.prompt_config)
    agent = job.agent.model_copy(
        update={k: v for k, v in (("max_steps", task.max_steps), ("time_limit", task.time_limit)) if v is not None}
    )
    directory.mkdir(parents=True, exist_ok=True)
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
        prepare(sb, prompts, task.input_files)
        trajectory = run_in(
            sb,
            client,
            task.query,
            directory / "trajectory.json",
            directory / "output",
            prompts,
            agent,
            on_step,
            describe={"task": task.id},
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
        completion = client.complete([{"role": "user", "content": task.query + LLM_MODE_SUFFIX}])
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


class Executor(ABC):
    """Where tasks run. The batch's driver submits at most ``workers`` at once, collects what ``wait``
    returns and records it; a killed task returns nothing."""

    @property
    @abstractmethod
    def running(self) -> int:
        """Tasks submitted and not yet returned."""

    @abstractmethod
    def submit(self, task: Task) -> None: ...

    @abstractmethod
    def wait(self, timeout: float) -> list[TaskResult]:
        """Results of tasks that ended, waiting up to ``timeout`` seconds for the first."""

    @abstractmethod
    def kill(self) -> None:
        """End every running task now, leaving no sandbox behind."""

    @abstractmethod
    def close(self) -> None: ...


class ThreadExecutor(Executor):
    """Tasks on this machine, one thread each."""

    def __init__(self, job: Job, out_dir: Path, config: BatchConfig, observer: Observer) -> None:
        self.job = job
        self.out_dir = out_dir
        self.observer = observer
        self.guard = Guard(threading.Semaphore(config.max_starting))
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="jailbox-task")
        self._futures: set[Future[TaskResult | None]] = set()

    @property
    def running(self) -> int:
        return len(self._futures)

    def submit(self, task: Task) -> None:
        directory = task_dir(self.out_dir, task.id)
        self._futures.add(self._pool.submit(execute, task, self.job, directory, self.guard, self.observer.stepped))

    def wait(self, timeout: float) -> list[TaskResult]:
        finished, self._futures = wait(self._futures, timeout, return_when=FIRST_COMPLETED)
        return [r for r in (f.result() for f in finished) if r is not None]

    def kill(self) -> None:
        self.guard.kill()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Batch:
    """``Batch(tasks, llm, out_dir).run()``; ``stop()`` finishes running tasks, ``kill()`` ends them.

    Both only set a flag (they are safe from a signal handler); the driver acts on it within ``POLL``.
    """

    POLL = 0.2

    def __init__(
        self,
        tasks: Iterable[Task],
        llm: LLMConfig,
        out_dir: Path,
        config: BatchConfig | None = None,
        sandbox: SandboxConfig | None = None,
        agent: AgentConfig | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.tasks = list(tasks)
        self._by_id = {t.id: t for t in self.tasks}
        self.out_dir = out_dir
        self.config = config or BatchConfig()
        self.job = Job(llm=llm, sandbox=sandbox or SandboxConfig(), agent=agent or AgentConfig(), mode=self.config.mode)
        self.observer = observer or Observer()
        self.results_path = out_dir / "results.jsonl"
        self.stopping = threading.Event()
        self.killing = threading.Event()

    def done_ids(self) -> set[str]:
        return {r.id for r in read_results(self.results_path)}

    def pending(self) -> list[Task]:
        """The tasks this run will do: all, or with ``resume`` those not in ``results.jsonl``."""
        done = self.done_ids() if self.config.resume else set()
        return [t for t in self.tasks if t.id not in done]

    def run(self) -> list[TaskResult]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        pending = self.pending()
        if not self.config.resume and self.results_path.exists():
            self.results_path.unlink()
        results: list[TaskResult] = []
        executor = self._executor()
        killed = False
        try:
            queue = iter(pending)
            while True:
                if self.killing.is_set() and not killed:
                    executor.kill()
                    killed = True
                while not self.stopping.is_set() and executor.running < self.config.workers:
                    task = next(queue, None)
                    if task is None:
                        break
                    executor.submit(task)
                    self.observer.started(task)
                if not executor.running:
                    break
                for result in executor.wait(self.POLL):
                    results.append(self._record(result))
        except BaseException:
            if not killed:
                executor.kill()
            raise
        finally:
            executor.close()
        return results

    def stop(self) -> None:
        """Start no new task; running ones finish."""
        self.stopping.set()

    def kill(self) -> None:
        """Start no new task and end the running ones now (their results are not recorded)."""
        self.stopping.set()
        self.killing.set()

    def _executor(self) -> Executor:
        if self.config.executor == "ray":
            from .ray_executor import RayExecutor

            return RayExecutor(self.job, self.out_dir, self.config, self.observer)
        return ThreadExecutor(self.job, self.out_dir, self.config, self.observer)

    def _record(self, result: TaskResult) -> TaskResult:
        """Scored here, on the driver, then appended and synced before anyone is told."""
        expected = self._by_id.get(result.id)
        if expected is not None and expected.answer is not None:
            result.score = score(result.answer, expected.answer, expected.scorer)
        with open(self.results_path, "a") as f:
            f.write(result.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.observer.finished(result)
        return result


def read_results(path: Path) -> list[TaskResult]:
    """Every complete line of a results file; a line torn by a crash is skipped (that task runs again)."""
    if not path.exists():
        return []
    results = []
    for line in path.read_text().splitlines():
        try:
            results.append(TaskResult.model_validate_json(line))
        except ValidationError:
            continue
    return results


def _safe(task_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:100] or "task"


def summary(results: Iterable[TaskResult]) -> list[dict[str, Any]]:
    """One row per (domain, mode): tasks, mean score, tokens, steps, LLM vs sandbox seconds."""
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        groups.setdefault((r.domain, r.mode), []).append(r)
    rows = []
    for (domain, mode), group in sorted(groups.items()):
        n = len(group)
        rows.append(
            {
                "domain": domain,
                "mode": mode,
                "tasks": n,
                "score": round(sum(r.score for r in group) / n, 4),
                "tokens": sum(r.tokens for r in group),
                "steps": round(sum(r.steps for r in group) / n, 2),
                "llm_seconds": round(sum(r.llm_seconds for r in group), 2),
                "sandbox_seconds": round(sum(r.sandbox_seconds for r in group), 2),
                "submitted": sum(r.exit_status == "submitted" for r in group),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no results)\n"
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[k]) for k in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"
