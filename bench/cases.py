"""The timed cases. Each returns a CaseResult; an exception it raises becomes the case's error."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import sandbox
from bench.baselines import TRUE, bwrap_argv, container_runs, failure, spawn_wait
from bench.results import CaseResult, Row, Target, ratio
from bench.settings import Settings
from bench.timing import Summary, Thunk, interleave, rate, timed
from sandbox import Sandbox

THROUGHPUT_TARGET = 1000.0


def exec_true(sb: Sandbox) -> None:
    result = sb.exec(["true"])
    if result.exit_code != 0:
        raise RuntimeError(f"`true` in the jail exited with {result.exit_code}")


def jailbox_one_shot() -> None:
    with Sandbox() as sb:
        exec_true(sb)


def usable_bwrap() -> tuple[list[str] | None, str]:
    """bwrap's argv, or None and why there is no bwrap baseline on this machine."""
    argv = bwrap_argv()
    if argv is None:
        return None, "bwrap not installed"
    reason = failure(argv, 30)
    return (None, f"bwrap unusable: {reason}") if reason else (argv, "")


def one_shot(settings: Settings) -> CaseResult:
    bwrap, missing = usable_bwrap()
    thunks = [timed("jailbox", jailbox_one_shot), timed("posix_spawn", partial(spawn_wait, TRUE))]
    if bwrap is not None:
        thunks.append(timed("bwrap", partial(spawn_wait, bwrap)))
    samples = interleave(settings.one_shot_reps, thunks, settings.warmup)
    jailbox, spawn = Summary.of(samples["jailbox"]), Summary.of(samples["posix_spawn"])
    bwrap_time = Summary.of(samples["bwrap"]) if bwrap is not None else None
    vs_bwrap = ratio(jailbox, bwrap_time)
    rows = [
        Row(
            "one-shot: Sandbox()+exec true+close",
            "ms",
            jailbox,
            "bwrap true",
            bwrap_time,
            Target.check("ratio vs bwrap <= 1.0", None if vs_bwrap is None else vs_bwrap <= 1.0, missing),
            notes=[missing] if missing else [],
        ),
        Row("one-shot: Sandbox()+exec true+close", "ms", jailbox, "posix_spawn true", spawn),
    ]
    if bwrap_time is not None:
        rows.append(Row("one-shot: bwrap true", "ms", bwrap_time, "posix_spawn true", spawn))
    return CaseResult(rows)


def _create_close() -> dict[str, float]:
    start = time.perf_counter_ns()
    sb = Sandbox()
    ready = time.perf_counter_ns()
    sb.close()
    return {"create": (ready - start) / 1e6, "close": (time.perf_counter_ns() - ready) / 1e6}


def _pool_acquire(pool: Any) -> Thunk:
    def run() -> dict[str, float]:
        start = time.perf_counter_ns()
        sb = pool.acquire()
        elapsed = (time.perf_counter_ns() - start) / 1e6
        sb.close()
        return {"pool": elapsed}

    return run


def _pool_row(settings: Settings) -> tuple[Row | None, str]:
    """A warm pool's hand-out time against a cold ``Sandbox()``, or None and why not."""
    pool_class = getattr(sandbox, "SandboxPool", None)
    if pool_class is None:
        return None, "no pool yet"
    try:
        pool = pool_class()
        try:
            samples = interleave(settings.create_reps, [_pool_acquire(pool), _create_close], settings.warmup)
        finally:
            pool.close()
    except Exception as exc:  # the pool's API (acquire, close) is assumed, not yet published
        return None, f"SandboxPool API not recognised: {type(exc).__name__}: {exc}"
    warm = Summary.of(samples["pool"])
    target = Target.check("warm pool create-to-ready < 1 ms", warm.median < 1.0)
    return Row("create-to-ready: warm pool", "ms", warm, "Sandbox() cold", Summary.of(samples["create"]), target), ""


def create_close(settings: Settings) -> CaseResult:
    samples = interleave(settings.create_reps, [_create_close], settings.warmup)
    pool_row, no_pool = _pool_row(settings)
    no_target = None if pool_row is not None else Target.check("warm pool create-to-ready < 1 ms", None, no_pool)
    rows = [
        Row("create-to-ready: Sandbox()", "ms", Summary.of(samples["create"]), target=no_target),
        Row("close()", "ms", Summary.of(samples["close"])),
    ]
    return CaseResult(rows if pool_row is None else [*rows, pool_row])


def exec_round_trip(settings: Settings) -> CaseResult:
    with Sandbox() as sb:
        thunks = [timed("jailbox", partial(exec_true, sb)), timed("posix_spawn", partial(spawn_wait, TRUE))]
        samples = interleave(settings.exec_reps, thunks, settings.warmup)
    jailbox, spawn = Summary.of(samples["jailbox"]), Summary.of(samples["posix_spawn"])
    vs_spawn = ratio(jailbox, spawn)
    target = Target.check("ratio vs posix_spawn <= 2.0", vs_spawn is not None and vs_spawn <= 2.0)
    return CaseResult([Row("exec round trip: sb.exec(['true'])", "ms", jailbox, "posix_spawn true", spawn, target)])


def throughput(settings: Settings) -> CaseResult:
    """N warm sandboxes (each has run one command), one thread each, against N threads spawning
    ``true`` on the host."""
    count, seconds = settings.throughput_sandboxes, settings.throughput_seconds
    boxes: list[Sandbox] = []
    try:
        for _ in range(count):
            boxes.append(Sandbox())
        jail_work = [partial(exec_true, sb) for sb in boxes]
        for work in jail_work:
            work()
        host_work = [partial(spawn_wait, TRUE)] * count
        thunks = [lambda: {"jailbox": rate(jail_work, seconds)}, lambda: {"posix_spawn": rate(host_work, seconds)}]
        samples = interleave(settings.throughput_rounds, thunks)
    finally:
        for sb in boxes:
            sb.close()
    jailbox = Summary.of(samples["jailbox"])
    target = Target.check(f">= {THROUGHPUT_TARGET:g} execs/s", jailbox.median >= THROUGHPUT_TARGET)
    name = f"exec throughput: {count} sandboxes, 1 thread each"
    return CaseResult(
        [Row(name, "execs/s", jailbox, f"posix_spawn, {count} threads", Summary.of(samples["posix_spawn"]), target)]
    )


def containers(settings: Settings) -> CaseResult:
    """Docker or podman one-shots against jailbox's, when a runtime works here."""
    runs, skipped = container_runs(settings.image)
    result = CaseResult(skipped=skipped)
    env = dict(os.environ)
    for name, argv in runs.items():
        thunks = [timed(name, partial(spawn_wait, argv, env, quiet=True)), timed("jailbox", jailbox_one_shot)]
        samples = interleave(settings.container_reps, thunks, settings.warmup)
        row_name = f"one-shot: {name} run --rm --network=none"
        result.rows.append(
            Row(row_name, "ms", Summary.of(samples[name]), "jailbox one-shot", Summary.of(samples["jailbox"]))
        )
    return result
