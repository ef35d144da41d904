"""How the command line fails: one line naming the flag that fed a bad value and a valid use of it
(``_flag_error``), a missing extra named with its install command, click's own refusals of a value
turned into that line (``_OneLineGroup``), every other error a command ends on as ``jailbox: WHAT``
(``fail``, ``failing``), and the exit codes the commands share.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .settings import _settings_path

TIMEOUT_EXIT = 124  # a command killed for its timeout, as timeout(1) and docker report it
SETUP_EXIT = 125  # the jail could not be made (docker run's code for its own failures)


def fail(error: Exception | str, code: int = 1) -> NoReturn:
    """End the command on an error that is not a flag's: one line on stderr, whatever it quotes
    (an image's names, a server's words) shown escaped."""
    click.echo(printable(f"jailbox: {error}"), err=True)
    sys.exit(code)


@contextmanager
def failing(code: int = 1) -> Iterator[None]:
    """A ``SandboxError`` raised inside ends the command through ``fail`` with ``code``."""
    from ..sandbox.errors import SandboxError  # stdlib only

    try:
        yield
    except SandboxError as exc:
        fail(exc, code)


FLAGS: dict[tuple[str, str], tuple[str, str]] = {
    # (pydantic model, first field of an error's location) -> (the flag that feeds it, a valid use of that
    # flag). A model parsed from one flag alone (NetworkPolicy.parse, Mount.parse) needs no entry: the
    # ``_fed_by`` around it names that flag.
    ("SandboxConfig", "rootfs"): ("--rootfs", "--rootfs host"),
    ("SandboxConfig", "snapshot"): ("--snapshot", "--snapshot repo-ready"),
    ("SandboxConfig", "secrets"): ("--secret", "--secret GITHUB_TOKEN@api.github.com"),
    ("SandboxConfig", "mounts"): ("--bind", "--bind ./data:/testbed/data:ro"),
    ("SandboxConfig", "env"): ("--env", "--env PIP_INDEX_URL=http://localhost:3141/simple"),
    ("SandboxConfig", "workdir"): ("--workdir", "--workdir /testbed"),
    ("SandboxConfig", "hostname"): ("--hostname", "--hostname sandbox"),
    ("SandboxConfig", "upper"): ("--upper", "--upper tmpfs"),
    ("SandboxConfig", "network"): ("--network", "--network allow:pypi,github"),
    ("NetworkPolicy", "publish"): ("--publish", "--network full --publish 8080:80"),
    ("SandboxConfig", "limits"): ("--memory", "--memory 4G"),
    ("SandboxConfig", "cap_add"): ("--cap-add", "--cap-add NET_ADMIN"),
    ("SandboxConfig", "cap_drop"): ("--cap-drop", "--cap-drop NET_RAW"),
    ("SandboxConfig", "ca_certs"): ("--ca-cert", "--ca-cert /usr/local/share/ca-certificates/proxy.crt"),
    ("Limits", "memory"): ("--memory", "--memory 4G"),
    ("Limits", "cpus"): ("--cpus", "--cpus 1.5"),
    ("Limits", "pids"): ("--pids", "--pids 1024"),
    ("Limits", "disk"): ("--disk", "--disk 10G"),
    ("Limits", "inodes"): ("--inodes", "--inodes 100000"),
    ("LLMConfig", ""): ("--llm-base-url", "--llm-base-url http://localhost:8000/v1"),  # none given, none in $ENV
    ("LLMConfig", "model"): ("--llm-name", "--llm-name qwen3"),
    ("LLMConfig", "base_url"): ("--llm-base-url", "--llm-base-url http://localhost:8000/v1"),
    ("LLMConfig", "api_key"): ("--api-key", "--api-key sk-..."),
    ("LLMConfig", "temperature"): ("--temperature", "--temperature 0.7"),
    ("LLMConfig", "max_tokens"): ("--max-tokens-per-call", "--max-tokens-per-call 4096"),
    ("LLMConfig", "extra_body"): ("--extra-body", """--extra-body '{"top_p": 0.9}'"""),
    ("LLMConfig", "max_retries"): ("--llm-max-retries", "--llm-max-retries 6"),
    ("LLMConfig", "max_reply_bytes"): ("--llm-max-reply", "--llm-max-reply 64M"),
    ("LLMConfig", "timeout"): ("--llm-timeout", "--llm-timeout 3600"),
    ("AgentConfig", "max_steps"): ("--max-steps", "--max-steps 100"),
    ("AgentConfig", "max_token_limit"): ("--max-token-limit", "--max-token-limit 65536"),
    ("AgentConfig", "max_format_errors"): ("--max-format-errors", "--max-format-errors 3"),
    ("AgentConfig", "time_limit"): ("--time-limit", "--time-limit 600"),
    ("BatchConfig", "workers"): ("--workers", "--workers 4"),
    ("BatchConfig", "max_starting"): ("--workers", "--workers 4"),
    ("BatchConfig", "ray_address"): ("--ray-address", "--ray-address ray://head:10001"),
    ("BatchConfig", "copy_out"): ("--copy-out", "--copy-out results.csv"),
}


EXAMPLES: dict[str, str] = {
    # a valid use of a flag whose value is checked outside pydantic (a parse step before any model)
    **{flag: example for flag, example in FLAGS.values()},
    "--query": "--query @task.txt",
    "--prompt-config": "--prompt-config general.yaml",
    "--scorer-module": "--scorer-module mypkg.scorers",
    "--executor": "--executor threads",
    "--timeout": "--timeout 60",
    "--port": "--port 0 (any free port; the server prints the address it bound)",
    "--host": "--host 127.0.0.1",
    "TASKS": 'a line per task like {"id": "t1", "query": "2+2?", "answer": "4"}',
}


def _flag_error(flag: str, text: str, example: str | None = None, ctx: click.Context | None = None) -> NoReturn:
    """One line naming the flag (and the config file, when the value came from there) and a valid use of it;
    exit 2, as click's own usage errors do. ``ctx``: the command's, where it is not the current one."""
    ctx = ctx or click.get_current_context(silent=True)
    source = ""
    if ctx is not None:
        for param in ctx.command.params:
            if flag in param.opts and param.name is not None:
                if ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT_MAP:
                    source = f" (from {_settings_path()}, key {ctx.info_name}.{param.name})"
    example = EXAMPLES.get(flag, example)
    where = f"{flag}{source}: " if flag else ""
    click.echo(printable(f"jailbox: {where}{text}" + (f"; e.g. {example}" if example else "")), err=True)
    sys.exit(2)


def _missing_extra(part: str, exc: ImportError) -> NoReturn:
    """One line naming the extra that installs what ``part`` failed to import, and the command; exit 2."""
    from ..extras import missing

    _flag_error("", missing(part, exc))


def _pydantic_text(error: Any) -> str:
    """pydantic's message for one error without its type tags, with the value it got."""
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    given = error.get("input")
    if isinstance(given, str | int | float) and not isinstance(given, bool) and str(given) not in message:
        return f"{given!r}: {message}"
    return message


@contextmanager
def _fed_by(flag: str = "") -> Iterator[None]:
    """Turns a ValueError raised inside (pydantic's ValidationError is one) into ``_flag_error``: the flag is
    the one ``FLAGS`` says fed the field pydantic names, else ``flag``. The one translation from errors to
    flags: every command builds its models inside it."""
    try:
        yield
    except ValueError as exc:
        from pydantic import ValidationError  # loaded already when a model raised it

        if not isinstance(exc, ValidationError):
            _flag_error(flag, str(exc))
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error.get("loc") else ""  # "": the model as a whole
        found = FLAGS.get((exc.title, field)) if field else None
        fallback = FLAGS.get((exc.title, ""), ("--" + field.replace("_", "-") if field else "",))[0]
        _flag_error(found[0] if found else flag or fallback, _pydantic_text(error))


def _read_text(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _check_url(url: str | None) -> None:
    """An endpoint must be an http(s) URL: anything else fails only after the first request's retries."""
    from urllib.parse import urlsplit

    if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")


def _valid_use(option: click.Option) -> str | None:
    """A value the flag takes, for an error with no example of its own: a choice, else its default."""
    flag = option.opts[0]
    if isinstance(option.type, click.Choice):
        return f"{flag} {option.type.choices[0]}"
    if option.is_flag or option.default is None or callable(option.default) or option.multiple:
        return None
    return f"{flag} {option.default}"


class _OneLineGroup(click.Group):
    """Click's own refusals of an option's value (not a number, out of range, not a choice, missing)
    get the one line every other bad flag gets (``_flag_error``), not a usage block."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.BadParameter as exc:  # raised while a command's context is made, inside this call
            if not isinstance(exc.param, click.Option):
                raise
            text = "is required" if isinstance(exc, click.MissingParameter) else exc.message.rstrip(".")
            _flag_error(exc.param.opts[0], text, _valid_use(exc.param), exc.ctx)
