"""Many tasks at once, driven from this process: a fresh jail per task, N workers, results appended as each task ends.

``results.jsonl`` is the run's memory: every finished task is one line, scored here on the driver,
flushed and synced, so a crashed or interrupted run resumes (``resume=True``) without redoing finished
work. The driver bounds how many tasks (so live sandboxes) run at once by ``workers``; where they run is
the ``Executor``'s business, given to the batch (threads by default, others found by name in
``EXECUTORS``), and the driver loop, the scoring and the results file are the same for all. A task's
directory is named by ``tasks.dir_name`` and made through ``hostfs``, whatever its id.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import Field

from ..extras import missing
from ..sandbox import SandboxConfig
from .executors import Executor, ExecutorConfig, ExecutorError, ExecutorFactory, ThreadExecutor
from .llm import LLMConfig
from .loop import AgentConfig
from .scoring import Scorer, ScoringError, load_scorers, score
from .tasks import Mode, Task, TaskResult, check_task, read_results
from .worker import Job

EXECUTORS: dict[str, tuple[str, str]] = {
    "threads": (".executors", "ThreadExecutor"),
    "ray": (".ray_executor", "RayExecutor"),  # imported only when chosen: Ray is an optional extra
}
"""Executors by name: (module relative to this package, class)."""

ResultKey = tuple[str, str, str | None]
"""(task id, mode, model): one task's result for one way of running it."""


def find_executor(name: str) -> ExecutorFactory:
    """The executor called ``name`` in ``EXECUTORS``, its module imported now: ``ExecutorError`` naming the
    extra to install when that module's imports are not installed."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
    module, attribute = EXECUTORS[name]
    try:
        imported = importlib.import_module(module, __package__)
    except ImportError as exc:
        raise ExecutorError(missing(f"executor {name!r}", exc)) from None
    factory: ExecutorFactory = getattr(imported, attribute)
    return factory


class BatchConfig(ExecutorConfig):
    mode: Mode = "sandbox"
    resume: bool = False
    inputs_root: Path | None = Field(None, description="@path input files are beneath it (the tasks file's directory)")
    copy_out: list[str] = Field(default_factory=list, description="paths of the jail's output copied beside answer.txt")


class Observer:
    """Told what the batch does (the live display is one); every method does nothing unless overridden.
    ``stepped`` comes from the executor (worker threads, or the driver relaying Ray's workers)."""

    def started(self, task: Task) -> None:
        """A task was handed to the executor."""

    def stepped(self, task_id: str, step: int, tokens: int) -> None:
        """A running task finished agent step ``step``; ``tokens`` is its total so far."""

    def finished(self, result: TaskResult) -> None:
        """A task ended and its result is recorded."""


class Batch:
    """``Batch(tasks, llm, out_dir).run()``; ``stop()`` finishes running tasks, ``kill()`` ends them.

    Every task is checked when the batch is made, before anything runs: its scorer is one of ``scorers``
    (``load_scorers()``: the built-ins and installed entry points) and its ``@path`` inputs stay beneath
    ``config.inputs_root``.

    Both only set a flag (they are safe from a signal handler); the driver acts on it within ``POLL``.
    ``executor`` makes the batch's executor when it runs (``ThreadExecutor``, or ``find_executor(name)``).
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
        executor: ExecutorFactory = ThreadExecutor,
        scorers: Mapping[str, Scorer] | None = None,
    ) -> None:
        self.tasks = list(tasks)
        self.scorers = load_scorers() if scorers is None else scorers
        for task in self.tasks:
            check_task(task, self.scorers)
        self._by_id = {t.id: t for t in self.tasks}
        self.out_dir = out_dir
        self.config = config or BatchConfig()
        self.job = Job(
            llm=llm,
            sandbox=sandbox or SandboxConfig(),
            agent=agent or AgentConfig(),
            mode=self.config.mode,
            inputs_root=self.config.inputs_root,
            copy_out=self.config.copy_out,
        )
        self.observer = observer or Observer()
        self.make_executor = executor
        self.results_path = out_dir / "results.jsonl"
        self.stopping = threading.Event()
        self.killing = threading.Event()

    def key(self, task_id: str) -> ResultKey:
        """What a result is known by: the task, and the mode and model this batch runs it with."""
        return (task_id, self.config.mode, self.job.llm.model)

    def done_keys(self) -> set[ResultKey]:
        return {(r.id, r.mode, r.model) for r in read_results(self.results_path)}

    def pending(self) -> list[Task]:
        """The tasks this run will do: all, or with ``resume`` those ``results.jsonl`` lacks for this batch's
        mode and model (another model's or mode's results in the same file are kept, and not counted)."""
        done = self.done_keys() if self.config.resume else set()
        return [t for t in self.tasks if self.key(t.id) not in done]

    def run(self) -> list[TaskResult]:
        """Raises ``FileExistsError`` without ``resume`` when ``results.jsonl`` exists: results are never
        deleted (move the directory aside, or resume)."""
        if not self.config.resume and self.results_path.exists():
            raise FileExistsError(f"{self.results_path} exists: resume it (resume=True) or use another out_dir")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        pending = self.pending()
        results: list[TaskResult] = []
        executor: Executor = self.make_executor(self.job, self.out_dir, self.config, self.observer.stepped)
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

    def _record(self, result: TaskResult) -> TaskResult:
        """Scored here, on the driver, then appended and synced before anyone is told."""
        result.model = self.job.llm.model
        expected = self._by_id.get(result.id)
        if expected is not None and expected.answer is not None and result.failure != "infra":  # measured nothing
            try:
                result.score = score(result.answer, expected.answer, expected.scorer, self.scorers, expected.query)
            except ScoringError as exc:  # the task ran; its score is what failed, and says why
                result.error = result.error or str(exc)
        with open(self.results_path, "a") as f:
            f.write(result.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.observer.finished(result)
        return result
