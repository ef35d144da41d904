"""The timed cases. Each returns a CaseResult; an exception it raises becomes the case's error."""

from __future__ import annotations

import os
import time
from functools import partial

from bench.baselines import TRUE, bwrap_argv, container_runs, failure, spawn_wait
from bench.results import CaseResult, Row, Target, ratio
from bench.settings import Settings
from bench.timing import Summary, Thunk, interleave, rate, timed
from jailbox.sandbox import Limits, Sandbox, SandboxPool

THROUGHPUT_TARGET = 1000.0
PAUSE_TARGET_MS = 5.0  # issue 39: pause() and resume() together


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


def _pool_acquire(pool: SandboxPool) -> Thunk:
    """Hand-out time of a warm pool, then ``reset()`` of the pooled sandbox (a pre-built swap)."""

    def run() -> dict[str, float]:
        pool.wait_ready(60)
        start = time.perf_counter_ns()
        sb = pool.acquire()
        acquired = time.perf_counter_ns()
        exec_true(sb)
        pool.wait_ready(60)
        reset_start = time.perf_counter_ns()
        sb.reset()
        reset_end = time.perf_counter_ns()
        sb.close()
        return {"pool": (acquired - start) / 1e6, "reset": (reset_end - reset_start) / 1e6}

    return run


def _cold_reset() -> dict[str, float]:
    with Sandbox() as sb:
        exec_true(sb)
        start = time.perf_counter_ns()
        sb.reset()
        return {"cold reset": (time.perf_counter_ns() - start) / 1e6}


def _pool_rows(settings: Settings, create: Summary) -> list[Row]:
    """A warm pool's hand-out and reset times against a cold ``Sandbox()`` and a pool-less reset."""
    with SandboxPool(size=2) as pool:
        samples = interleave(settings.create_reps, [_pool_acquire(pool), _cold_reset], settings.warmup)
    warm, reset, cold_reset = (Summary.of(samples[k]) for k in ("pool", "reset", "cold reset"))
    return [
        Row("create-to-ready: warm pool acquire()", "ms", warm, "Sandbox() cold", create,
            Target.check("warm pool create-to-ready < 1 ms", warm.median < 1.0)),
        Row("reset(): pooled sandbox", "ms", reset, "reset() without a pool", cold_reset,
            Target.check("reset() < 5 ms", reset.median < 5.0)),
    ]  # fmt: skip


def create_close(settings: Settings) -> CaseResult:
    samples = interleave(settings.create_reps, [_create_close], settings.warmup)
    create = Summary.of(samples["create"])
    rows = [Row("create-to-ready: Sandbox()", "ms", create), Row("close()", "ms", Summary.of(samples["close"]))]
    return CaseResult([*rows, *_pool_rows(settings, create)])


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


ALLOW = "allow:pypi"
ALLOW_OVER_NONE_MS = 2.0


def _create_with(network: str) -> Thunk:
    def run() -> dict[str, float]:
        start = time.perf_counter_ns()
        sb = Sandbox(network=network)
        ready = time.perf_counter_ns()
        sb.close()
        return {network: (ready - start) / 1e6}

    return run


def network_create(settings: Settings) -> CaseResult:
    """What the filtering proxy's network mode adds to a cold create, against no network at all."""
    samples = interleave(settings.network_reps, [_create_with(ALLOW), _create_with("none")], settings.warmup)
    allow, none = Summary.of(samples[ALLOW]), Summary.of(samples["none"])
    over = allow.median - none.median
    target = Target.check(f"<= {ALLOW_OVER_NONE_MS:g} ms over none", over <= ALLOW_OVER_NONE_MS)
    row = Row(f"create-to-ready: network={ALLOW}", "ms", allow, "network=none", none, target,
              notes=[f"network={ALLOW} costs {over:.2f} ms over none (p50)"])  # fmt: skip
    return CaseResult([row])


def _pause_resume(sb: Sandbox) -> None:
    sb.pause()
    sb.resume()


def pause_resume(settings: Settings) -> CaseResult:
    """``pause()`` then ``resume()`` of a sandbox running a background process, each way this host
    pauses one (the default limits make a cgroup where cgroups are usable; without a memory or pids
    limit there is none on cgroup v1), against an exec round trip in the same sandbox."""
    rows = []
    for limits in (Limits(), Limits(memory=None, pids=None)):
        with Sandbox(limits=limits) as sb:
            sb.exec("sleep 100000 >/dev/null 2>&1 &")
            way = sb._jail.pausing.way
            thunks = [timed("pause", partial(_pause_resume, sb)), timed("exec", partial(exec_true, sb))]
            samples = interleave(settings.pause_reps, thunks, settings.warmup)
        both, exec_time = Summary.of(samples["pause"]), Summary.of(samples["exec"])
        target = Target.check(f"<= {PAUSE_TARGET_MS:g} ms together", both.median <= PAUSE_TARGET_MS)
        name = f"pause()+resume(): {way}"
        if all(row.name != name for row in rows):
            rows.append(Row(name, "ms", both, "sb.exec(['true']) in the same sandbox", exec_time, target))
    return CaseResult(rows)
