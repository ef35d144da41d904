"""``jailbox view`` (``docs/view.md``): the page of a batch of 1,000 tasks as its server renders it
(an HTTP GET on loopback, in this process), against the same server handing out the batch's own
``results.jsonl`` as a file: the cost of reading the records and rendering them over moving bytes."""

from __future__ import annotations

import http.client
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary, interleave, timed
from jailbox.agent.tasks import TaskResult
from jailbox.agent.view import Viewer, open_sources

TASKS = 1000


def _batch(out: Path) -> None:
    """A batch's ``results.jsonl``: every outcome, scores, steps, tokens, times."""
    outcomes = ("submitted", "max_steps", "llm_error")
    results = []
    for i in range(TASKS):
        failed = i % 3 == 2
        results.append(
            TaskResult(
                id=f"task-{i}",
                domain=f"d{i % 7}",
                mode="sandbox",
                exit_status=outcomes[i % 3],
                answer=str(i),
                expected=str(i if i % 2 else -1),
                score=float(i % 2),
                steps=i % 40,
                tokens=100 * i,
                wall_seconds=i % 97,
                error="HTTP 500" if failed else None,
            )
        )
    (out / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in results))


@contextmanager
def _serving(out: Path) -> Iterator[str]:
    viewer = Viewer(open_sources([str(out)]))
    url = viewer.bind()
    thread = threading.Thread(target=viewer.serve, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        viewer.close()
        thread.join(10)


def _get(url: str, path: str) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        if reply.status != 200 or not body:
            raise RuntimeError(f"the viewer answered {reply.status} to {path}")
    finally:
        conn.close()


def view(settings: Settings) -> CaseResult:
    with tempfile.TemporaryDirectory(prefix="bench-view-") as scratch:
        out = Path(scratch)
        _batch(out)
        with _serving(out) as url:
            token = urlsplit(url).query
            page = timed("page", lambda: _get(url, f"/?{token}"))
            raw = timed("file", lambda: _get(url, f"/file?{token}&s=0&p=results.jsonl&dl=1"))
            samples = interleave(settings.view_reps, [page, raw], settings.warmup)
    rendered = Summary.of(samples["page"])
    return CaseResult([
        Row(f"view: a batch of {TASKS:,} tasks, its page rendered and served", "ms", rendered,
            "its results.jsonl served as a file", Summary.of(samples["file"]),
            Target.check("<= 1000 ms", rendered.median <= 1000)),
    ])  # fmt: skip
