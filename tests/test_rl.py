"""``jailbox.rl``: the four-method sandbox trainers call, its factory's cap, snapshots and forks, and
typed outcomes (the task's failure against the infrastructure's) there and in the RL ``Environment``.
Real jails; the infrastructure failure is a jail whose init the host kills."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from jailbox import snapshots
from jailbox.agent.environment import Environment
from jailbox.agent.outcomes import InfraError, of_status
from jailbox.agent.tasks import Task, TaskResult
from jailbox.rl import ExecOutcome, RLSandbox, RolloutSandbox, SandboxFactory
from jailbox.sandbox.errors import SandboxFileError

TASK = Task(id="e1", query="What is 6*7?", answer="42", scorer="exact")


def kill_init(box: RolloutSandbox) -> None:
    os.kill(box.sandbox.init_pid, signal.SIGKILL)


def test_the_four_methods_and_whose_failure_a_command_is():
    factory = SandboxFactory(max_live=2)
    with factory.create() as box:
        assert isinstance(box, RLSandbox)
        box.write_file("/tmp/x.py", "print(6 * 7)\n")
        assert box.read_file("/tmp/x.py") == b"print(6 * 7)\n"
        ok = box.exec(["python3", "/tmp/x.py"])
        assert (ok.exit_code, ok.stdout, ok.failure, ok.ok) == (0, "42\n", None, True)
        wrong = box.exec("echo no >&2; exit 3")
        assert (wrong.exit_code, wrong.stderr, wrong.failure) == (3, "no\n", "task")
        slow = box.exec("sleep 30", timeout=0.5)
        assert slow.timed_out and slow.failure == "task"
        with pytest.raises(SandboxFileError):  # a file the task did not make is the task's
            box.read_file("/tmp/absent")
        with pytest.raises(SandboxFileError):
            box.read_file("/tmp/x.py", max_bytes=4)
    assert factory.live == 0


@pytest.mark.parametrize("call", ["exec", "write_file", "read_file", "snapshot"])
def test_a_dead_jail_is_the_infrastructures_failure(call):
    factory = SandboxFactory(max_live=1)
    box = factory.create()
    box.write_file("/tmp/f", "x")
    kill_init(box)
    time.sleep(0.2)
    if call == "exec":
        out = box.exec("echo hi")
        assert isinstance(out, ExecOutcome)
        assert (out.failure, out.exit_code, out.ok) == ("infra", -1, False) and out.error
    else:
        with pytest.raises(InfraError):
            {
                "write_file": lambda: box.write_file("/tmp/g", "y"),
                "read_file": lambda: box.read_file("/tmp/f"),
                "snapshot": lambda: box.snapshot(),
            }[call]()
    box.close()
    box.close()  # idempotent: the slot is freed once
    assert factory.live == 0
    with factory.create() as again:  # the slot is free again
        assert again.exec("true").ok


def test_the_factory_never_has_more_than_max_live_jails():
    factory = SandboxFactory(max_live=2)
    peak, lock, errors = [0], threading.Lock(), []
    live = [0]

    def rollout() -> None:
        try:
            with factory.create() as box:
                with lock:
                    live[0] += 1
                    peak[0] = max(peak[0], live[0])
                assert box.exec("sleep 0.2").ok
                with lock:
                    live[0] -= 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rollout) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and peak[0] == 2 and factory.live == 0


def test_a_factory_full_past_its_wait_is_an_infra_error_and_bad_counts_name_the_field():
    factory = SandboxFactory(max_live=1, wait=0.3)
    with factory.create():
        with pytest.raises(InfraError, match="no room"):
            factory.create()
    with pytest.raises(ValueError, match="max_live=8"):
        SandboxFactory(max_live=0)
    with factory.create() as parent:
        with pytest.raises(ValueError, match="over max_live=1"):
            factory.fork(parent, 2)
        with pytest.raises(ValueError, match=r"fork\(parent, 4\)"):
            factory.fork(parent, 0)
    assert factory.live == 0


def test_rollouts_fork_from_a_snapshot_and_see_only_their_own_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    factory = SandboxFactory(max_live=4)
    with factory.create() as setup:
        setup.write_file("/opt/prompt.txt", "6 7")
        snap = setup.snapshot()
    try:
        with factory.create(snapshot=snap) as prompt:
            assert prompt.read_file("/opt/prompt.txt") == b"6 7"
            children = factory.fork(prompt, 3)
            assert factory.live == 4
            try:
                for n, child in enumerate(children):
                    child.exec(f"echo {n} > /opt/mine")
                assert [c.read_file("/opt/mine") for c in children] == [b"0\n", b"1\n", b"2\n"]
                assert prompt.exec("test -e /opt/mine").failure == "task"
            finally:
                for child in children:
                    child.close()
        assert factory.live == 0
    finally:
        snapshots.remove(snap)


def test_the_environment_types_its_ends():
    with Environment() as env:
        env.reset(TASK)
        env.step("execute_bash", {"command": "echo 41 > /testbed/output/answer.txt"})
        wrong = env.step("submit", {})
        assert (wrong.done, wrong.reward, wrong.failure) == (True, 0.0, "task")
        env.reset(TASK)
        env.step("execute_bash", {"command": "echo 42 > /testbed/output/answer.txt"})
        assert env.step("submit", {}).failure is None
        env.reset(TASK)
        assert env._sb is not None
        os.kill(env._sb.init_pid, signal.SIGKILL)
        time.sleep(0.2)
        dead = env.step("execute_bash", {"command": "echo 42 > /testbed/output/answer.txt"})
        assert (dead.done, dead.reward, dead.failure) == (True, 0.0, "infra"), dead
        with pytest.raises(RuntimeError, match="reset"):
            env.step("submit", {})


def test_bench_results_say_whose_failure_they_are():
    def result(status: str, score: float) -> TaskResult:
        return TaskResult(id="t", domain="d", mode="sandbox", exit_status=status, score=score)

    assert [result(s, sc).failure for s, sc in [("submitted", 1.0), ("submitted", 0.0), ("max_steps", 0.0)]] == [
        None,
        "task",
        "task",
    ]
    assert {result(s, 0.0).failure for s in ("llm_error", "sandbox_error", "worker_lost")} == {"infra"}
    assert of_status("worker_lost", 1.0) == "infra"  # never a reward from an infrastructure failure
    assert TaskResult.model_validate_json(result("sandbox_error", 0.0).model_dump_json()).failure == "infra"


def test_a_batch_whose_jails_cannot_start_reports_infra_not_a_score_of_zero(tmp_path):
    """bench: a jail that does not start (the batch's rootfs missing) is every task's sandbox_error,
    an infra failure, and the run's one common cause; before, it was the task's bare 'error'."""
    from support.batch_tasks import responder, tasks_file
    from support.llm_server import ScriptedServer

    from jailbox.agent.batch import Batch, BatchConfig
    from jailbox.agent.llm import LLMConfig
    from jailbox.agent.report import common_failure
    from jailbox.agent.tasks import load_tasks
    from jailbox.sandbox import SandboxConfig

    with ScriptedServer(responder=responder()) as server:
        results = Batch(
            load_tasks(tasks_file(tmp_path / "tasks.jsonl", 3)),
            LLMConfig(model="m", base_url=server.url, api_key="k"),
            tmp_path / "out",
            BatchConfig(workers=2),
            sandbox=SandboxConfig(rootfs=str(tmp_path / "missing")),
        ).run()
    assert [(r.exit_status, r.failure, r.score) for r in results] == [("sandbox_error", "infra", 0.0)] * 3
    assert (common_failure(results) or "").startswith("sandbox_error: RootfsNotFound")
