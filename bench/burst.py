"""Bursts: many sandboxes asked for at the same instant, one thread each, against the same number of
bubblewrap runs one after another (what a shell loop over ``bwrap`` costs)."""

from __future__ import annotations

import threading
import time
from functools import partial

from bench.baselines import spawn_wait
from bench.cases import exec_true, usable_bwrap
from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary, interleave
from jailbox.sandbox import Sandbox

TARGET_S = 0.5


def _one(start_line: threading.Barrier, times: list[float], failures: list[str]) -> None:
    start_line.wait()
    start = time.perf_counter_ns()
    try:
        with Sandbox() as sb:
            exec_true(sb)
    except Exception as exc:  # a failed sandbox is a result here: counted and named
        failures.append(f"{type(exc).__name__}: {exc}")
        return
    times.append((time.perf_counter_ns() - start) / 1e6)


def jailbox_burst(size: int, times: list[float], failures: list[str]) -> dict[str, float]:
    """``size`` threads released together, each creating a sandbox, running ``true`` and closing it:
    the wall time until the last one is done (seconds), and how many succeeded."""
    start_line = threading.Barrier(size + 1)
    threads = [threading.Thread(target=_one, args=(start_line, times, failures)) for _ in range(size)]
    for thread in threads:
        thread.start()
    done_before = len(times)
    start_line.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return {"burst": time.perf_counter() - start, "succeeded": float(len(times) - done_before)}


def sequential(size: int, argv: list[str]) -> dict[str, float]:
    start = time.perf_counter()
    for _ in range(size):
        spawn_wait(argv)
    return {"bwrap": time.perf_counter() - start}


def burst(settings: Settings) -> CaseResult:
    size = settings.burst_size
    bwrap, missing = usable_bwrap()
    times: list[float] = []
    failures: list[str] = []
    thunks = [partial(jailbox_burst, size, times, failures)]
    if bwrap is not None:
        thunks.append(partial(sequential, size, bwrap))
    samples = interleave(settings.burst_rounds, thunks)
    if not times:
        raise RuntimeError(f"no sandbox of the burst succeeded: {failures[0]}")
    wall = Summary.of(samples["burst"])
    base = Summary.of(samples["bwrap"]) if bwrap is not None else None
    worst = int(min(samples["succeeded"]))
    met = worst == size and wall.median <= TARGET_S
    notes = [f"{worst}/{size} succeeded in the worst round"] + [missing] * bool(missing)
    notes += [f"{len(failures)} failures; first: {failures[0][:200]}"] if failures else []
    extra: dict[str, object] = {"size": size, "succeeded_per_round": samples["succeeded"], "failures": failures[:10]}
    rows = [
        Row(f"burst: {size} sandboxes from {size} threads, create+exec+close, wall", "s", wall,
            f"{size} sequential bwrap runs", base, Target.check(f"<= {TARGET_S:g} s, {size}/{size} succeed", met),
            notes=notes, extra=extra),
        Row("burst: each sandbox's create+exec+close within the burst", "ms", Summary.of(times)),
    ]  # fmt: skip
    return CaseResult(rows)
