"""The cold path step by step (issue 45): a fresh ``Sandbox()`` + ``exec(["true"])`` + ``close()``
cut into the jail's build steps, each timed on the host around the method that runs it, and
``close()`` into the undo steps those registered (each callback, timed as it runs at the close);
with and without a cgroup (root's default limits make one; rootless v1 has none either way).

The steps are read from ``Jail._build`` itself (every ``self._step(...)`` call it makes, in order),
so the table follows the code: a step added there is timed here without a change. The jail's own
side (its init's mounts, the zygote's forks) is inside ``_create`` and ``_await_ready``, which
wait on it. Each row's baseline is a whole ``bwrap true`` of the same run: a step that alone takes
longer than bubblewrap's whole jail is where the cold path loses to it."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.baselines import spawn_wait
from bench.cases import usable_bwrap
from bench.results import CaseResult, Row
from bench.settings import Settings
from bench.timing import Summary
from jailbox.sandbox import Limits, Sandbox
from jailbox.sandbox.jail import Jail

WAYS = {"cgroup": Limits(), "no cgroup": Limits(memory=None, pids=None)}


def steps() -> list[str]:
    """The methods ``Jail._build`` calls on ``self``, in the order it calls them."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Jail._build)))
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr.startswith("_")
            and node.func.attr not in found
        ):
            found.append(node.func.attr)
    return sorted(found, key=lambda name: _line(tree, name))


def _line(tree: ast.AST, name: str) -> int:
    return min(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == name)


class _Closing:
    """Whether the sandbox is being closed now: undo callbacks run then are ``close()``'s steps."""

    now = False


@contextmanager
def _clocked(names: list[str], into: dict[str, float]) -> Iterator[None]:
    """Each of ``Jail``'s methods ``names``, and ``Jail.__init__`` whole, timed into ``into`` (ms)
    while inside, and every undo callback registered meanwhile as it runs during a close ("close:"
    and its function's name); ``Jail`` and ``ExitStack`` are as they were after."""
    saved = {name: getattr(Jail, name) for name in [*names, "__init__"]}
    register = contextlib.ExitStack.callback

    def callback(stack: contextlib.ExitStack, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        label = "close: " + getattr(getattr(fn, "func", fn), "__qualname__", type(fn).__name__)

        def run() -> None:
            start = time.perf_counter_ns()
            try:
                fn(*args, **kwargs)
            finally:
                if _Closing.now:
                    into[label] = into.get(label, 0.0) + (time.perf_counter_ns() - start) / 1e6

        return register(stack, run)

    def clock(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                into[name] = into.get(name, 0.0) + (time.perf_counter_ns() - start) / 1e6

        return run

    try:
        for name, method in saved.items():
            setattr(Jail, name, clock(name, method))
        contextlib.ExitStack.callback = callback  # type: ignore[assignment,method-assign]
        yield
    finally:
        contextlib.ExitStack.callback = register  # type: ignore[method-assign]
        for name, method in saved.items():
            setattr(Jail, name, method)


def _one(names: list[str], limits: Limits) -> dict[str, float]:
    into: dict[str, float] = {}
    with _clocked(names, into):
        start = time.perf_counter_ns()
        sb = Sandbox(limits=limits)
        made = time.perf_counter_ns()
        try:
            if sb.exec(["true"]).exit_code != 0:
                raise RuntimeError("`true` in the jail failed")
            ran = time.perf_counter_ns()
        finally:
            _Closing.now = True
            try:
                sb.close()
            finally:
                _Closing.now = False
        done = time.perf_counter_ns()
    out = {name: into.get(name, 0.0) for name in names}
    out["Jail(): the rest"] = into["__init__"] - sum(out.values())
    out["Sandbox(): around the jail"] = (made - start) / 1e6 - into["__init__"]
    out["exec(['true'])"] = (ran - made) / 1e6
    out["close()"] = (done - ran) / 1e6
    out.update((label, ms) for label, ms in into.items() if label.startswith("close: "))
    out["whole"] = (done - start) / 1e6
    return out


def cold_steps(settings: Settings) -> CaseResult:
    names = steps()
    bwrap, missing = usable_bwrap()
    samples: dict[str, dict[str, list[float]]] = {way: {} for way in WAYS}
    base: list[float] = []
    for i in range(settings.warmup + settings.one_shot_reps):
        for way, limits in WAYS.items():
            for name, value in _one(names, limits).items():
                if i >= settings.warmup:
                    samples[way].setdefault(name, []).append(value)
        if bwrap is not None:
            start = time.perf_counter_ns()
            spawn_wait(bwrap)
            if i >= settings.warmup:
                base.append((time.perf_counter_ns() - start) / 1e6)
    baseline = Summary.of(base) if base else None
    rows = [
        Row(f"cold step [{way}]: {name}", "ms", Summary.of(values), "bwrap true, whole" if baseline else "",
            baseline, notes=[missing] if missing else [])
        for way, table in samples.items()
        for name, values in table.items()
    ]  # fmt: skip
    return CaseResult(rows)
