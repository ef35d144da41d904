"""Rollouts through Ray (``jailbox.rl.ray_backend``) against the same on this machine (``jailbox.rl``).

A rollout is a fresh jail, one short command (``true``) and the jail's end. Locally: ``workers`` threads
over one ``SandboxFactory`` capped at ``workers``. Through Ray: ``workers`` warm ``JailboxSandbox`` actors
on a local cluster started here (no dashboard, 80 MiB object store, its own temp dir, shut down after),
each running its share of the rollouts one after another through its ``JailboxRuntime`` (create, exec,
delete); the driver waits for all. Rows: per-rollout time (measured where the rollout runs) and the
batch's wall, Ray against local; target: Ray adds at most 20% to the wall.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
import time
from typing import Any

from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary
from jailbox.rl import SandboxFactory

COMMAND = ["true"]


def _local(count: int, workers: int) -> tuple[list[float], float]:
    factory = SandboxFactory(max_live=workers)

    def one(_: int) -> float:
        started = time.perf_counter()
        with factory.create() as box:
            if not box.exec(COMMAND).ok:
                raise RuntimeError("a local rollout's `true` failed")
        return (time.perf_counter() - started) * 1000

    one(0)  # warm, as Ray's actors are: the launcher up, the host's files cached
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        times = list(pool.map(one, range(count)))
    return times, (time.perf_counter() - started) * 1000


def _in_actor(actor: Any, count: int) -> list[float]:
    """Runs in a JailboxSandbox actor: ``count`` rollouts through its runtime, each one's milliseconds."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        sid = actor.runtime.create(image="host")
        try:
            if actor.runtime.exec(sid, COMMAND).exit_code != 0:
                raise RuntimeError("a Ray rollout's `true` failed")
        finally:
            actor.runtime.delete(sid)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _ray(count: int, workers: int) -> tuple[list[float], float]:
    import ray

    from jailbox.rl.ray_backend import create

    temp = tempfile.mkdtemp(prefix="jbbench-", dir="/tmp")
    ray.init(
        num_cpus=workers,
        include_dashboard=False,
        object_store_memory=80 << 20,
        log_to_driver=False,
        _temp_dir=temp,
    )
    try:
        actors = [create("host", cpu=1) for _ in range(workers)]
        ray.get([a.get_instance_id.remote() for a in actors])  # warm: each actor's worker and first jail up
        shares = [count // workers + (i < count % workers) for i in range(workers)]
        started = time.perf_counter()
        done = ray.get([a.__ray_call__.remote(_in_actor, n) for a, n in zip(actors, shares, strict=True)])
        wall = (time.perf_counter() - started) * 1000
        for a in actors:
            ray.get(a.close.remote())
            ray.kill(a)
        return [t for ts in done for t in ts], wall
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def ray_rollouts(settings: Settings) -> CaseResult:
    try:
        import ray  # noqa: F401
    except ImportError:
        return CaseResult(skipped=["Ray is not installed (pip install 'jailbox[ray]')"])
    count, workers = settings.rollouts, settings.rollout_workers
    local_times, local_wall = _local(count, workers)
    ray_times, ray_wall = _ray(count, workers)
    wall, base = Summary.of([ray_wall]), Summary.of([local_wall])
    over = ray_wall / local_wall if local_wall else None
    target = Target.check("Ray's wall <= 1.2x local", over is not None and over <= 1.2)
    return CaseResult(
        [
            Row(
                f"rollout: fresh jail + true, {workers} at once, Ray",
                "ms",
                Summary.of(ray_times),
                "local threads",
                Summary.of(local_times),
            ),
            Row(f"wall: {count} rollouts through Ray", "ms", wall, f"{count} local", base, target),
        ]
    )
