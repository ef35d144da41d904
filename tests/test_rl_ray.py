"""jailbox behind Ray's sandbox interface (``jailbox.rl.ray_backend``): the backend on its own, then
the actor on a local Ray the test starts (no dashboard, a small object store, its own temp dir) and
tears down, a worker killed under a running command reported as an infrastructure failure with its
jail gone."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import psutil
import pytest
from support.waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.needs("ray"), pytest.mark.xdist_group("ray")]  # one worker


def test_the_backend_implements_rays_interface_over_jails():
    from ray.experimental.sandbox import BaseSandboxBackend, SandboxCreationError, SandboxNotFoundError, SandboxStatus
    from ray.experimental.sandbox.config import SandboxConfig as RayConfig

    from jailbox.agent.outcomes import InfraError
    from jailbox.rl.ray_backend import JailboxBackend, JailboxRuntime, SandboxInfraError

    runtime = JailboxRuntime()
    backend = runtime.backend
    assert isinstance(backend, (JailboxBackend, BaseSandboxBackend))
    sid = runtime.create(image="host", cpu=0.5, memory="256Mi", env={"GREETING": "hi"})
    try:
        assert backend._box(sid).config.limits.memory == 256 << 20
        assert backend._box(sid).config.limits.cpus == 0.5
        assert runtime.exec(sid, "echo $GREETING").stdout == "hi\n"
        bad = runtime.exec(sid, "exit 4")
        assert (bad.exit_code, bad.failure) == (4, "task")
        runtime.write_file(sid, "/opt/a", "1")
        backend.write_file(sid, "/opt/a", "2", append=True)
        assert runtime.read_file(sid, "/opt/a") == b"12"
        assert runtime.get_status(sid) == SandboxStatus.RUNNING
        kids = backend.fork_sandbox(sid, 2)
        assert [runtime.read_file(k, "/opt/a") for k in kids] == [b"12", b"12"]
        for k in kids:
            runtime.delete(k)
        os.kill(backend.init_pid(sid), signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(SandboxInfraError) as caught:
            runtime.exec(sid, "true")
        assert isinstance(caught.value, InfraError)
        assert runtime.get_status(sid) in (SandboxStatus.ERROR, SandboxStatus.TERMINATED)
    finally:
        runtime.delete(sid)
    with pytest.raises(SandboxNotFoundError):
        runtime.exec(sid, "true")
    with pytest.raises(SandboxCreationError, match="network='public'"):
        backend.create_sandbox(RayConfig(image="host", network="public"))


def ray_processes(temp: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])]


@pytest.fixture
def local_ray(_state_dir):
    import ray

    temp = tempfile.mkdtemp(prefix="jbrl-", dir="/tmp")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 << 20,
        log_to_driver=False,
        _temp_dir=temp,
        runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("JAILBOX_")}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        try:
            wait_until(lambda: not ray_processes(temp), "Ray's processes to exit", 60)
        finally:
            shutil.rmtree(temp, ignore_errors=True)


def test_actors_run_jails_and_a_killed_worker_is_an_infra_failure(local_ray):
    from jailbox.rl import RLSandbox
    from jailbox.rl.ray_backend import RaySandbox, create

    actor = create("host", cpu=0.5, memory="256Mi")
    box = RaySandbox(actor, timeout=120)
    assert isinstance(box, RLSandbox)
    box.write_file("/opt/p", "6 7")
    assert box.exec("cat /opt/p").stdout == "6 7"
    assert box.exec("exit 2").failure == "task"
    kids = box.fork(2)
    assert [k.exec("cat /opt/p").stdout for k in kids] == ["6 7", "6 7"]
    for k in kids:
        k.close()
    with pytest.raises(OSError):  # a file the task did not make: the task's, through Ray too
        box.read_file("/opt/absent")
    jail_init = local_ray.get(actor.init_pid.remote())
    worker = local_ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    running = actor.exec.remote("sleep 60")
    time.sleep(0.5)
    os.kill(worker, signal.SIGKILL)
    out = box.exec("true")
    assert (out.failure, out.exit_code) == ("infra", -1), out
    from ray.exceptions import RayActorError

    with pytest.raises(RayActorError):  # the command under way ends with its worker
        local_ray.get(running, timeout=60)
    wait_until(lambda: not psutil.pid_exists(jail_init), "the dead worker's jail to go", 30)
    box.close()  # nothing left to close: no error


def test_two_nodes_one_killed_mid_batch_its_rollouts_retried_as_infra(_state_dir, monkeypatch):
    """Two Ray nodes on this machine (Ray's cluster utilities: a head and a worker node, each its own
    raylet), three rollouts pinned to each by a custom resource. The worker node is killed while its
    rollouts run: they come back as infra failures, their jails go, and the batch finishes by retrying
    them on the head."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from jailbox.rl.ray_backend import RaySandbox, create

    temp = tempfile.mkdtemp(prefix="jbrl2-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp)  # the cluster's files and its address file: not /tmp/ray, shared
    small = {"num_cpus": 1, "object_store_memory": 80 << 20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**small, "resources": {"head": 8}, "include_dashboard": False},
    )
    try:
        worker = cluster.add_node(**small, resources={"w2": 8})
        ray.init(address=cluster.address, log_to_driver=False)
        up = threading.Barrier(7)
        outcomes: dict[int, list[tuple[str, str | None, str]]] = {}
        inits: dict[int, tuple[str, int]] = {}

        def rollout(i: int) -> None:
            place = "w2" if i % 2 else "head"
            tries = outcomes.setdefault(i, [])
            while len(tries) < 2:
                box = RaySandbox(create("host", cpu=0.1, resources={place: 1}), timeout=120)
                try:
                    box.write_file("/opt/n", str(i))
                    if not tries:
                        inits[i] = (place, ray.get(box.actor.init_pid.remote()))
                        up.wait(60)
                    out = box.exec("sleep 4; cat /opt/n")
                finally:
                    box.close()
                tries.append((place, out.failure, out.stdout))
                if out.failure != "infra":
                    return
                place = "head"  # retried on a node still alive

        threads = [threading.Thread(target=rollout, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        up.wait(120)  # every rollout's jail is up, its command about to run
        time.sleep(1)
        started = time.monotonic()
        cluster.remove_node(worker, allow_graceful=False)
        for t in threads:
            t.join(180)
        print(f"batch finished {time.monotonic() - started:.1f} s after the node was killed")
        assert {place for place, _ in inits.values()} == {"head", "w2"}
        for i in range(6):
            if i % 2:  # on the killed node: an infra failure, then the retry's answer
                assert outcomes[i] == [("w2", "infra", ""), ("head", None, str(i))], outcomes[i]
            else:
                assert outcomes[i] == [("head", None, str(i))], outcomes[i]
        dead_jails = [pid for place, pid in inits.values() if place == "w2"]
        wait_until(lambda: not any(psutil.pid_exists(p) for p in dead_jails), "the dead node's jails to go", 30)
    finally:
        ray.shutdown()
        cluster.shutdown()
        try:
            wait_until(lambda: not ray_processes(temp), "Ray's processes to exit", 60)
        finally:
            shutil.rmtree(temp, ignore_errors=True)


def test_a_bench_task_whose_ray_worker_dies_is_worker_lost_not_the_tasks(tmp_path, _state_dir, monkeypatch):
    """``jailbox bench --executor ray``: the Ray worker running one task is killed mid-task; that task's
    result is ``worker_lost`` (infra, never scored), the other task's is its own. Before, the dead
    worker was the task's bare 'error'."""
    import threading

    from support.batch_tasks import responder, tasks_file
    from support.llm_server import ScriptedServer

    from jailbox.agent.batch import Batch, BatchConfig, find_executor
    from jailbox.agent.llm import LLMConfig
    from jailbox.agent.tasks import load_tasks

    temp = tempfile.mkdtemp(prefix="jbrl3-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    results: list = []
    delay = {"t0": 3600.0, "t1": 0.0}  # t0 waits on its model until its worker is killed (or the server closes)
    try:
        with ScriptedServer(responder=responder(delay_for=lambda tid: delay[tid])) as server:
            batch = Batch(
                load_tasks(tasks_file(tmp_path / "tasks.jsonl", 2)),
                LLMConfig(model="m", base_url=server.url, api_key="k"),
                tmp_path / "out",
                BatchConfig(workers=2, task_cpus=0.5),
                executor=find_executor("ray"),
            )
            runner = threading.Thread(target=lambda: results.extend(batch.run()))
            runner.start()

            def t0_worker() -> list[psutil.Process]:  # t1 ends at once; the one left running is t0's
                if not (tmp_path / "out" / "results.jsonl").exists():
                    return []
                return [p for p in psutil.process_iter(["cmdline"]) if "ray::_run" in " ".join(p.info["cmdline"] or [])]

            victims = wait_until(t0_worker, "t0's Ray worker, with t1 recorded", 120)
            for victim in victims:
                victim.kill()
            runner.join(180)
        got = {r.id: (r.exit_status, r.failure, r.score) for r in results}
        assert got == {"t0": ("worker_lost", "infra", 0.0), "t1": ("submitted", None, 1.0)}, got
    finally:
        try:
            wait_until(lambda: not ray_processes(temp), "Ray's processes to exit", 60)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
