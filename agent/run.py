"""One task end to end: a fresh jail with the task's input, the loop, the outputs on the host.

The output directory gets the jail's output directory (``answer.txt`` and any files) next to
``trajectory.json``, as the reference package lays it out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.llm import LLMClient, LLMConfig
from agent.loop import Agent, AgentConfig
from agent.prompts import PromptConfig
from agent.trajectory import Step, Trajectory
from sandbox import Mount, Sandbox, SandboxConfig
from sandbox.errors import SandboxError


def run_task(
    problem: str,
    llm: LLMConfig,
    output_dir: Path,
    *,
    input_dir: Path | None = None,
    prompts: PromptConfig | None = None,
    agent: AgentConfig | None = None,
    sandbox: SandboxConfig | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> Trajectory:
    prompts = prompts or PromptConfig()
    output_dir.mkdir(parents=True, exist_ok=True)
    config = sandbox or SandboxConfig()
    if input_dir is not None:
        mounts = [*config.mounts, Mount(input_dir, prompts.input_dir, readonly=True)]
        config = SandboxConfig.model_validate({**config.model_dump(), "mounts": mounts})
    with Sandbox(config) as sb, LLMClient(llm) as client:
        sb.exec(["mkdir", "-p", prompts.output_dir, prompts.input_dir])
        describe = {
            "llm": llm.model_dump(mode="json", exclude={"api_key"}),
            "sandbox": config.model_dump(mode="json"),
            "input_dir": None if input_dir is None else str(input_dir),
        }
        loop = Agent(client, sb, prompts, agent, output_dir / "trajectory.json", on_step, describe)
        trajectory = loop.run(problem)
        try:
            sb.get(prompts.output_dir, output_dir)
        except SandboxError as exc:
            trajectory.error = trajectory.error or f"copying {prompts.output_dir} out failed: {exc}"
            trajectory.save(output_dir / "trajectory.json")
    return trajectory
