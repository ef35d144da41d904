"""A batch's tasks and results on disk: the tasks file, ``results.jsonl`` and each task's directory.

Runs in the driver process (Ray workers get the models already parsed). The tasks file is read whole
and its errors name the line; a results line torn by a crash is skipped, so that task runs again. A tasks
file is data: ``check_task`` holds it to scorers by name and ``@path`` inputs beneath a root. A task's
directory name is at most 100 safe characters, one per id, made through ``hostfs`` whatever the id.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from ..sandbox import hostfs
from . import inputs, judge
from .outcomes import Failure, of_status
from .scoring import Scorer, ScoringError, default_scorer, math_equal, symbolic

Mode = Literal["sandbox", "llm"]
_KEPT = frozenset(string.ascii_letters + string.digits + "-_.")
_NAME_CHARS = 100


class Task(BaseModel):
    """One row of a tasks file: ``id``, ``query`` (or ``problem_statement``), and what scores it.

    The reference benchmark's rows load as they are: ``ground_truth`` is the ``answer`` (an object, as an
    instruction list may be given, is kept as its JSON text), ``input_files`` may be a JSON string (as its
    dataset stores it) and a ``null`` file is skipped, a relative file name (``notes.txt``) lands in the
    prompt config's input directory, and a task naming no ``scorer`` gets its domain's (``scoring.default_scorer``).
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    query: str
    answer: str | None = None
    scorer: str = "exact"
    domain: str = "general"
    input_files: dict[str, str] = Field(
        default_factory=dict,
        description="jail path, or a bare name in the input directory -> inline text, or @path beneath the inputs root",
    )
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
            if "answer" not in data and "ground_truth" in data:
                data["answer"] = data["ground_truth"]
            if isinstance(data.get("answer"), dict | list):
                data["answer"] = json.dumps(data["answer"])
            if "id" in data:
                data["id"] = str(data["id"])
            if "scorer" not in data:
                data["scorer"] = default_scorer(str(data.get("domain") or ""))
            files = data.get("input_files")
            if isinstance(files, str):
                try:
                    files = json.loads(files) if files.strip() else {}
                except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser recurses
                    raise ValueError(
                        'input_files: a string must be a JSON object, e.g. \'{"notes.txt": "text"}\''
                    ) from None
            if isinstance(files, dict):
                files = {name: content for name, content in files.items() if content is not None}
            if files is not None:
                data["input_files"] = files
        return data

    def input_paths(self, input_dir: str) -> dict[str, str]:
        """``input_files`` by jail path: a relative name (the reference's bare ``notes.txt``) is in ``input_dir``."""
        return {
            name if name.startswith("/") else f"{input_dir.rstrip('/')}/{name}": content
            for name, content in self.input_files.items()
        }


class TaskResult(BaseModel):
    id: str
    domain: str
    mode: Mode
    model: str | None = None  # set by the batch that recorded it: results are keyed by (id, mode, model)
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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failure(self) -> Failure | None:
        """Whose failure this is (``outcomes.of_status``): ``"infra"`` results measured nothing."""
        return of_status(self.exit_status, self.score)


def load_tasks(path: str | Path) -> list[Task]:
    """JSONL, one task per line; errors name the line."""
    tasks, seen = [], set()
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = Task.model_validate(json.loads(line))
        except ValidationError as exc:  # one line naming the field, not pydantic's report
            first = exc.errors()[0]
            raise ValueError(f"{path}:{number}: {'.'.join(map(str, first['loc'])) or 'task'}: {first['msg']}") from None
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        except RecursionError:  # json.loads recurses once per level; a hostile file nests past Python's limit
            raise ValueError(f"{path}:{number}: nested too deeply for a task") from None
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


def check_task(task: Task, scorers: Mapping[str, Scorer]) -> None:
    """Refuse, before anything runs, a task naming a scorer not in ``scorers`` (or ``judge`` with no judge
    model set, or ``math`` without its extra), a relative input name that leaves the input directory, or an
    ``@path`` input that is absolute or has ``..``; the error is one line naming the task and the field."""
    if scorers.get(task.scorer) is judge.unconfigured:
        raise ValueError(f"task {task.id!r}: {judge.NO_JUDGE}")
    if scorers.get(task.scorer) is math_equal:
        try:
            symbolic()
        except ScoringError as exc:
            raise ValueError(f"task {task.id!r}: {exc}") from None
    if task.scorer not in scorers:
        raise ValueError(
            f"task {task.id!r}: scorer {task.scorer!r} is unknown; valid names: {', '.join(scorers)} "
            "(others come from --scorer-module or the jailbox.scorers entry points, never from a tasks file)"
        )
    for jail_path, value in task.input_files.items():
        parts = [part for part in jail_path.split("/") if part not in ("", ".")]
        if not jail_path.startswith("/") and (not parts or ".." in parts or "\0" in jail_path):
            raise inputs.InputError(
                task.id, jail_path, "a relative name is a file in the input directory, without '..': e.g. 'notes.txt'"
            )
        inputs.check(task.id, jail_path, value)


def dir_name(task_id: str) -> str:
    """The task's directory name, a different one for every id: letters, digits, ``-``, ``_`` and
    ``.`` (not leading) are kept, every other byte is ``%XX``, so ``..``, ``/``, NUL and hidden names
    cannot come out; an empty or long result is cut and ends in ``~`` and a hash of the id."""
    raw = task_id.encode(errors="surrogatepass")
    name = "".join(
        chr(b) if chr(b) in _KEPT and not (i == 0 and b == ord(".")) else f"%{b:02X}" for i, b in enumerate(raw)
    )
    if 0 < len(name) <= _NAME_CHARS:
        return name
    return f"{name[: _NAME_CHARS - 17]}~{hashlib.sha256(raw).hexdigest()[:16]}"


def make_task_dir(out_dir: Path, task_id: str) -> Path:
    """``out_dir/tasks/<dir_name>``, made (or kept) through ``hostfs``: a link left there is replaced, not followed."""
    name = dir_name(task_id)
    with hostfs.Destination(out_dir) as out:
        out.mkdir("tasks", 0o755)
        out.mkdir(f"tasks/{name}", 0o755)
    return out_dir / "tasks" / name
