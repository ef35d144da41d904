"""``jailbox run``: one agent run in a fresh sandbox, with the reference package's flags.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import sys
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it

if TYPE_CHECKING:
    from pathlib import Path


from .app import main
from .errors import _check_url, _fed_by, _flag_error, _read_text
from .options import (
    COPY_OUT_HELP,
    ROOTFS_DEFAULT_HELP,
    RUN_NETWORK_HELP,
    SETTINGS_HELP,
    _endpoint,
    _group,
    _llm_bound_options,
    _llm_bounds,
    _llm_retries_option,
    _shaped,
    _shaping_options,
    _time_limit_option,
)
from .rootfs import _progress
from .settings import _read_settings


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


_model_options = _group(
    "model",
    click.option(
        "--llm-name",
        "--llm_name",
        "--model",
        "llm_name",
        default=None,
        help="Model name at the endpoint; a litellm provider prefix (openai/, hosted_vllm/, openrouter/...) is "
        "dropped.",
    ),
    click.option(
        "--llm-base-url",
        "--llm_base_url",
        "llm_base_url",
        default=None,
        help="Endpoint, e.g. http://localhost:8000/v1 (default $OPENAI_BASE_URL or $LLM_BASE_URL).",
    ),
    click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY."),
    _llm_retries_option,
    _llm_bound_options("the model"),
    click.option("--temperature", type=float, default=1.0, show_default=True),
    click.option(
        "--max-tokens-per-call", "--max_tokens_per_call", type=click.IntRange(min=1), default=65536, show_default=True
    ),
    click.option(
        "--extra-body",
        "--extra_body",
        default=None,
        help="JSON (or a Python literal, as the reference takes it) merged into each request body, e.g. "
        '\'{"chat_template_kwargs": {"thinking": true}}\'.',
    ),
)
"""Which model is asked, where and how: ``_llm_fields`` builds ``LLMConfig``'s fields from them."""

_agent_options = _group(
    "agent",
    click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True),
    click.option(
        "--max-token-limit",
        "--max_token_limit",
        type=int,  # checked by AgentConfig, whose error names the flag (FLAGS)
        default=65536,
        show_default=True,
        help="Tokens the conversation may hold, checked before each call.",
    ),
    click.option(
        "--max-format-errors",
        "--max_format_errors",
        type=click.IntRange(min=1),
        default=None,
        help="End after N replies in a row without a usable tool call [default: nudge and go on].",
    ),
    _time_limit_option("the run"),
    click.option("--text-mode", is_flag=True, help="For models without tool calling: one fenced action per reply."),
)
"""How long the agent goes on, and how it acts: ``AgentConfig``'s fields, as they are named."""

_files_options = _group(
    "files",
    click.option(
        "--input-dir",
        "--input_dir",
        type=click.Path(exists=True, file_okay=False),
        default=None,
        help="Copied into the jail's input directory (writable there), at most 1 GiB.",
    ),
    click.option(
        "--output-dir",
        "--output_dir",
        type=click.Path(file_okay=False),
        default="./output",
        show_default=True,
        help="Each run records into a new OUTPUT_DIR/YYYYMMDD_HHMMSS/ (answer and copies in its files/).",
    ),
    click.option("--copy-out", "--copy_out", "copy_out", multiple=True, metavar="PATH", help=COPY_OUT_HELP),
)
"""What goes into the jail, and where the run is recorded."""

_run_jail_options = _group(
    "jail",
    click.option("--rootfs", default=None, help=ROOTFS_DEFAULT_HELP),
    click.option(
        "--docker-image",
        "--docker_image",
        "docker_image",
        default=None,
        metavar="REF",
        help="Image to run in, pulled into the store unless it is there already (instead of --rootfs).",
    ),
    click.option("--network", default="full", show_default=True, metavar="MODE", help=RUN_NETWORK_HELP),
    _shaping_options,
)
"""The jail the agent works in: ``_sandbox_fields`` builds ``SandboxConfig``'s fields from them."""


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
    from ..agent.llm import LLMConfig, Retry
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

    import json
    from pathlib import Path

    with _fed_by("--output-dir"):
        run_dir = fresh_dir(Path(files["output_dir"]))
    if not quiet and not as_json:
        click.echo(f"Recording into {run_dir} (rootfs {sandbox.rootfs}, network {jail['network']})", err=True)
    started, tokens, max_steps = time.monotonic(), [0], agent["max_steps"]

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

    steps: list[Any] = []

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
        advice = llm_advice(trajectory.error or "", llm.base_url)
        click.echo(printable(f"jailbox: {trajectory.error}; {advice}"), err=True)
    sys.exit(0 if trajectory.exit_status == "submitted" else 1)


def _llm_fields(
    llm_name: str,
    llm_base_url: str | None,
    api_key: str | None,
    llm_max_retries: int,
    llm_timeout: float,
    llm_max_reply: str,
    temperature: float,
    max_tokens_per_call: int,
    extra_body: str | None,
) -> dict[str, Any]:
    """``LLMConfig``'s fields from ``_model_options``' flags (``llm_name`` given); a flag's own error names it."""
    with _fed_by("--extra-body"):
        extra = _extra_body(extra_body) if extra_body else {}
    with _fed_by("--llm-base-url"):
        _check_url(llm_base_url)
    fields: dict[str, Any] = {
        **_endpoint(llm_name, llm_base_url, api_key),
        "temperature": temperature,
        "max_tokens": max_tokens_per_call,
        "extra_body": extra,
        "max_retries": llm_max_retries,
    }
    with _fed_by():
        fields.update(_llm_bounds(llm_max_reply, llm_timeout))
    return fields


def _sandbox_fields(rootfs: str | None, network: str, **shaping: Any) -> dict[str, Any]:
    """``SandboxConfig``'s fields from ``_run_jail_options``' flags but --docker-image (pulled last, once the
    other flags are known good); a bound's own error names its flag."""
    return {"rootfs": rootfs or default_rootfs(), "network": network, **_shaped(**shaping)}


def _drop_if_empty(run_dir: Path) -> None:
    """A run directory the run never recorded into (no jail, or its input refused) is not left behind."""
    with suppress(OSError):
        run_dir.rmdir()


def _extra_body(text: str) -> dict[str, Any]:
    """--extra_body as JSON, or as the Python literal the reference's README writes ({"thinking": True}); the
    strings "true" and "false" become booleans, as the reference makes them."""
    import ast
    import json

    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"not JSON ({text[:80]!r}); write an object") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return _booleans(value)


def _booleans(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _booleans(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_booleans(item) for item in value]
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _run_settings(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(_read_settings(path)) or {}
    except yaml.YAMLError as exc:
        raise click.UsageError(f"--settings {path}: not YAML ({exc}); e.g. 'llm_name: openai/gpt-4o'") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"--settings {path}: expected a YAML mapping, e.g. 'llm_name: openai/gpt-4o'")
    return {key: str(value) for key, value in data.items() if value not in (None, "")}


def default_rootfs() -> str:
    """What ``run``, ``bench`` and ``replay`` start from unless told: the paper's environment (``default``, the
    name ``jailbox rootfs build`` gives the default recipe's tree) when the store holds it, else the host's."""
    from ..sandbox.rootfs.store import Store

    return "default" if Store().get("default") is not None else "host"


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
