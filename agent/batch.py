"""Many tasks at once: a fresh jail per task, N workers, results appended as each task ends.

``results.jsonl`` is the run's memory: every finished task is one line, flushed and synced, so a
crashed or interrupted run resumes (``resume=True``) without redoing finished work. Each task's
sandbox is closed whatever happens; a cap bounds how many jails start at once (creation is the
expensive burst) on top of the worker count that bounds how many live.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent import prompts as prompt_configs
from agent.llm import LLMClient, LLMConfig, LLMError
from agent.loop import AgentConfig
from agent.run import prepare, run_in
from agent.scoring import score
from sandbox import Sandbox, SandboxConfig
from sandbox.errors import SandboxError

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
    workers: int = Field(4, ge=1)
    max_starting: int = Field(4, ge=1, description="sandboxes being created at once")
    mode: Mode = "sandbox"
    resume: bool = False


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


class Batch:
    """``Batch(tasks, llm, out_dir).run()``; ``stop()`` finishes running tasks, ``kill()`` ends them."""

    def __init__(
        self,
        tasks: Iterable[Task],
        llm: LLMConfig,
        out_dir: Path,
        config: BatchConfig | None = None,
        sandbox: SandboxConfig | None = None,
        agent: AgentConfig | None = None,
        on_result: Callable[[TaskResult], None] | None = None,
    ) -> None:
        self.tasks = list(tasks)
        self.llm = llm
        self.out_dir = out_dir
        self.config = config or BatchConfig()
        self.sandbox = sandbox or SandboxConfig()
        self.agent = agent or AgentConfig()
        self.on_result = on_result
        self.results_path = out_dir / "results.jsonl"
        self._write_lock = threading.Lock()
        self._starting = threading.Semaphore(self.config.max_starting)
        self._live: set[Sandbox] = set()
        self._live_lock = threading.Lock()
        self._stopping = threading.Event()
        self._killing = threading.Event()

    def done_ids(self) -> set[str]:
        return {r.id for r in read_results(self.results_path)}

    def run(self) -> list[TaskResult]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        done = self.done_ids() if self.config.resume else set()
        if not self.config.resume and self.results_path.exists():
            self.results_path.unlink()
        pending = [t for t in self.tasks if t.id not in done]
        results: list[TaskResult] = []
        with ThreadPoolExecutor(self.config.workers, thread_name_prefix="jailbox-task") as pool:
            queue = iter(pending)
            running: set[Future[TaskResult | None]] = set()
            while True:
                while not self._stopping.is_set() and len(running) < self.config.workers:
                    task = next(queue, None)
                    if task is None:
                        break
                    running.add(pool.submit(self._run_one, task))
                if not running:
                    break
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                results.extend(r for r in (f.result() for f in finished) if r is not None)
        return results

    def stop(self) -> None:
        """Start no new task; running ones finish."""
        self._stopping.set()

    def kill(self) -> None:
        """Start no new task and end the running ones now (their results are not recorded)."""
        self._stopping.set()
        self._killing.set()
        with self._live_lock:
            live = list(self._live)
        for sb in live:
            sb.close()

    def _run_one(self, task: Task) -> TaskResult | None:
        started = time.monotonic()
        try:
            result = self._llm_only(task) if self.config.mode == "llm" else self._in_sandbox(task)
        except (SandboxError, LLMError, OSError, ValueError) as exc:
            result = TaskResult(
                id=task.id,
                domain=task.domain,
                mode=self.config.mode,
                exit_status="error",
                expected=task.answer,
                error=f"{type(exc).__name__}: {exc}",
            )
        if self._killing.is_set():
            return None
        result.wall_seconds = time.monotonic() - started
        if task.answer is not None:
            result.score = score(result.answer, task.answer, task.scorer)
        self._record(result)
        return result

    def _in_sandbox(self, task: Task) -> TaskResult:
        prompts = prompt_configs.load(task.prompt_config)
        agent = self.agent.model_copy(
            update={k: v for k, v in (("max_steps", task.max_steps), ("time_limit", task.time_limit)) if v is not None}
        )
        task_dir = self.out_dir / "tasks" / _safe(task.id)
        task_dir.mkdir(parents=True, exist_ok=True)
        with self._starting:
            if self._stopping.is_set() and self._killing.is_set():
                raise SandboxError("the batch was killed")
            sb = Sandbox(self.sandbox)
        with self._live_lock:
            self._live.add(sb)
        try:
            with sb, LLMClient(self.llm) as client:
                prepare(sb, prompts, task.input_files)
                trajectory = run_in(
                    sb,
                    client,
                    task.query,
                    task_dir / "trajectory.json",
                    task_dir / "output",
                    prompts,
                    agent,
                    describe={"task": task.id},
                )
        finally:
            with self._live_lock:
                self._live.discard(sb)
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

    def _llm_only(self, task: Task) -> TaskResult:
        """The same model answering directly, no tools: the baseline the sandbox's gain is measured against."""
        with LLMClient(self.llm) as client:
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

    def _record(self, result: TaskResult) -> None:
        line = result.model_dump_json() + "\n"
        with self._write_lock:
            with open(self.results_path, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        if self.on_result is not None:
            self.on_result(result)


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
