"""Where a batch's tasks run: the ``Executor`` interface the driver talks to, and the threads executor.

Runs in the driver process. An executor bounds what it runs by its ``ExecutorConfig``: at most
``workers`` tasks (so live sandboxes) at once, at most ``max_starting`` sandboxes being created at once.
The driver loop, the scoring and the results file are the driver's (``agent.batch``), the same for every
executor; Ray's is ``agent.ray_executor``, found by name in the driver's registry.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from ..sandbox.errors import AgentError
from .tasks import Task, TaskResult, make_task_dir
from .worker import Guard, Job, Stepped, execute


class ExecutorConfig(BaseModel):
    """What an executor is told of its batch: how many tasks and starting sandboxes at once, and Ray's settings."""

    workers: int = Field(4, ge=1, description="tasks (so live sandboxes) at once")
    max_starting: int = Field(4, ge=1, description="sandboxes being created at once")
    ray_address: str | None = Field(None, description="a running Ray cluster; None: $RAY_ADDRESS, else a local one")
    task_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves per task")


class ExecutorError(AgentError):
    """An executor cannot run this batch (Ray missing, a worker node without the root filesystem)."""


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


class ExecutorFactory(Protocol):
    """What a batch is given to make its executor when it runs (an ``Executor`` class is one): the job its
    tasks share, the batch's output directory, its config, and where to report each task's steps."""

    def __call__(self, job: Job, out_dir: Path, config: ExecutorConfig, stepped: Stepped) -> Executor: ...


class ThreadExecutor(Executor):
    """Tasks on this machine, one thread each."""

    def __init__(self, job: Job, out_dir: Path, config: ExecutorConfig, stepped: Stepped) -> None:
        self.job = job
        self.out_dir = out_dir
        self.stepped = stepped
        self.guard = Guard(threading.Semaphore(config.max_starting))
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="jailbox-task")
        self._futures: set[Future[TaskResult | None]] = set()

    @property
    def running(self) -> int:
        return len(self._futures)

    def submit(self, task: Task) -> None:
        directory = make_task_dir(self.out_dir, task.id)
        self._futures.add(self._pool.submit(execute, task, self.job, directory, self.guard, self.stepped))

    def wait(self, timeout: float) -> list[TaskResult]:
        finished, self._futures = wait(self._futures, timeout, return_when=FIRST_COMPLETED)
        return [r for r in (f.result() for f in finished) if r is not None]

    def kill(self) -> None:
        self.guard.kill()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
