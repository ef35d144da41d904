"""The viewer's pages, rendered on the server from the records: a run, a batch, a replay, two runs compared.

Runs in the viewer's process. Everything a record holds is text to these functions, escaped where it lands
(``html.el``); the plots are SVG drawn here from numbers and escaped labels. ``Links`` says where a page
points: the server's URLs (each carrying the token), or, in an export, anchors in the one page and files
embedded as ``data:`` URIs within ``EXPORT_FILE`` and ``EXPORT_TOTAL`` bytes.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote_from_bytes, unquote, urlencode

from pydantic import ValidationError

from ..replay import StepDiff
from ..report import INFRASTRUCTURE
from ..tasks import TaskResult, dir_name
from ..trajectory import Action, ExecFacts, Step, Trajectory, from_json
from .html import Html, el, raw, text
from .sources import RESULTS, TASKS, TRAJECTORY, Source, Unreadable

EXPORT_FILE = 4 << 20
"""Bytes of one produced image, audio or video file an export embeds (larger ones are listed, not embedded)."""
EXPORT_TOTAL = 48 << 20
"""Bytes of produced files one export embeds in all."""
MAX_OBSERVATION = 100_000
"""Characters of one observation put in the page (the middle of a longer one is cut, and the page says so)."""

IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}
AUDIO = {".mp3": "audio/mpeg", ".wav": "audio/wav", ".ogg": "audio/ogg", ".flac": "audio/flac", ".m4a": "audio/mp4"}
VIDEO = {".mp4": "video/mp4", ".webm": "video/webm", ".ogv": "video/ogg"}
MEDIA = {**IMAGES, **AUDIO, **VIDEO}
"""Types a produced file is served inline with: none of them runs as a page (SVG and HTML are downloads)."""

_TRUNCATION = re.compile(r"<Observation truncated in middle|^\[\.\.\. .* \.\.\.\]$|^\[\.\.\.\]$|elided|truncated")


class Links:
    """Where a page's links go: ``token``'s server URLs, or (``export``) anchors and embedded files."""

    def __init__(self, token: str, export: bool = False) -> None:
        self.token, self.export = token, export
        self._embedded = 0

    def url(self, path: str, **query: str) -> str:
        return f"{path}?{urlencode({**query, 'token': self.token}, encoding='latin-1')}"  # a name's bytes as they are

    def run(self, source: int, rel: bytes) -> str:
        if self.export:
            return "#" + anchor(source, rel)
        return self.url("/run", s=str(source), p=rel.decode("latin-1"))

    def source(self, source: int) -> str:
        return f"#source-{source}" if self.export else self.url("/source", s=str(source))

    def file(self, src: Source, number: int, rel: bytes, download: bool = False) -> str | None:
        """The file's URL; in an export a ``data:`` URI for media within the budget, else None."""
        if not self.export:
            query = {"s": str(number), "p": rel.decode("latin-1")}
            return self.url("/file", **query, **({"dl": "1"} if download else {}))
        kind = MEDIA.get(_ext(rel))
        if kind is None or download:
            return None
        try:
            data, size = src.read(rel, EXPORT_FILE + 1)
        except Unreadable:
            return None
        if size > EXPORT_FILE or self._embedded + size > EXPORT_TOTAL:
            return None
        self._embedded += size
        return f"data:{kind};base64,{base64.b64encode(data).decode()}"

    def text(self, number: int, rel: bytes) -> str | None:
        return None if self.export else self.url("/text", s=str(number), p=rel.decode("latin-1"))


def anchor(source: int, rel: bytes) -> str:
    return f"run-{source}-{quote_from_bytes(rel, safe='').replace('%', '_')}"


def _ext(rel: bytes) -> str:
    return os.path.splitext(os.fsdecode(rel).lower())[1]


def _name(rel: bytes) -> str:
    return os.fsdecode(rel)


def task_id(name: bytes) -> str:
    """The task id a batch's task directory is named after (``tasks.dir_name`` writes it as ``%XX``)."""
    return unquote(os.fsdecode(name), errors="replace")


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 600 else f"{value / 60:.1f}min"


def _cut(value: str, limit: int) -> tuple[str, int]:
    """``value`` with its middle cut past ``limit`` characters, and how many were cut."""
    if len(value) <= limit:
        return value, 0
    return value[: limit // 2] + "\n" + value[-limit // 2 :], len(value) - limit


# -- a run --------------------------------------------------------------------------------------------------


def load_run(src: Source, rel: bytes, record: str | None = None) -> Trajectory:
    """The run in the directory ``rel`` below ``src``; at its top, the file the PATH named if it named one."""
    path = rel + b"/" + TRAJECTORY.encode() if rel else (record or src.record or TRAJECTORY).encode()
    data = src.json(path)
    try:
        return from_json(data)
    except (ValidationError, ValueError, TypeError, AttributeError, KeyError, SyntaxError, RecursionError):
        raise Unreadable(f"{_name(path)}: not a trajectory jailbox or the reference package wrote") from None


def observation(value: str) -> Html:
    """An observation as the model got it, the lines that say it was cut marked; cut here past MAX_OBSERVATION."""
    value, cut = _cut(value, MAX_OBSERVATION)
    lines = []
    for line in value.split("\n"):
        marked = _TRUNCATION.search(line) is not None
        lines.append(el("span", line, class_="trunc") if marked else text(line))
    body = Html("\n".join(lines))
    note = el("div", f"[the viewer cut {cut} characters from the middle]", class_="trunc") if cut else ""
    return el("div", el("pre", body, class_="obs"), note)


def diff_lines(lines: Iterable[str]) -> Html:
    """Unified-diff lines, each coloured by its first character."""
    out = []
    for line in lines:
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
        if line.startswith(("+++", "---")):
            kind = "hunk"
        out.append(el("span", line, class_=kind))
    return el("pre", Html("\n".join(out)), class_="diff")


def _editor(action: Action) -> Html:
    """An editor call: its command and path, and the edit it asks for as a diff."""
    p = action.parameters
    command, path = str(p.get("command", "")), str(p.get("path", ""))
    head = el("div", el("b", "str_replace_editor "), el("code", f"{command} {path}"), class_="call")
    if command == "str_replace":
        old, new = str(p.get("old_str", "")).split("\n"), str(p.get("new_str", "")).split("\n")
        body = diff_lines(list(difflib.unified_diff(old, new, "before", "after", lineterm=""))[2:] or [" (no change)"])
    elif command == "create":
        body = diff_lines(["+" + line for line in _cut(str(p.get("file_text", "")), MAX_OBSERVATION)[0].split("\n")])
    elif command == "insert":
        lines = str(p.get("new_str", "")).split("\n")
        body = diff_lines([f"@@ after line {p.get('insert_line', '?')} @@", *("+" + line for line in lines)])
    else:
        rest = {k: v for k, v in p.items() if k not in ("command", "path")}
        body = el("pre", json.dumps(rest, ensure_ascii=False)) if rest else Html("")
    return el("div", head, body)


def call(action: Action) -> Html:
    """A tool call with its arguments: a command as a command, an edit as a diff, anything else as JSON."""
    if action.function == "str_replace_editor":
        return _editor(action)
    if action.function == "execute_bash" and set(action.parameters) <= {"command", "timeout"}:
        command = str(action.parameters.get("command", ""))
        return el("div", el("div", el("b", "execute_bash"), class_="call"), el("pre", command, class_="cmd"))
    arguments = json.dumps(action.parameters, indent=1, ensure_ascii=False)
    return el("div", el("div", el("b", action.function), class_="call"), el("pre", arguments, class_="cmd"))


def _facts(facts: ExecFacts | None) -> Html:
    if facts is None:
        return Html("")
    bits = [f"exit {facts.exit_code}", _seconds(facts.wall_time)]
    if facts.timed_out:
        bits.append("timed out")
    if facts.oom_killed:
        bits.append("killed: out of memory")
    return el("div", " · ".join(bits), class_="facts")


def step_html(step: Step) -> Html:
    head = (
        f"Step {step.index} · model {_seconds(step.llm_seconds)} · sandbox {_seconds(step.sandbox_seconds)} · "
        f"tokens {step.prompt_tokens} in, {step.completion_tokens} out"
        + (f" · {step.finish_reason}" if step.finish_reason else "")
    )
    parts: list[Html] = [el("div", head, class_="stephead")]
    if step.reasoning:
        parts.append(el("details", el("summary", "reasoning"), el("pre", step.reasoning, class_="reasoning")))
    if step.thought:
        parts.append(el("pre", step.thought, class_="thought"))
    for n, action in enumerate(step.actions):
        seen = step.observations[n] if n < len(step.observations) else None
        facts = step.exec[n] if n < len(step.exec) else None
        parts.append(
            el(
                "div",
                call(action),
                _facts(facts),
                observation(seen) if seen is not None else el("div", "(no observation)", class_="note"),
                class_="action",
            )
        )
    if step.note:
        parts.append(el("div", "told the model: ", el("pre", step.note), class_="note"))
    return el("li", *parts, class_="step", id=f"step-{step.index}")


def files_html(src: Source, number: int, rel: bytes, links: Links) -> Html:
    """What the run's directory holds besides its records: media inline, text viewable, all downloadable."""
    entries, cut = src.walk(rel)
    rows = []
    for entry in entries:
        below = entry.rel[len(rel) + 1 :] if rel else entry.rel
        if below in (TRAJECTORY.encode(), b"trajectory.reference.json"):
            continue
        name = _name(below)
        if entry.kind != "file":
            why = "a symlink: not followed" if entry.kind == "link" else "not a regular file"
            rows.append(el("tr", el("td", name, class_="fname"), el("td", ""), el("td", why, class_="note")))
            continue
        ext = _ext(entry.rel)
        shown: Html = Html("")
        source = links.file(src, number, entry.rel)
        if source is not None and ext in IMAGES:
            shown = el("img", src=source, alt=name, class_="produced")
        elif source is not None and ext in AUDIO:
            shown = el("audio", controls=True, src=source, preload="metadata")
        elif source is not None and ext in VIDEO:
            shown = el("video", controls=True, src=source, preload="metadata", class_="produced")
        actions = []
        view = links.text(number, entry.rel)
        if view is not None and ext not in MEDIA:
            actions.append(el("a", "view", href=view))
        download = links.file(src, number, entry.rel, download=True)
        if download is not None:
            actions.append(el("a", "download", href=download, download=True))
        rows.append(
            el(
                "tr",
                el("td", name, class_="fname"),
                el("td", f"{entry.size:,} B", class_="num"),
                el("td", shown, " ", Html(" · ".join(actions))),
                class_="file",
            )
        )
    if not rows:
        return el("p", "(no files besides the records)", class_="note")
    note = el("p", "(more files than the viewer lists; the rest are left out)", class_="note") if cut else ""
    return el("div", el("table", *rows, class_="files"), note)


def run_html(src: Source, number: int, rel: bytes, links: Links) -> Html:
    t = load_run(src, rel)
    model = (t.config.get("llm") or {}).get("model") if isinstance(t.config.get("llm"), dict) else None
    wall = (t.finished - t.started) if t.finished else None
    totals = [
        f"{len(t.steps)} steps",
        f"{t.prompt_tokens + t.completion_tokens:,} tokens ({t.prompt_tokens:,} in, {t.completion_tokens:,} out)",
        f"model {_seconds(t.llm_seconds)}",
        f"sandbox {_seconds(t.sandbox_seconds)}",
    ]
    if wall is not None:
        totals.append(f"wall {_seconds(wall)}")
    if model:
        totals.append(f"model {model}")
    status = t.exit_status or "running"
    system = next((m.get("content") for m in t.messages if isinstance(m, dict) and m.get("role") == "system"), None)
    head = [
        el("h2", "Run ", el("code", _name(rel) or src.path)),
        el("div", el("span", status, class_=f"badge {status}"), " ", " · ".join(totals), class_="summary"),
        el("h3", "Task"),
        el("pre", t.problem_statement, class_="task"),
    ]
    if isinstance(system, str):
        head.append(el("details", el("summary", "system prompt"), el("pre", system)))
    ending = [el("h3", "Ending"), el("p", el("span", status, class_=f"badge {status}"))]
    if t.answer is not None:
        ending.append(el("div", "answer: ", el("pre", t.answer, class_="answer")))
    if t.error:
        ending.append(el("div", "error: ", el("pre", t.error, class_="error")))
    return el(
        "section",
        *head,
        el("h3", "Steps"),
        el("ol", *(step_html(s) for s in t.steps), class_="steps"),
        *ending,
        *(() if src.record and not rel else (el("h3", "Files"), files_html(src, number, rel, links))),
        class_="run",
        id=anchor(number, rel),
    )


# -- a batch ------------------------------------------------------------------------------------------------


def load_results(src: Source) -> list[TaskResult]:
    if not src.is_file(RESULTS):
        return []
    data, _ = src.read(RESULTS, whole=True)
    results = []
    for line in data.splitlines():
        try:
            results.append(TaskResult.model_validate_json(line))
        except ValidationError:
            continue  # a line torn by a crash, as read_results skips it
    return results


def outcome(r: TaskResult) -> str:
    """``infra`` when what the task ran on failed it, ``task`` when the model's work did, ``ok`` otherwise."""
    if r.exit_status in INFRASTRUCTURE:
        return "infra"
    if r.exit_status != "submitted" or (r.expected is not None and r.score <= 0) or r.error:
        return "task"
    return "ok"


_COLUMNS = (
    ("id", False),
    ("domain", False),
    ("status", False),
    ("failure", False),
    ("score", True),
    ("steps", True),
    ("tokens", True),
    ("time", True),
    ("answer", False),
    ("expected", False),
    ("error", False),
)


def _cell(value: object, sort: object = None, **attrs: object) -> Html:
    return el("td", value, data_v=value if sort is None else sort, **attrs)


def batch_rows(src: Source, number: int, results: Sequence[TaskResult], links: Links) -> list[Html]:
    rows = []
    done = set()
    for r in results:
        name = dir_name(r.id)
        done.add(name)
        task_dir = (TASKS + "/" + name).encode()
        target = links.run(number, task_dir) if not links.export else None
        label = el("a", r.id, href=target) if target else text(r.id)
        failure = outcome(r)
        rows.append(
            el(
                "tr",
                _cell(label, r.id),
                _cell(r.domain),
                _cell(r.exit_status, class_=f"st {r.exit_status}"),
                _cell("" if failure == "ok" else failure, failure, class_=f"fail {failure}"),
                _cell(f"{r.score:g}", r.score, class_="num"),
                _cell(r.steps, class_="num"),
                _cell(f"{r.tokens:,}", r.tokens, class_="num"),
                _cell(_seconds(r.wall_seconds), round(r.wall_seconds, 3), class_="num"),
                _cell(_cut(r.answer or "", 120)[0]),
                _cell(_cut(r.expected or "", 120)[0]),
                _cell(_cut(r.error or "", 160)[0], class_="error"),
                data_outcome=failure,
                data_status=r.exit_status,
            )
        )
    for entry, kind in src.listdir(TASKS.encode()):
        if kind != "dir" or os.fsdecode(entry) in done:
            continue
        task = TASKS.encode() + b"/" + entry
        if not src.is_file(task + b"/" + TRAJECTORY.encode()):
            continue
        target = links.run(number, task) if not links.export else None
        label = el("a", task_id(entry), href=target) if target else text(task_id(entry))
        cells = [_cell(label, task_id(entry)), _cell(""), _cell("running", class_="st running")]
        cells += [_cell("", "") for _ in range(len(_COLUMNS) - 3)]
        rows.append(el("tr", *cells, data_outcome="running", data_status="running"))
    return rows


def bars(title: str, items: Sequence[tuple[str, float]], top: float | None = None, unit: str = "") -> Html:
    """A horizontal bar chart: one labelled bar per item, scaled to ``top`` (the largest value if None)."""
    width, row, left = 420, 22, 130
    scale = top or max((v for _, v in items), default=0) or 1
    height = row * len(items) + 30
    shapes: list[Html] = [el("title", title), el("text", title, x=4, y=14, font_size=12, fill="#222")]
    for i, (label, value) in enumerate(items):
        y = 22 + i * row
        length = max(0.0, (width - left - 60) * value / scale)
        shapes += [
            el("text", label[:20], x=left - 6, y=y + 13, font_size=11, text_anchor="end", fill="#333"),
            el("rect", x=left, y=y + 2, width=f"{length:.1f}", height=row - 6, fill="#4a7bd0"),
            el("text", f"{value:g}{unit}", x=f"{left + length + 4:.1f}", y=y + 13, font_size=11, fill="#333"),
        ]
    return el(
        "svg",
        *shapes,
        xmlns="http://www.w3.org/2000/svg",
        width=width,
        height=height,
        view_box=f"0 0 {width} {height}",
        class_="plot",
    )


def histogram(title: str, values: Sequence[float], unit: str = "", bins: int = 10) -> Html:
    """Counts of ``values``: one bar per value when they are few whole numbers (steps), else per one of
    ``bins`` equal ranges, labelled by range."""
    if not values:
        return bars(title, [])
    low, high = min(values), max(values)
    if all(float(v).is_integer() for v in values) and high - low < 2 * bins:
        counts = Counter(int(v) for v in values)
        return bars(title, [(f"{v}{unit}", float(counts[v])) for v in range(int(low), int(high) + 1)])
    step = (high - low) / bins or 1.0
    ranges = Counter(min(bins - 1, int((v - low) / step)) for v in values)
    used = range(bins) if high > low else range(1)
    items = [(f"{low + b * step:.3g}-{low + (b + 1) * step:.3g}{unit}", float(ranges[b])) for b in used]
    return bars(title, items)


def plots(results: Sequence[TaskResult]) -> Html:
    if not results:
        return Html("")
    by_domain: dict[str, list[float]] = {}
    for r in results:
        by_domain.setdefault(r.domain, []).append(r.score)
    scores = sorted((d, round(sum(v) / len(v), 3)) for d, v in by_domain.items())[:30]
    statuses = Counter(r.exit_status for r in results).most_common(12)
    return el(
        "div",
        bars("mean score by domain", scores, top=max(1.0, max(s for _, s in scores))),
        bars("tasks by ending", [(s, float(n)) for s, n in statuses]),
        histogram("tasks by steps", [float(r.steps) for r in results]),
        histogram("tasks by wall time", [r.wall_seconds for r in results], "s"),
        class_="plots",
    )


def batch_live(src: Source, number: int, links: Links) -> Html:
    """The part of a batch's page that changes while it runs: the totals, the plots and the table."""
    results = load_results(src)
    rows = batch_rows(src, number, results, links)
    outcomes = Counter(outcome(r) for r in results)
    running = len(rows) - len(results)
    mean = sum(r.score for r in results) / len(results) if results else 0.0
    totals = (
        f"{len(results)} finished, {running} running · mean score {mean:.3f} · {outcomes['ok']} ok, "
        f"{outcomes['task']} task failures, {outcomes['infra']} infrastructure failures · "
        f"{sum(r.tokens for r in results):,} tokens · {_seconds(sum(r.wall_seconds for r in results))} of tasks"
    )
    header = el("tr", *(el("th", name, data_num="1" if num else None, class_="sortable") for name, num in _COLUMNS))
    return el(
        "div",
        el("p", totals, class_="summary", id="totals"),
        plots(results),
        el("table", el("thead", header), el("tbody", *rows), class_="batch", id="batch"),
    )


def batch_stamp(src: Source) -> str:
    """What changes when a batch records a result or starts a task."""
    return "-".join(map(str, (*src.stamp(RESULTS), *src.stamp(TASKS))))


def batch_html(src: Source, number: int, links: Links) -> Html:
    controls = Html("")
    if not links.export:
        controls = el(
            "div",
            el("input", type="search", id="filter", placeholder="filter rows (any text)", aria_label="filter"),
            el(
                "select",
                *(el("option", label, value=value) for value, label in _SHOW),
                id="outcome",
                aria_label="outcome",
            ),
            class_="controls",
        )
    poll = None if links.export else links.url("/live", s=str(number))
    return el(
        "section",
        el("h2", "Batch ", el("code", src.path)),
        controls,
        el("div", batch_live(src, number, links), id="live", data_poll=poll, data_stamp=batch_stamp(src)),
        class_="batch",
        id=f"source-{number}",
    )


_SHOW = (
    ("", "all outcomes"),
    ("ok", "ok"),
    ("task", "task failures"),
    ("infra", "infrastructure"),
    ("running", "running"),
)


# -- a replay -----------------------------------------------------------------------------------------------


def load_replay(src: Source) -> list[tuple[str, list[StepDiff]]]:
    assert src.record is not None
    data = src.json(src.record)
    try:
        if isinstance(data, list) and all(isinstance(d, dict) and "trajectory" in d for d in data) and data:
            return [(str(d["trajectory"]), [StepDiff.model_validate(s) for s in d["steps"]]) for d in data]
        return [(src.record, [StepDiff.model_validate(s) for s in data])]
    except (ValidationError, TypeError, KeyError):
        raise Unreadable(f"{src.record}: not the output of jailbox replay --json") from None


def sides(diff: str) -> tuple[Html, Html]:
    """A step's unified diff as two columns: what was recorded, and what the replay saw."""
    left, right = [], []
    for line in diff.split("\n"):
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            left.append(el("span", "…", class_="hunk"))
            right.append(el("span", "…", class_="hunk"))
        elif line.startswith("-"):
            left.append(el("span", line[1:], class_="del"))
        elif line.startswith("+"):
            right.append(el("span", line[1:], class_="add"))
        else:
            left.append(text(line[1:]))
            right.append(text(line[1:]))
    return el("pre", Html("\n".join(left)), class_="diff"), el("pre", Html("\n".join(right)), class_="diff")


def _recorded(src: Source, count: int) -> list[str | None]:
    """The recorded observation of each replayed action, from the ``trajectory.json`` beside the replay's JSON
    (``jailbox replay DIR/trajectory.json --json > DIR/replay.json``); None each where there is none."""
    if not src.is_file(TRAJECTORY):
        return [None] * count
    try:
        run = load_run(src, b"", TRAJECTORY)
    except Unreadable:
        return [None] * count
    seen: list[str | None] = [o for step in run.steps for _, o in zip(step.actions, step.observations, strict=False)]
    return seen if len(seen) == count else [None] * count


def _whole(label: str, value: str | None) -> Html:
    return el("details", el("summary", label), observation(value)) if value else Html("")


def replay_html(src: Source, number: int) -> Html:
    parts: list[Html] = [el("h2", "Replay ", el("code", src.path))]
    replays = load_replay(src)
    for trajectory, steps in replays:
        counts = Counter(s.verdict for s in steps)
        parts += [
            el("h3", trajectory),
            el("p", " · ".join(f"{counts[v]} {v}" for v in ("same", "differs", "network", "nondeterministic"))),
        ]
        recorded = _recorded(src, len(steps)) if len(replays) == 1 else [None] * len(steps)
        rows = []
        for s, before in zip(steps, recorded, strict=True):
            left, right = sides(s.diff) if s.diff else (Html(""), Html(""))
            exits = "" if s.exit_recorded == s.exit_now else f"exit {s.exit_recorded} → {s.exit_now}"
            rows.append(
                el(
                    "tr",
                    el("td", str(s.index), class_="num"),
                    el("td", el("pre", s.action, class_="cmd")),
                    el("td", el("span", s.verdict, class_=f"badge {s.verdict}"), el("div", s.cause), el("div", exits)),
                    el("td", left, _whole("recorded observation", before), class_="recorded"),
                    el("td", right, _whole("observation now", s.observation), class_="now"),
                    class_=f"replay {s.verdict}",
                )
            )
        header = el("tr", *(el("th", h) for h in ("step", "action", "verdict", "recorded", "reproduced")))
        parts.append(el("table", el("thead", header), el("tbody", *rows), class_="replay"))
    return el("section", *parts, class_="replay", id=f"source-{number}")


# -- compare ------------------------------------------------------------------------------------------------


def _step_key(step: Step) -> tuple[Any, ...]:
    return (
        tuple((a.function, json.dumps(a.parameters, sort_keys=True)) for a in step.actions),
        tuple(step.observations),
    )


def compare_html(left: tuple[Source, int, bytes], right: tuple[Source, int, bytes], links: Links) -> Html:
    """Two runs step by step: the same step side by side, marked where the calls or what they saw differ."""
    a, b = load_run(left[0], left[2]), load_run(right[0], right[2])
    rows = []
    for i in range(max(len(a.steps), len(b.steps))):
        sa = a.steps[i] if i < len(a.steps) else None
        sb = b.steps[i] if i < len(b.steps) else None
        same = sa is not None and sb is not None and _step_key(sa) == _step_key(sb)
        cells = [el("td", el("ol", step_html(s), class_="steps") if s else "(no step)") for s in (sa, sb)]
        rows.append(el("tr", el("td", str(i + 1), class_="num"), *cells, class_="same" if same else "differs"))
    names = [el("a", f"{src.path} {_name(rel)}", href=links.run(n, rel)) for src, n, rel in (left, right)]
    ends = [f"{t.exit_status} · answer {t.answer!r} · {len(t.steps)} steps" for t in (a, b)]
    header = el("tr", el("th", "step"), *(el("th", n, el("div", e)) for n, e in zip(names, ends, strict=True)))
    alike = sum(1 for r in rows if 'class="same"' in r)
    return el(
        "section",
        el("h2", "Compare"),
        el("p", f"{alike} of {len(rows)} steps alike (same calls, same observations)", class_="summary"),
        el("table", el("thead", header), el("tbody", *rows), class_="compare"),
        class_="compare",
    )


# -- the index, and the page around it all ------------------------------------------------------------------


def runs_of(sources: Sequence[Source]) -> list[tuple[int, bytes, str]]:
    """Every run the sources hold, as (source, directory below it, label), for the compare form."""
    found: list[tuple[int, bytes, str]] = []
    for n, src in enumerate(sources):
        if src.kind == "run":
            found.append((n, b"", src.path))
        elif src.kind == "runs":
            found += [(n, rel, f"{src.path}/{_name(rel)}") for rel in src.runs()]
        elif src.kind == "batch":
            for name, kind in src.listdir(TASKS.encode()):
                if kind == "dir":
                    found.append((n, TASKS.encode() + b"/" + name, f"{src.path}: {task_id(name)}"))
    return found


def runs_html(src: Source, number: int, links: Links) -> Html:
    items = [el("li", el("a", _name(rel), href=links.run(number, rel))) for rel in src.runs()]
    return el(
        "section",
        el("h2", "Runs in ", el("code", src.path)),
        el("ul", *items) if items else el("p", "(no runs here: no directory below holds a trajectory.json)"),
        id=f"source-{number}",
    )


def source_html(src: Source, number: int, links: Links) -> Html:
    if src.kind == "run":
        return run_html(src, number, b"", links)
    if src.kind == "batch":
        return batch_html(src, number, links)
    if src.kind == "replay":
        return replay_html(src, number)
    return runs_html(src, number, links)


def index_html(sources: Sequence[Source], links: Links) -> Html:
    items = [el("li", el("a", src.path, href=links.source(n)), f" ({src.kind})") for n, src in enumerate(sources)]
    runs = runs_of(sources)
    form = Html("")
    if len(runs) >= 2 and not links.export:
        options = [el("option", label, value=f"{n}:{quote_from_bytes(rel, safe='')}") for n, rel, label in runs[:2000]]
        form = el(
            "form",
            el("h3", "Compare two runs"),
            el("select", *options, name="a", aria_label="first run"),
            el("select", *options, name="b", aria_label="second run"),
            el("input", type="hidden", name="token", value=links.token),
            el("button", "compare", type="submit"),
            action="/compare",
            method="get",
        )
    return el("section", el("h2", "Sources"), el("ul", *items), form)


def page(title: str, body: Html, links: Links, css: str = "", css_hash: str = "") -> Html:
    """The whole document: the viewer's stylesheet and script from its own origin (an export inlines the
    stylesheet, allowed by its hash, and has no script)."""
    if links.export:
        policy = f"default-src 'none'; img-src data:; media-src data:; style-src '{css_hash}'"
        head = [
            el("meta", http_equiv="Content-Security-Policy", content=policy),
            el("style", raw(css)),
        ]
    else:
        head = [
            el("link", rel="stylesheet", href=links.url("/static/view.css")),
            el("script", src=links.url("/static/view.js"), defer=True),
        ]
    nav = el("nav", el("a", "jailbox view", href=links.url("/") if not links.export else "#top"), " · ", title)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return Html(
        "<!doctype html>\n"
        + el(
            "html",
            el("head", el("meta", charset="utf-8"), el("title", f"{title} · jailbox view"), *head),
            el("body", nav, el("main", body), el("footer", f"rendered {stamp}"), id="top"),
            lang="en",
        )
    )
