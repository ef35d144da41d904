"""One task end to end: a fresh jail with the task's input, the loop, the outputs on the host.

Runs in the host process that drives the agent. The host directory a run records into is the host's
alone: the jail never sees it (its own output directory is in its writable layer), and after the loop the
host writes there ``trajectory.json`` (jailbox's record), ``trajectory.reference.json`` (the same run in the
reference package's format), ``answer.txt`` (read through the jail's file API, at most ``ANSWER_LIMIT`` bytes)
and only the jail's outputs the user asked for (``copy_out``), every name through ``hostfs.Destination`` so a
link left there by anyone is replaced, never followed. ``jailbox run`` gives each run a directory of its own
(``fresh_dir``: ``OUTPUT_DIR/YYYYMMDD_HHMMSS``, the reference's naming) with the answer and copies in ``files/``,
so nothing an earlier run left is mistaken for this one's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..sandbox import Sandbox, SandboxConfig, hostfs
from ..sandbox.errors import SandboxError
from . import inputs
from .llm import LLMClient, LLMConfig, Retry
from .loop import Agent, AgentConfig, ChatModel
from .prompts import PromptConfig
from .tasks import Task
from .trajectory import Step, Trajectory

TRAJECTORY = "trajectory.json"
REFERENCE_TRAJECTORY = "trajectory.reference.json"
ANSWER = "answer.txt"
FILES = "files"
"""Where ``jailbox run`` puts the answer and the ``copy_out`` paths in a run's directory, as the reference does."""


def fresh_dir(parent: Path) -> Path:
    """A new directory for one run beneath ``parent`` (made if missing; the user's choice, opened as given),
    named by the local time as the reference names it (``20260101_120000``), with ``_2``, ``_3``... after it
    when that name is taken; made with ``mkdir``, so nothing there before (a link included) is reused.
    ValueError, naming ``parent``, if none can be made."""
    stamp = time.strftime("%Y%m%d_%H%M%S")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"{str(parent)!r}: {exc.strerror}; name a directory this user may write") from None
    try:
        for n in range(1, 1000):
            name = stamp if n == 1 else f"{stamp}_{n}"
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ValueError(f"{str(parent)!r}: {exc.strerror}; name a directory this user may write") from None
            return parent / name
    finally:
        os.close(fd)
    raise ValueError(f"{str(parent)!r} holds 999 runs started at {stamp}; name another directory")


def prepare(sb: Sandbox, prompts: PromptConfig, task: Task | None = None, inputs_root: Path | None = None) -> None:
    """The directories the prompts promise, and a task's input files: inline text, or ``@path`` beneath
    ``inputs_root`` (opened here, where the task runs, without following a symlink; see ``inputs``)."""
    sb.exec(["mkdir", "-p", prompts.output_dir, prompts.input_dir])
    if task is None:
        return
    for path, content in task.input_paths(prompts.input_dir).items():
        if not content.startswith(inputs.PREFIX):
            sb.write_file(path, content)
            continue
        fd = inputs.open_beneath(inputs_root, task.id, path, content)
        try:
            sb.put(f"/proc/self/fd/{fd}", path)  # the very file walked to, not a path resolved again
        finally:
            os.close(fd)


def check_copy_out(rel: str) -> str:
    """``rel`` if it names something in the jail's output directory that may be copied beside the answer."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or not parts or any(p == ".." or "\0" in p for p in parts):
        raise ValueError(f"copy-out {rel!r}: name a path relative to the jail's output directory, without '..'")
    if parts[0] in (TRAJECTORY, REFERENCE_TRAJECTORY, ANSWER):
        raise ValueError(f"copy-out {rel!r}: {parts[0]} is the host's own record")
    return "/".join(parts)


def run_in(
    sb: Sandbox,
    client: ChatModel,
    problem: str,
    directory: Path,
    prompts: PromptConfig,
    agent: AgentConfig | None = None,
    on_step: Callable[[Step], None] | None = None,
    describe: dict[str, Any] | None = None,
    outputs: str | None = None,
    copy_out: Sequence[str] = (),
) -> Trajectory:
    """The loop in a prepared jail, recorded in ``directory/trajectory.json`` and, once it ends, in the
    reference's format in ``directory/trajectory.reference.json``; then ``answer.txt`` and each ``copy_out``
    path of the jail's output directory copied into ``directory`` (into ``directory/outputs`` if given). A
    stale ``answer.txt`` from an earlier run is removed when this run leaves none."""
    trajectory_path = directory / TRAJECTORY
    runner = Agent(client, sb, prompts, agent, trajectory_path, on_step, describe)
    trajectory = runner.run(problem)
    trajectory.save_reference(directory / REFERENCE_TRAJECTORY)
    prefix = [] if outputs is None else [outputs]
    try:
        with hostfs.Destination(directory) as out:
            if outputs is not None:
                out.mkdir(outputs, 0o755)
            answer = "/".join([*prefix, ANSWER])
            if runner.answer_file is None:
                out.unlink(answer)
            else:
                out.write(answer, runner.answer_file)
            for rel in map(check_copy_out, copy_out):
                parts = [*prefix, *rel.split("/")]
                for depth in range(len(prefix) + 1, len(parts)):
                    out.mkdir("/".join(parts[:depth]), 0o755)
                out.unlink("/".join(parts))  # Sandbox.get opens its destination as given: no link may be there
                sb.get(f"{prompts.output_dir}/{rel}", directory.joinpath(*parts))
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
    copy_out: Sequence[str] = (),
    on_retry: Callable[[Retry], None] | None = None,
    outputs: str | None = None,
) -> Trajectory:
    """``problem`` in a fresh jail, recorded in ``output_dir`` (the answer and copies in ``output_dir/outputs``
    if given); ``input_dir`` is copied to the prompts' input directory, writable (``inputs.copy_dir``, bounded);
    ``on_retry`` hears each request sent again and why (the CLI's status line)."""
    prompts = prompts or PromptConfig()
    copy_out = [check_copy_out(rel) for rel in copy_out]
    output_dir.mkdir(parents=True, exist_ok=True)
    config = sandbox or SandboxConfig()
    describe = {
        "llm": llm.model_dump(mode="json", exclude={"api_key"}),
        "sandbox": config.model_dump(mode="json"),
        "input_dir": None if input_dir is None else str(input_dir),
    }
    with Sandbox(config) as sb, LLMClient(llm, on_retry=on_retry) as client:
        prepare(sb, prompts)
        if input_dir is not None:
            inputs.copy_dir(sb, input_dir, prompts.input_dir)
        return run_in(sb, client, problem, output_dir, prompts, agent, on_step, describe, outputs, copy_out)
