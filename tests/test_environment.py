"""The RL environment: reset from a task, step with tool calls, reward from the scorer."""

from __future__ import annotations

import pytest
from conftest import run_threads

from jailbox.agent.environment import Environment
from jailbox.agent.tasks import Task
from jailbox.sandbox import SandboxPool

TASK = Task(id="e1", query="What is 6*7?", answer="42", scorer="exact", input_files={"/testbed/input/n.txt": "6 7"})


def test_an_episode_from_reset_to_reward():
    with Environment() as env:
        prompt = env.reset(TASK)
        assert "What is 6*7?" in prompt and "/testbed/output" in prompt
        first = env.step("execute_bash", {"command": "cat /testbed/input/n.txt"})
        assert (first.done, first.reward) == (False, 0.0) and "6 7" in first.observation
        bad = env.step("execute_bash", "{not json")
        assert bad.tool.error and not bad.done
        env.step("execute_bash", {"command": "echo 42 > /testbed/output/answer.txt"})
        last = env.step("submit", {})
        assert (last.done, last.reward, last.answer) == (True, 1.0, "42")
        with pytest.raises(RuntimeError, match="reset"):
            env.step("submit", {})
        env.reset(TASK)  # a fresh jail: the old answer is gone
        assert env.step("submit", {}).reward == 0.0


def test_environments_from_threads_on_a_pool(_state_dir):
    with SandboxPool(size=2) as pool:

        def episode(n: int) -> None:
            with Environment(pool=pool) as env:
                env.reset(Task(id=str(n), query="q", answer=str(n), scorer="exact"))
                env.step("execute_bash", {"command": f"echo {n} > /testbed/output/answer.txt"})
                assert env.step("submit").reward == 1.0

        assert run_threads(episode, 8) == []
    assert sorted(p.name for p in (_state_dir / "sandboxes").iterdir()) == []


def test_episodes_start_from_a_snapshot(tmp_path, monkeypatch):
    """A trainer sets the environment up once, keeps it as a snapshot, and runs episodes from it."""
    from jailbox import snapshots
    from jailbox.sandbox import Sandbox, SandboxConfig

    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    with Sandbox() as sb:
        sb.exec("mkdir -p /opt/tool && printf '#!/bin/sh\\necho 42\\n' > /opt/tool/answer && chmod +x /opt/tool/answer")
        snap = sb.snapshot(name="tooled")
    try:
        with Environment(SandboxConfig(snapshot="tooled")) as env:
            for _ in range(2):
                env.reset(TASK)
                env.step("execute_bash", {"command": "/opt/tool/answer > /testbed/output/answer.txt"})
                assert env.step("submit", {}).reward == 1.0
    finally:
        snapshots.remove(snap.id)
