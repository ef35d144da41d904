"""One task end to end: a fresh jail with the task's input, the loop, the outputs on the host.

The output directory gets the jail's output directory (``answer.txt`` and any files) next to
``trajectory.json``, as the reference package lays it out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..sandbox import Mount, Sandbox, SandboxConfig
from ..sandbox.errors import SandboxError
from .llm import LLMClient, LLMConfig
from .loop import Agent, AgentConfig, ChatModel
from .prompts import PromptConfig
from .trajectory import Step, Trajectory


def prepare(sb: Sandbox, prompts: PromptConfig, input_files: dict[str, str] | None = None) -> None:
    """The directories the prompts promise, and a task's input files (inline text, or ``@host path``)."""
    sb.exec(["mkdir", "-p", prompts.output_dir, prompts.input_dir])
    for path, content in (input_files or {}).items():
        if content.startswith("@"):
            sb.put(content[1:], path)
        else:
            sb.write_file(path, content)


def run_in(
    sb: Sandbox,
    client: ChatModel,
    problem: str,
    trajectory_path: Path,
    output_dir: Path,
    prompts: PromptConfig,
    agent: AgentConfig | None = None,
    on_step: Callable[[Step], None] | None = None,
    describe: dict[str, Any] | None = None,
) -> Trajectory:
    """The loop in a prepared jail, then the jail's output directory copied to ``output_dir``."""
    trajectory = Agent(client, sb, prompts, agent, trajectory_path, on_step, describe).run(problem)
    try:
        sb.get(prompts.output_dir, output_dir)
    except SandboxError as exc:
        trajectory.error = trajectory.error or f"copying {prompts.output_dir} out failed: {exc}"
        trajectory.save(trajectory_path)
    return trajectory


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
    describe = {
        "llm": llm.model_dump(mode="json", exclude={"api_key"}),
        "sandbox": config.model_dump(mode="json"),
        "input_dir": None if input_dir is None else str(input_dir),
    }
    with Sandbox(config) as sb, LLMClient(llm) as client:
        prepare(sb, prompts)
        return run_in(
            sb, client, problem, output_dir / "trajectory.json", output_dir, prompts, agent, on_step, describe
        )
