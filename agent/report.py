"""A batch's summary: one row per (domain, mode, model) of its results, as ``summary.json`` and ``summary.md``.

Runs in the driver process, after the batch (or on a results file alone); reads only ``TaskResult``s,
so it is the same for every executor and for a resumed run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .outcomes import INFRASTRUCTURE
from .tasks import TaskResult


def common_failure(results: Sequence[TaskResult]) -> str | None:
    """The one cause, as ``status: error``, when every result failed for it (the endpoint down, the
    rootfs missing): such a run measured nothing, and must not look like a score of zero."""
    causes = {
        (r.exit_status, re.sub(r" \(attempt \d+\)", "", r.error or "")) for r in results
    }  # the attempt count differs between tasks that failed alike
    if not results or len(causes) != 1:
        return None
    status, error = causes.pop()
    return f"{status}: {error}" if status in INFRASTRUCTURE else None


def summary(results: Iterable[TaskResult]) -> list[dict[str, Any]]:
    """One row per (domain, mode, model): tasks, mean score, tokens, steps, LLM vs sandbox seconds."""
    groups: dict[tuple[str, str, str], list[TaskResult]] = {}
    for r in results:
        groups.setdefault((r.domain, r.mode, r.model or ""), []).append(r)
    rows = []
    for (domain, mode, model), group in sorted(groups.items()):
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
                "model": model,
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


def write_summary(results: Iterable[TaskResult], out_dir: Path) -> str:
    """``summary.json`` and ``summary.md`` of ``results`` in ``out_dir``; returns the markdown."""
    rows = summary(results)
    text = markdown(rows)
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "summary.md").write_text(text)
    return text
