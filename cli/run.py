"""``jailbox run``: one agent run in a fresh sandbox, with the reference package's flags.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import sys
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..agent.llm import Retry
    from ..agent.trajectory import Trajectory


from .app import main
from .errors import _fed_by, _flag_error, _read_text
from .options import SETTINGS_HELP
from .rootfs import _progress
from .run_options import (
    _agent_options,
    _files_options,
    _llm_fields,
    _model_options,
    _run_jail_options,
    _run_settings,
    _sandbox_fields,
)


def llm_advice(error: str, url: str) -> str:
    """What to do about an LLM error, from its text (the trajectory's ``error``, or a result's)."""
    if "max_reply_bytes" in error:
        return "the reply was larger than --llm-max-reply allows: raise it (--llm-max-reply 64M) for a server you trust"
    if "timeout.total" in error:
        return "the reply took longer than --llm-timeout allows: raise it (--llm-timeout 3600) for a server you trust"
    if "HTTP 401" in error or "HTTP 403" in error:
        return "the endpoint refused the key: check --api-key (or $OPENAI_API_KEY)"
    if "HTTP 404" in error:
        return f"is {url} the API's base (it usually ends in /v1), and does it serve --llm-name?"
    if "HTTP 5" in error or "HTTP 429" in error:
        return f"the server at {url} kept failing: see its log, or retry later"
    if "Connect" in error or "Timeout" in error:  # httpx's ConnectError, ConnectTimeout, ReadTimeout
        return f"is a server listening on {url}? (start one, or point --llm-base-url at it)"
    return f"see the trajectory's error, and the server at {url}"


def _trim(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[: limit // 2]}\n[...]\n{text[-limit // 2 :]}"


@main.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--query", "--problem", required=True, help="The task (text, or @FILE to read it from a file).")
@_model_options
@click.option("--settings", type=click.Path(exists=True, dir_okay=False), default=None, help=SETTINGS_HELP)
@click.option("--prompt-config", "--prompt_config", type=click.Path(exists=True, dir_okay=False), default=None)
@_agent_options
@_files_options
@_run_jail_options
@click.option(
    "--save-litellm-response",
    "--save_litellm_response",
    is_flag=True,
    help="Accepted for the reference's command lines; trajectory.json already holds every reply.",
)
@click.option("--quiet", is_flag=True, help="No per-step output.")
@click.option("--json", "as_json", is_flag=True, help="Print the final result as JSON.")
def run_cmd(
    query: str,
    model: dict[str, Any],
    settings: str | None,
    prompt_config: str | None,
    agent: dict[str, Any],
    files: dict[str, Any],
    jail: dict[str, Any],
    save_litellm_response: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Give a model a fresh sandbox and let it work on QUERY until it submits.

    \b
    Example:
      jailbox run --query "What is the 100th prime?" --llm-name qwen3 \\
                  --llm-base-url http://localhost:8000/v1 --output-dir ./out
    """
    from ..agent import prompts as prompt_configs
    from ..agent.inputs import InputDirError
    from ..agent.llm import LLMConfig
    from ..agent.loop import AgentConfig
    from ..agent.run import FILES, check_copy_out, fresh_dir, run_task
    from ..sandbox import SandboxConfig

    with _fed_by("--query"):
        if query.startswith("@"):
            query = _read_text(query[1:])
    docker_image = jail.pop("docker_image")
    if jail["rootfs"] is not None and docker_image is not None:
        raise click.UsageError("--rootfs and --docker_image both name the filesystem: give one, e.g. --rootfs host")
    defaults = _run_settings(settings)
    model.update({key: model[key] or defaults.get(key) for key in ("llm_name", "llm_base_url", "api_key")})
    prompt_config = prompt_config or defaults.get("prompt_config")
    if not model["llm_name"]:
        raise click.UsageError("--llm_name is required (or llm_name in --settings), e.g. --llm_name openai/gpt-4o")
    if save_litellm_response and not quiet and not as_json:
        click.echo("jailbox: --save_litellm_response: every request and reply is in trajectory.json already", err=True)
    llm_fields, sandbox_fields = _llm_fields(**model), _sandbox_fields(**jail)
    with _fed_by():
        llm = LLMConfig(**llm_fields)
        sandbox = SandboxConfig(**sandbox_fields)
        agent_config = AgentConfig(**agent)
    with _fed_by("--prompt-config"):
        prompts = prompt_configs.load(prompt_config)
    with _fed_by("--copy-out"):
        copy_out = tuple(check_copy_out(rel) for rel in files["copy_out"])
    if docker_image is not None:
        sandbox = sandbox.model_copy(update={"rootfs": _docker_image(docker_image, quiet or as_json)})

    from pathlib import Path

    with _fed_by("--output-dir"):
        run_dir = fresh_dir(Path(files["output_dir"]))
    if not quiet and not as_json:
        click.echo(f"Recording into {run_dir} (rootfs {sandbox.rootfs}, network {jail['network']})", err=True)
    show, retrying = _printers(agent["max_steps"])
    try:
        trajectory = run_task(
            query,
            llm,
            run_dir,
            input_dir=Path(files["input_dir"]) if files["input_dir"] else None,
            prompts=prompts,
            agent=agent_config,
            sandbox=sandbox,
            on_step=None if quiet or as_json else show,
            copy_out=copy_out,
            on_retry=None if quiet else retrying,
            outputs=FILES,
        )
    except InputDirError as exc:
        _drop_if_empty(run_dir)
        _flag_error("--input-dir", str(exc))
    except SandboxError as exc:
        _drop_if_empty(run_dir)
        hint = " (or --network none: run's default is full)" if str(exc).startswith("network 'full'") else ""
        click.echo(printable(f"jailbox: {exc}{hint}"), err=True)
        sys.exit(125)
    _report(trajectory, run_dir, llm.base_url, as_json)


def _printers(max_steps: int) -> tuple[Callable[[Any], None], Callable[[Retry], None]]:
    """What a run prints as it goes: each step (its reasoning, actions and observations, then a status line),
    and each failed model request about to be sent again (on stderr)."""
    import json

    started, tokens, steps = time.monotonic(), [0], []

    def show(step: Any) -> None:
        steps.append(step.index)
        tokens[0] += step.prompt_tokens + step.completion_tokens
        if step.reasoning:
            click.echo(click.style(printable(_trim(step.reasoning, 400)), dim=True))
        for action, observation in zip(step.actions, step.observations, strict=False):
            line = f"> {action.function} {_trim(json.dumps(action.parameters), 300)}"
            click.echo(click.style(printable(line), fg="cyan"))
            click.echo(printable(_trim(observation)))
        if step.note:
            click.echo(click.style(printable(step.note), fg="yellow"))
        status = f"[step {step.index}/{max_steps} | {tokens[0]} tokens | {time.monotonic() - started:.0f}s]"
        click.echo(click.style(status, bold=True))

    def retrying(retry: Retry) -> None:
        again = (
            f"retry {retry.attempt}/{retry.retries} in {retry.seconds:.1f}s{' (Retry-After)' if retry.hinted else ''}"
            if retry.backoff
            else "asking again now"
        )
        status = (
            f"[LLM request failed: {retry.cause} | {again} | step {len(steps) + 1}/{max_steps} | "
            f"{time.monotonic() - started:.0f}s]"
        )
        click.echo(click.style(printable(status), fg="yellow", bold=True), err=True)

    return show, retrying


def _report(trajectory: Trajectory, run_dir: Path, base_url: str, as_json: bool) -> NoReturn:
    """The run's outcome (JSON with --json), advice on stderr when the model's endpoint failed it, and its exit
    status: 0 when the agent submitted, else 1."""
    import json

    summary = {
        "exit_status": trajectory.exit_status,
        "answer": trajectory.answer,
        "steps": len(trajectory.steps),
        "tokens": trajectory.prompt_tokens + trajectory.completion_tokens,
        "error": trajectory.error,
        "output_dir": str(run_dir.resolve()),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            printable(
                f"{trajectory.exit_status}: answer={trajectory.answer!r} in {summary['steps']} steps, "
                f"{summary['tokens']} tokens; output in {summary['output_dir']}"
            )
        )
    if trajectory.exit_status == "llm_error":
        advice = llm_advice(trajectory.error or "", base_url)
        click.echo(printable(f"jailbox: {trajectory.error}; {advice}"), err=True)
    sys.exit(0 if trajectory.exit_status == "submitted" else 1)


def _drop_if_empty(run_dir: Path) -> None:
    """A run directory the run never recorded into (no jail, or its input refused) is not left behind."""
    with suppress(OSError):
        run_dir.rmdir()


def _docker_image(ref: str, quiet: bool) -> str:
    """The stored rootfs for image REF, pulled first if the store does not hold it (as Docker runs a local image
    without asking the registry); its store name."""
    from ..sandbox.rootfs.pull import pull
    from ..sandbox.rootfs.reference import Reference
    from ..sandbox.rootfs.store import Store

    try:
        name = str(Reference.parse(ref))
        if Store().get(name) is not None:
            return name
        return pull(ref, name, progress=None if quiet else _progress(), log=None if quiet else click.echo).name
    except SandboxError as exc:
        raise click.UsageError(f"--docker_image {ref}: {exc} (e.g. --docker_image python:3.11-slim)") from None
