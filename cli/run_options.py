"""The flags of ``jailbox run`` as option groups (which model, the agent, its files, its jail), and the
fields of the configs each group builds, every error naming its flag.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

from typing import Any

import click

from .errors import _check_url, _fed_by
from .options import (
    COPY_OUT_HELP,
    ROOTFS_DEFAULT_HELP,
    RUN_NETWORK_HELP,
    SECRET_OPTION,
    _endpoint,
    _group,
    _llm_bound_options,
    _llm_bounds,
    _llm_retries_option,
    _secrets,
    _shaped,
    _shaping_options,
    _time_limit_option,
    default_rootfs,
)
from .settings import _read_settings

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
    SECRET_OPTION,
    _shaping_options,
)
"""The jail the agent works in: ``_sandbox_fields`` builds ``SandboxConfig``'s fields from them."""


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


def _sandbox_fields(rootfs: str | None, network: str, secrets: tuple[str, ...], **shaping: Any) -> dict[str, Any]:
    """``SandboxConfig``'s fields from ``_run_jail_options``' flags but --docker-image (pulled last, once the
    other flags are known good); a bound's own error names its flag."""
    held = _secrets(secrets)
    fields = {"rootfs": rootfs or default_rootfs(), "network": network, **_shaped(**shaping)}
    return {**fields, "secrets": held} if held else fields


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
