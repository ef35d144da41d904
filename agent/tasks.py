"""A batch's tasks and results on disk: the tasks file, ``results.jsonl`` and each task's directory.

Runs in the driver process (Ray workers get the models already parsed). The tasks file is read whole
and its errors name the line; a results line torn by a crash is skipped, so that task runs again; a
task's directory name is cut to 100 safe characters whatever its id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Mode = Literal["sandbox", "llm"]


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


def task_dir(out_dir: Path, task_id: str) -> Path:
    return out_dir / "tasks" / _safe(task_id)


def _safe(task_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:100] or "task"
