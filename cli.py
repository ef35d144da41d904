"""The ``jailbox`` command, in the user's process: click commands only (parse, call ``sandbox``/``agent``, print).

Import-light: a user times every ``jailbox exec`` from a shell, so this module loads click and the stdlib
it shares, nothing else. Each command imports what it uses inside its body (the jail for ``exec``, the
agent for ``run``, the store for ``rootfs``), and pydantic loads with the first model a command builds.
``tests/test_cli_imports.py`` holds ``exec`` and ``--help`` to a budget of modules.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import click

from . import __version__
from .sandbox.errors import SandboxError  # stdlib only, and every command catches it
from .sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .sandbox.limits import DEFAULT_DISK, DEFAULT_INODES, DEFAULT_MEMORY, DEFAULT_PIDS  # constants only

if TYPE_CHECKING:
    from pathlib import Path

    from .sandbox import Limits, SandboxConfig
    from .sandbox.execution import ExecRun

TIMEOUT_EXIT = 124
PIPED_EVERY = 25  # rootfs build, piped: a progress line every this many packages
SHELL = "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"
COPY_OUT_HELP = (
    "Also copy PATH (relative to the jail's output directory) out beside answer.txt (repeatable); "
    "nothing else the jail writes leaves it."
)
ROOTFS_DEFAULT_HELP = (
    '"host", a stored name or a directory [default: the paper\'s environment, "default" from jailbox rootfs build, '
    'when stored; else "host"].'
)
RUN_NETWORK_HELP = (
    "full (the default: the internet, as the reference's Docker bridge gives, but never the host or its LAN; "
    "needs slirp4netns), none to lock down, host (unconfined), or allow:RULES through jailbox's proxy."
)
SETTINGS_HELP = "YAML with defaults for llm_name, llm_base_url, api_key and prompt_config (the reference's)."
NETWORK_HELP = (
    "none (loopback only), host (unconfined), full (slirp4netns: anywhere but the host and its LAN), "
    "or allow:RULES through jailbox's proxy, e.g. allow:pypi,github,*.example.com,!bad.example.com"
)


FLAGS: dict[tuple[str, str], tuple[str, str]] = {
    # (pydantic model, first field of an error's location) -> (the flag that feeds it, a valid use of that
    # flag). A model parsed from one flag alone (NetworkPolicy.parse, Mount.parse) needs no entry: the
    # ``_fed_by`` around it names that flag.
    ("SandboxConfig", "rootfs"): ("--rootfs", "--rootfs host"),
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
    from .extras import missing

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


CAP_HELP = "uid 0 {} capability NAME in the jail's user namespace (capabilities(7), CAP_ optional, or ALL)."


CA_CERT_HELP = (
    "Trust the CA certificates of PEM file FILE inside the jail too (repeatable): appended to the root filesystem's "
    "bundles (system, pip's certifi) in its writable layer, for a TLS-intercepting proxy."
)


def _size_text(size: int) -> str:
    """``2G`` for 2 GiB: a default as the size flags take it."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def _bound_options(func: Any) -> Any:
    """The library's bounds (``Limits``) as ``docker run`` and ``podman run`` spell them: every command that
    makes a jail, and ``serve`` for the sandboxes it makes (``_limits`` reads them)."""
    for option in reversed(BOUNDS):
        func = option(func)
    return func


BOUNDS = (
    click.option(
        "--memory",
        "-m",
        metavar="SIZE",
        help=f"Memory of all the jail's processes together, e.g. 512m or 4G [default: {_size_text(DEFAULT_MEMORY)}].",
    ),
    click.option("--cpus", type=float, metavar="N", help="CPU time per wall second, e.g. 1.5 [default: unbounded]."),
    click.option(
        "--pids",
        "--pids-limit",
        "pids",
        type=int,
        metavar="N",
        help=f"Processes and threads at once [default: {DEFAULT_PIDS}].",
    ),
    click.option(
        "--disk",
        metavar="SIZE",
        help=f"Bytes the jail's writable layer and tmpfs hold, e.g. 10G [default: {_size_text(DEFAULT_DISK)}].",
    ),
    click.option(
        "--inodes",
        type=int,
        metavar="N",
        help=f"Files, directories and links the writable layer and tmpfs hold [default: {DEFAULT_INODES}].",
    ),
)


def _shaping_options(func: Any) -> Any:
    """The flags every command that makes a jail shares, however it declares the rest: its bounds,
    capabilities and extra CA certificates (``_shaped`` reads them)."""
    func = _bound_options(func)
    func = click.option(
        "--ca-cert", "ca_certs", multiple=True, metavar="FILE", type=click.Path(dir_okay=False), help=CA_CERT_HELP
    )(func)
    func = click.option("--cap-drop", "cap_drop", multiple=True, metavar="NAME", help=CAP_HELP.format("loses"))(func)
    return click.option("--cap-add", "cap_add", multiple=True, metavar="NAME", help=CAP_HELP.format("gains"))(func)


def _shaped(
    cap_add: tuple[str, ...], cap_drop: tuple[str, ...], ca_certs: tuple[str, ...], **bounds: Any
) -> dict[str, Any]:
    """``SandboxConfig`` fields from ``_shaping_options``' flags."""
    return {"limits": _limits(**bounds), "cap_add": cap_add, "cap_drop": cap_drop, "ca_certs": list(ca_certs)}


def _limits(memory: str | None, cpus: float | None, pids: int | None, disk: str | None, inodes: int | None) -> Limits:
    """``Limits`` from ``_bound_options``' flags; a bound not given keeps its default. Built apart from any
    ``SandboxConfig``, so that an error names the bound's own flag (``FLAGS``)."""
    from .sandbox import Limits

    given = {"memory": memory, "cpus": cpus, "pids": pids, "disk": disk, "inodes": inodes}
    with _fed_by():
        return Limits(**{name: value for name, value in given.items() if value is not None})


def _llm_retries_option(func: Any) -> Any:
    """How often a failed model request is sent again: `run` and `bench` share it."""
    return click.option(
        "--llm-max-retries",
        "--llm_max_retries",
        "llm_max_retries",
        type=click.IntRange(min=0),
        default=6,
        show_default=True,
        help="Times a failed LLM request (dropped connection, 408, 409, 429, 5xx) is sent again, with backoff.",
    )(func)


def _time_limit_option(what: str) -> Any:
    """The wall time of an agent's run: `run` and `bench` share it (--timeout, as `exec` spells a lifetime)."""
    return click.option(
        "--time-limit",
        "--time_limit",
        "--timeout",
        "time_limit",
        type=float,
        default=None,
        help=f"Seconds of wall time for {what}.",
    )


def _llm_bound_options(what: str) -> Callable[[Any], Any]:
    """How much of a reply, and how long a request, is taken from the LLM endpoint (``what``): `run` and `bench`
    share them. The defaults are ``LLMConfig``'s (MAX_REPLY_BYTES, ``Timeouts.total``)."""

    def add(func: Any) -> Any:
        func = click.option(
            "--llm-timeout",
            "--llm_timeout",
            "llm_timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=1800.0,
            show_default=True,
            metavar="SECONDS",
            help=f"Seconds a request to {what} may take, its whole reply included; past them it fails, not retried.",
        )(func)
        return click.option(
            "--llm-max-reply",
            "--llm_max_reply",
            "llm_max_reply",
            default="16M",
            show_default=True,
            metavar="SIZE",
            help=f"Bytes of a reply from {what} taken, counted decoded, and a JSON value per 64 of them; past that "
            "it fails, not retried.",
        )(func)

    return add


def _llm_bounds(max_reply: str, timeout: float) -> dict[str, Any]:
    """The ``LLMConfig`` fields ``_llm_bound_options``' flags give."""
    from .sandbox.config import parse_size

    with _fed_by("--llm-max-reply"):
        return {"max_reply_bytes": parse_size(max_reply), "timeout": {"total": timeout}}


def _agent_jail_options(func: Any) -> Any:
    """``_jail_options`` with the agent commands' defaults: the paper's environment and network."""
    return _jail_options(func, rootfs=None, network="full")


def _jail_options(func: Any, rootfs: str | None = "host", network: str = "none") -> Any:
    options = [
        _shaping_options,
        click.option(
            "--rootfs",
            default=rootfs,
            show_default=rootfs is not None,
            help='"host", a stored name (jailbox rootfs list) or a directory.' if rootfs else ROOTFS_DEFAULT_HELP,
        ),
        click.option(
            "--bind",
            "binds",
            multiple=True,
            metavar="SRC:DST[:ro|rw|give]",
            help="Bind a host path (ro default; give: rw, chowned to the jail's root).",
        ),
        click.option("--workdir", default=None, help="Working directory inside [default: the image's, else /testbed]."),
        click.option("--env", "envs", multiple=True, metavar="K=V", help="Set a variable inside (repeatable)."),
        click.option(
            "--network",
            default=network,
            show_default=True,
            metavar="MODE",
            help=NETWORK_HELP if network == "none" else RUN_NETWORK_HELP,
        ),
        click.option(
            "--publish",
            "publishes",
            multiple=True,
            metavar="[ADDR:]HOST:JAIL",
            help="With --network full: forward a host port.",
        ),
        click.option("--hostname", default="sandbox", show_default=True),
        click.option(
            "--upper",
            type=click.Choice(["disk", "tmpfs"]),
            default="disk",
            show_default=True,
            help="Where the writable layer lives.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _config(
    rootfs: str,
    binds: tuple[str, ...],
    workdir: str | None,
    envs: tuple[str, ...],
    network: str,
    publishes: tuple[str, ...],
    hostname: str,
    upper: str,
    **shaping: Any,
) -> SandboxConfig:
    from .sandbox import Mount, NetworkPolicy, SandboxConfig

    with _fed_by("--env"):
        env = _env_pairs(envs)
    with _fed_by("--bind"):
        mounts = [Mount.parse(b) for b in binds]
    with _fed_by("--network"):
        policy = NetworkPolicy.parse(network)
    with _fed_by("--publish"):
        if publishes:
            policy = NetworkPolicy(mode=policy.mode, publish=publishes)
    shaped = _shaped(**shaping)
    with _fed_by():
        extra = {"workdir": workdir} if workdir else {}
        return SandboxConfig(
            rootfs=rootfs, mounts=mounts, env=env, network=policy, hostname=hostname, upper=upper, **shaped, **extra
        )


def _settings_path() -> str:
    """~/.config/jailbox/config.yaml (or .yml, .toml: the first that exists), under $XDG_CONFIG_HOME if set.
    Plain ``os.path``: every command reads it, and pathlib is one more import for ``--help`` to pay."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    base = os.path.join(config_home, "jailbox")
    for name in ("config.yaml", "config.yml", "config.toml"):
        if os.path.exists(os.path.join(base, name)):
            return os.path.join(base, name)
    return os.path.join(base, "config.yaml")


def _env_pairs(envs: tuple[str, ...]) -> dict[str, str]:
    """``--env K=V`` pairs; a ValueError for one without ``=`` (callers run it under ``_fed_by``)."""
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r}: expected K=V, e.g. --env LANG=C.UTF-8")
        env[key] = value
    return env


def _settings() -> dict[str, Any]:
    """Defaults for any command's options from ``_settings_path()``, a section per command, e.g.
    ``run: {llm_base_url: http://localhost:8000/v1, llm_name: qwen3}``; flags still win."""
    path = _settings_path()
    if not os.path.exists(path):
        return {}
    if path.endswith(".toml"):
        if sys.version_info >= (3, 11):
            import tomllib

            data = tomllib.loads(_read_settings(path))
        else:  # tomllib came with 3.11, and jailbox adds no TOML dependency for 3.10
            raise click.UsageError(f"{path}: TOML settings need Python 3.11 or newer; use config.yaml")
    else:
        import yaml

        data = yaml.safe_load(_read_settings(path)) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise click.UsageError(f"{path}: expected a section per command, e.g. 'run: {{llm_name: qwen3}}'")
    return {cmd: _underscored(opts) for cmd, opts in data.items()}


def _read_settings(path: str) -> str:
    with open(path) as file:
        return file.read()


def _underscored(section: dict[str, Any]) -> dict[str, Any]:
    """Keys as click names parameters (``llm-name`` -> ``llm_name``), a group's sections too."""
    return {str(k).replace("-", "_"): _underscored(v) if isinstance(v, dict) else v for k, v in section.items()}


def _settings_keys(group: click.Group, ctx: click.Context) -> dict[str, Any]:
    """Per command (a group's commands nested), the keys its config-file section takes: its options' names."""
    keys: dict[str, Any] = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            keys[name] = _settings_keys(command, ctx)
        elif command is not None:
            keys[name] = {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}
    return keys


def _unknown_settings(data: dict[str, Any], keys: dict[str, Any], where: str = "") -> list[str]:
    """``section.key`` for every key of ``data`` that no command takes (a typo is not ignored silently)."""
    unknown = []
    for name, value in data.items():
        if name not in keys:
            unknown.append(f"{where}{name}")
        elif isinstance(value, dict) and all(not isinstance(v, click.Parameter) for v in keys[name].values()):
            unknown += _unknown_settings(value, keys[name], f"{where}{name}.")
        elif isinstance(value, dict):
            unknown += [f"{where}{name}.{key}" for key in value if key not in keys[name]]
    return unknown


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


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, message="jailbox %(version)s")  # not the installed metadata: slow to read
@click.pass_context
def main(ctx: click.Context) -> None:
    """jailbox: rootless sandboxes for running untrusted code and LLM agents, without Docker.

    \b
    Example:
      jailbox exec -- python3 -c 'print(6*7)'
    """
    ctx.default_map = _settings()
    if ctx.resilient_parsing:  # shell completion: nothing on stderr
        return
    for key in _unknown_settings(ctx.default_map, _settings_keys(main, ctx)):
        click.echo(
            f"jailbox: warning: {_settings_path()}: unknown key {key!r}, ignored (`jailbox config --reference` "
            "lists every key)",
            err=True,
        )


# Options stop at the first word that is not one, as with docker run: that word and all after it are the
# command's, its own options too. An unknown option before it is click's usage error, never a command.
@main.command("exec", context_settings={"allow_interspersed_args": False})
@_jail_options
@click.option("--timeout", type=float, default=None, help="Kill the command's whole tree after S seconds.")
@click.option("--id", "sandbox_id", default=None, metavar="ID", help="Run in a sandbox from jailbox create instead.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(command: tuple[str, ...], timeout: float | None, sandbox_id: str | None, **jail: Any) -> None:
    """Run COMMAND in a fresh sandbox (or, with --id, in one from jailbox create); exit with its exit code
    (124 on timeout, 125 when no jail could be made, 127 and 126 when COMMAND is not found or cannot run).
    Options go before COMMAND (or before --): from COMMAND's first word on, the line is COMMAND's.

    \b
    Example:
      jailbox exec --rootfs python:3.11-slim --network allow:pypi -- pip install requests
      jailbox exec -m 512m --cpus 1.5 --pids 256 -- python3 -c 'print(6*7)'
    """
    if sandbox_id is not None:
        _service_exec(sandbox_id, command, timeout, jail)
    from .sandbox import Sandbox
    from .sandbox.execution import run_sync

    config = _config(**jail)
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer  # streamed, never read whole
    out, err = sys.stdout.buffer, sys.stderr.buffer
    closed: list[bool] = []
    run: ExecRun | None = None

    def write(stream: Any) -> Any:
        def callback(data: bytes) -> None:
            if closed:
                return
            try:
                stream.write(data)
                stream.flush()
            except BrokenPipeError:  # our reader went away (``jailbox exec -- yes | head``): stop, as SIGPIPE would
                closed.append(True)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, stream.fileno())  # what is still buffered goes nowhere, with no error at exit
                os.close(null)
                if run is not None:
                    run.kill()

        return callback

    try:
        with Sandbox(config) as sb:
            run = sb.begin_exec(list(command), stdin=stdin, on_stdout=write(out), on_stderr=write(err))
            result = run_sync(run, timeout)
    except SandboxError as exc:
        click.echo(printable(f"jailbox: {exc}"), err=True)
        sys.exit(125)
    if closed:
        sys.exit(128 + signal.SIGPIPE)
    if result.timed_out:
        click.echo(f"jailbox: command timed out after {timeout}s and was killed", err=True)
        sys.exit(TIMEOUT_EXIT)
    sys.exit(result.exit_code)


@main.command()
@_jail_options
def shell(**jail: Any) -> None:
    """Open an interactive shell on a pty inside a fresh sandbox.

    \b
    Example:
      jailbox shell --rootfs default --bind ./project:/testbed/project:rw
    """
    from .sandbox import Sandbox
    from .sandbox.terminal import attach

    config = _config(**jail)
    try:
        with Sandbox(config) as sb:
            command = sb.exec_tty(["/bin/sh", "-c", SHELL], env={"TERM": os.environ.get("TERM", "xterm")})
            code = attach(command, sys.stdin.fileno(), sys.stdout.fileno())
    except SandboxError as exc:
        click.echo(printable(f"jailbox: {exc}"), err=True)
        sys.exit(125)
    sys.exit(code)


def _trim(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[: limit // 2]}\n[...]\n{text[-limit // 2 :]}"


@main.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--query", "--problem", required=True, help="The task (text, or @FILE to read it from a file).")
@click.option(
    "--llm-name",
    "--llm_name",
    "--model",
    "llm_name",
    default=None,
    help="Model name at the endpoint; a litellm provider prefix (openai/, hosted_vllm/, openrouter/...) is dropped.",
)
@click.option(
    "--llm-base-url",
    "--llm_base_url",
    "llm_base_url",
    default=None,
    help="Endpoint, e.g. http://localhost:8000/v1 (default $OPENAI_BASE_URL or $LLM_BASE_URL).",
)
@click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY.")
@_llm_retries_option
@_llm_bound_options("the model")
@click.option(
    "--input-dir",
    "--input_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Copied into the jail's input directory (writable there), at most 1 GiB.",
)
@click.option(
    "--output-dir",
    "--output_dir",
    type=click.Path(file_okay=False),
    default="./output",
    show_default=True,
    help="Each run records into a new OUTPUT_DIR/YYYYMMDD_HHMMSS/ (answer and copies in its files/).",
)
@click.option("--prompt-config", "--prompt_config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True)
@click.option(
    "--max-token-limit",
    "--max_token_limit",
    type=int,  # checked by AgentConfig, whose error names the flag (FLAGS)
    default=65536,
    show_default=True,
    help="Tokens the conversation may hold, checked before each call.",
)
@click.option(
    "--max-tokens-per-call", "--max_tokens_per_call", type=click.IntRange(min=1), default=65536, show_default=True
)
@click.option(
    "--max-format-errors",
    "--max_format_errors",
    type=click.IntRange(min=1),
    default=None,
    help="End after N replies in a row without a usable tool call [default: nudge and go on].",
)
@click.option(
    "--extra-body",
    "--extra_body",
    default=None,
    help="JSON (or a Python literal, as the reference takes it) merged into each request body, e.g. "
    '\'{"chat_template_kwargs": {"thinking": true}}\'.',
)
@_time_limit_option("the run")
@click.option("--text-mode", is_flag=True, help="For models without tool calling: one fenced action per reply.")
@click.option("--rootfs", default=None, help=ROOTFS_DEFAULT_HELP)
@click.option(
    "--docker-image",
    "--docker_image",
    "docker_image",
    default=None,
    metavar="REF",
    help="Image to run in, pulled into the store unless it is there already (instead of --rootfs).",
)
@click.option("--settings", type=click.Path(exists=True, dir_okay=False), default=None, help=SETTINGS_HELP)
@click.option(
    "--save-litellm-response",
    "--save_litellm_response",
    is_flag=True,
    help="Accepted for the reference's command lines; trajectory.json already holds every reply.",
)
@click.option("--network", default="full", show_default=True, metavar="MODE", help=RUN_NETWORK_HELP)
@_shaping_options
@click.option("--copy-out", "--copy_out", "copy_out", multiple=True, metavar="PATH", help=COPY_OUT_HELP)
@click.option("--quiet", is_flag=True, help="No per-step output.")
@click.option("--json", "as_json", is_flag=True, help="Print the final result as JSON.")
def run_cmd(
    query: str,
    llm_name: str | None,
    llm_base_url: str | None,
    api_key: str | None,
    llm_max_retries: int,
    llm_timeout: float,
    llm_max_reply: str,
    input_dir: str | None,
    output_dir: str,
    prompt_config: str | None,
    temperature: float,
    max_steps: int,
    max_token_limit: int,
    max_tokens_per_call: int,
    max_format_errors: int | None,
    extra_body: str | None,
    time_limit: float | None,
    text_mode: bool,
    rootfs: str | None,
    docker_image: str | None,
    settings: str | None,
    save_litellm_response: bool,
    network: str,
    copy_out: tuple[str, ...],
    quiet: bool,
    as_json: bool,
    **shaping: Any,
) -> None:
    """Give a model a fresh sandbox and let it work on QUERY until it submits.

    \b
    Example:
      jailbox run --query "What is the 100th prime?" --llm-name qwen3 \\
                  --llm-base-url http://localhost:8000/v1 --output-dir ./out
    """
    from .agent import prompts as prompt_configs
    from .agent.inputs import InputDirError
    from .agent.llm import LLMConfig, Retry
    from .agent.loop import AgentConfig
    from .agent.run import FILES, check_copy_out, fresh_dir, run_task
    from .sandbox import SandboxConfig

    with _fed_by("--query"):
        if query.startswith("@"):
            query = _read_text(query[1:])
    if rootfs is not None and docker_image is not None:
        raise click.UsageError("--rootfs and --docker_image both name the filesystem: give one, e.g. --rootfs host")
    defaults = _run_settings(settings)
    llm_name = llm_name or defaults.get("llm_name")
    llm_base_url = llm_base_url or defaults.get("llm_base_url")
    api_key = api_key or defaults.get("api_key")
    prompt_config = prompt_config or defaults.get("prompt_config")
    if not llm_name:
        raise click.UsageError("--llm_name is required (or llm_name in --settings), e.g. --llm_name openai/gpt-4o")
    if save_litellm_response and not quiet and not as_json:
        click.echo("jailbox: --save_litellm_response: every request and reply is in trajectory.json already", err=True)
    model, provider_url = _model_route(llm_name)
    with _fed_by("--extra-body"):
        extra = _extra_body(extra_body) if extra_body else {}
    with _fed_by("--llm-base-url"):
        _check_url(llm_base_url)
    shaped = _shaped(**shaping)
    with _fed_by():
        llm_fields: dict[str, Any] = {
            "model": model,
            "temperature": temperature,
            "max_tokens": max_tokens_per_call,
            "extra_body": extra,
            "max_retries": llm_max_retries,
            **_llm_bounds(llm_max_reply, llm_timeout),
        }
        if llm_base_url or provider_url:
            llm_fields["base_url"] = llm_base_url or provider_url
        if api_key:
            llm_fields["api_key"] = api_key
        llm = LLMConfig(**llm_fields)
        sandbox = SandboxConfig(rootfs=rootfs or default_rootfs(), network=network, **shaped)
        agent = AgentConfig(
            max_steps=max_steps,
            max_token_limit=max_token_limit,
            max_format_errors=max_format_errors,
            time_limit=time_limit,
            text_mode=text_mode,
        )
    with _fed_by("--prompt-config"):
        prompts = prompt_configs.load(prompt_config)
    with _fed_by("--copy-out"):
        copy_out = tuple(check_copy_out(rel) for rel in copy_out)
    if docker_image is not None:
        sandbox = sandbox.model_copy(update={"rootfs": _docker_image(docker_image, quiet or as_json)})

    import json
    from pathlib import Path

    with _fed_by("--output-dir"):
        run_dir = fresh_dir(Path(output_dir))
    if not quiet and not as_json:
        click.echo(f"Recording into {run_dir} (rootfs {sandbox.rootfs}, network {network})", err=True)
    started, tokens = time.monotonic(), [0]

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
            input_dir=Path(input_dir) if input_dir else None,
            prompts=prompts,
            agent=agent,
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


def _drop_if_empty(run_dir: Path) -> None:
    """A run directory the run never recorded into (no jail, or its input refused) is not left behind."""
    with suppress(OSError):
        run_dir.rmdir()


# litellm's provider prefixes as the reference passes model names through it: the prefix picks the API (these
# are all OpenAI-compatible) and, with no --llm_base_url, the provider's endpoint; the server sees the rest.
PROVIDERS: dict[str, str | None] = {
    "openai": None,
    "hosted_vllm": None,
    "custom_openai": None,
    "text-completion-openai": None,
    "openrouter": "https://openrouter.ai/api/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "ollama": "http://localhost:11434/v1",
    "ollama_chat": "http://localhost:11434/v1",
    "lm_studio": "http://localhost:1234/v1",
    "groq": "https://api.groq.com/openai/v1",
    "together_ai": "https://api.together.xyz/v1",
    "fireworks_ai": "https://api.fireworks.ai/inference/v1",
    "mistral": "https://api.mistral.ai/v1",
    "xai": "https://api.x.ai/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai",
}


def _model_route(name: str) -> tuple[str, str | None]:
    """(model as the server knows it, the provider's endpoint if the prefix names one). Only a known provider
    prefix goes, as in litellm: "openai/Qwen/Qwen3-8B" sends "Qwen/Qwen3-8B", "Qwen/Qwen3-8B" is sent whole."""
    provider, slash, rest = name.partition("/")
    if slash and rest and provider in PROVIDERS:
        return rest, PROVIDERS[provider]
    return name, None


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
    from .sandbox.rootfs.store import Store

    return "default" if Store().get("default") is not None else "host"


def _docker_image(ref: str, quiet: bool) -> str:
    """The stored rootfs for image REF, pulled first if the store does not hold it (as Docker runs a local image
    without asking the registry); its store name."""
    from .sandbox.rootfs.pull import pull
    from .sandbox.rootfs.reference import Reference
    from .sandbox.rootfs.store import Store

    try:
        name = str(Reference.parse(ref))
        if Store().get(name) is not None:
            return name
        return pull(ref, name, progress=None if quiet else _progress(), log=None if quiet else click.echo).name
    except SandboxError as exc:
        raise click.UsageError(f"--docker_image {ref}: {exc} (e.g. --docker_image python:3.11-slim)") from None


@main.command("bench")
@click.argument("tasks_file", metavar="TASKS", type=click.Path(exists=True, dir_okay=False))
@click.option("--llm-name", "--llm_name", "--model", "llm_name", required=True, help="Model name at the endpoint.")
@click.option("--llm-base-url", "--llm_base_url", "llm_base_url", default=None, help="Default $OPENAI_BASE_URL.")
@click.option("--api-key", "--api_key", default=None, help="Default $OPENAI_API_KEY.")
@_llm_retries_option
@_llm_bound_options("the model or the judge")
@click.option(
    "--output-dir", "--output_dir", type=click.Path(file_okay=False), default="./bench-out", show_default=True
)
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--executor", type=click.Choice(["threads", "ray"]), default="threads", show_default=True)
@click.option("--ray-address", "--ray_address", default=None, help="Default $RAY_ADDRESS, else a local cluster.")
@click.option("--mode", type=click.Choice(["sandbox", "llm"]), default="sandbox", show_default=True)
@click.option(
    "--resume", is_flag=True, help="Add to OUTPUT_DIR/results.jsonl, skipping what it has for this model and mode."
)
@click.option("--overwrite", is_flag=True, help="Move an earlier run in OUTPUT_DIR aside (to OUTPUT_DIR.DATE) first.")
@click.option("--max-steps", "--max_steps", type=int, default=100, show_default=True)
@_time_limit_option("each task (a task's own time_limit wins)")
@click.option("--rootfs", default=None, help=ROOTFS_DEFAULT_HELP)
@click.option("--network", default="full", show_default=True, metavar="MODE", help=RUN_NETWORK_HELP)
@_shaping_options
@click.option(
    "--scorer-module",
    "--scorer_module",
    "scorer_modules",
    multiple=True,
    metavar="MODULE",
    help="Make MODULE's public functions scorers that tasks may name (repeatable).",
)
@click.option(
    "--inputs-root",
    "--inputs_root",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Where a task's @path input files are [default: the tasks file's directory].",
)
@click.option("--copy-out", "--copy_out", "copy_out", multiple=True, metavar="PATH", help=COPY_OUT_HELP)
@click.option("--judge-model", "--judge_model", default=None, help="Model for tasks scored by 'judge'.")
@click.option(
    "--judge-base-url", "--judge_base_url", default=None, help="The judge's endpoint [default: $OPENAI_BASE_URL]."
)
@click.option("--judge-api-key", "--judge_api_key", default=None, help="The judge's API key.")
@click.option(
    "--judge-repeats", "--num_repeats", type=int, default=4, show_default=True, help="Verdicts averaged per answer."
)
def bench_cmd(
    tasks_file: str,
    llm_name: str,
    llm_base_url: str | None,
    api_key: str | None,
    llm_max_retries: int,
    llm_timeout: float,
    llm_max_reply: str,
    output_dir: str,
    workers: int,
    executor: str,
    ray_address: str | None,
    mode: str,
    resume: bool,
    overwrite: bool,
    max_steps: int,
    time_limit: float | None,
    rootfs: str | None,
    network: str,
    scorer_modules: tuple[str, ...],
    inputs_root: str | None,
    copy_out: tuple[str, ...],
    judge_model: str | None,
    judge_base_url: str | None,
    judge_api_key: str | None,
    judge_repeats: int,
    **shaping: Any,
) -> None:
    """Run every task of TASKS (JSONL) in its own sandbox, N at once, and score the answers.
    Ctrl-C once: running tasks finish, no new one starts; twice: they are killed. TASKS is data: its
    scorers are names (built-in, --scorer-module, or jailbox.scorers entry points) and its @path inputs
    lie beneath --inputs-root.

    \b
    Example:
      jailbox bench tasks.jsonl --llm-name qwen3 --llm-base-url http://localhost:8000/v1 --workers 8
    """
    from pathlib import Path

    from .agent.batch import Batch, BatchConfig, find_executor
    from .agent.executors import ExecutorError
    from .agent.llm import LLMConfig
    from .agent.loop import AgentConfig
    from .agent.progress import Progress
    from .agent.report import common_failure, write_summary
    from .agent.run import check_copy_out
    from .agent.scoring import load_scorers
    from .agent.tasks import load_tasks, read_results
    from .sandbox import SandboxConfig

    if resume and overwrite:
        _flag_error("--overwrite", "is for a fresh run, --resume adds to the earlier one: give one of them")
    with _fed_by("TASKS"):
        tasks = load_tasks(tasks_file)
    with _fed_by("--llm-base-url"):
        _check_url(llm_base_url)
    from .agent.judge import from_flags

    bounds = _llm_bounds(llm_max_reply, llm_timeout)
    with _fed_by("--judge-model"):
        judge = from_flags(judge_model, judge_base_url, judge_api_key, judge_repeats, bounds)
    with _fed_by("--scorer-module"):
        scorers = load_scorers(scorer_modules, judge)
    try:
        executor_factory = find_executor(executor)
    except ExecutorError as exc:  # its extra is not installed: said before anything is moved or run
        _flag_error("", str(exc))
    with _fed_by("--copy-out"):
        copy_out = tuple(check_copy_out(rel) for rel in copy_out)
    shaped = _shaped(**shaping)
    out = Path(output_dir)
    if not resume and out.exists() and any(out.iterdir()):
        if not overwrite:
            _flag_error(
                "--output-dir",
                f"{out} holds an earlier run; add --resume to finish it, --overwrite to move it aside, "
                "or name another directory",
            )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = next(
            path
            for n in range(1000)
            if not (path := out.with_name(f"{out.name}.{stamp}" + (f".{n}" if n else ""))).exists()
        )
        out.rename(aside)
        click.echo(f"jailbox: moved the earlier run in {out} to {aside}", err=True)
    with _fed_by():
        fields: dict[str, Any] = {"model": llm_name, "max_retries": llm_max_retries, **bounds}
        if llm_base_url:
            fields["base_url"] = llm_base_url
        if api_key:
            fields["api_key"] = api_key
        config = BatchConfig(
            workers=workers,
            max_starting=min(workers, 4),
            mode=mode,
            resume=resume,
            ray_address=ray_address,
            inputs_root=Path(inputs_root or Path(tasks_file).parent).resolve(),
            copy_out=list(copy_out),
        )
        batch = Batch(
            tasks,
            LLMConfig(**fields),
            out,
            config,
            SandboxConfig(rootfs=rootfs or default_rootfs(), network=network, **shaped),
            AgentConfig(max_steps=max_steps, time_limit=time_limit),
            executor=executor_factory,
            scorers=scorers,
        )
    pending = len(batch.pending())
    progress = Progress(pending, sys.stdout, already=len(tasks) - pending)
    batch.observer = progress

    def interrupt(*_: object) -> None:
        if batch.stopping.is_set():
            progress.note("jailbox: killing the running tasks")
            batch.kill()
        else:
            progress.note("jailbox: finishing the running tasks (Ctrl-C again to kill them)")
            batch.stop()

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with progress:
            finished = batch.run()
    except ExecutorError as exc:
        click.echo(printable(f"jailbox: {exc}"), err=True)
        sys.exit(2)
    finally:
        signal.signal(signal.SIGINT, previous)
    click.echo(printable(write_summary(read_results(batch.results_path), Path(output_dir))))
    if batch.stopping.is_set():
        sys.exit(130)  # interrupted: the results file has what finished, --resume does the rest
    cause = common_failure(finished)
    if cause is not None:
        click.echo(printable(f"jailbox: every task failed alike, so nothing was measured: {cause}"), err=True)
        if cause.startswith("llm_error"):
            click.echo(printable(f"jailbox: {llm_advice(cause, batch.job.llm.base_url)}"), err=True)
        sys.exit(1)


@main.command()
@click.argument("trajectories", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_agent_jail_options
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Per-command timeout.")
@click.option(
    "--input-dir",
    "--input_dir",
    "input_dir",
    type=click.Path(exists=True, file_okay=False),
    help="The task's input files, copied to /testbed/input first, e.g. examples/09_long_context/input.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(trajectories: tuple[str, ...], timeout: float, input_dir: str | None, as_json: bool, **jail: Any) -> None:
    """Re-run each TRAJECTORY's actions (jailbox's or the reference package's) in a fresh sandbox and report,
    step by step, where the observation or exit code now differs; steps that reach the network and steps that
    differ only in times or order get their own columns. Exit 1 if any step differs.

    \b
    Example:
      jailbox replay out/20260101_120000/trajectory.json --input_dir task/input
    """
    import json
    from pathlib import Path

    from .agent.inputs import InputDirError
    from .agent.replay import VERDICTS, StepDiff
    from .agent.replay import replay as run_replay

    config = _config(**{**jail, "rootfs": jail["rootfs"] or default_rootfs()})
    runs: list[tuple[str, list[StepDiff]]] = []
    for trajectory in trajectories:
        try:
            runs.append((trajectory, run_replay(trajectory, config, timeout=timeout, input_dir=input_dir)))
        except InputDirError as exc:
            _flag_error("--input_dir", str(exc))
        except SandboxError as exc:
            click.echo(printable(f"jailbox: {exc}"), err=True)
            sys.exit(125)
    if as_json:
        payload = [{"trajectory": t, "steps": [s.model_dump() for s in steps]} for t, steps in runs]
        click.echo(json.dumps(payload if len(runs) > 1 else payload[0]["steps"]))
    else:
        for trajectory, steps in runs:
            if len(runs) > 1:
                click.echo(printable(f"== {trajectory}", line=True))
            for s in steps:
                line = f"step {s.index:3} {s.verdict:16} {s.action[:90]}" + (f"  ({s.cause})" if s.cause else "")
                click.echo(printable(line, line=True))
                if s.verdict == "differs":
                    click.echo(printable(_trim(s.diff, 1200)))
        names = [printable(Path(t).stem, line=True) for t, _ in runs]
        width = max(len("trajectory"), *map(len, names))
        click.echo(f"{'trajectory':{width}}  steps  " + "  ".join(VERDICTS))
        for name, (_, steps) in zip(names, runs, strict=True):
            cells = "  ".join(f"{sum(s.verdict == v for s in steps):{len(v)}}" for v in VERDICTS)
            click.echo(f"{name:{width}}  {len(steps):5}  {cells}")
        every = [s for _, steps in runs for s in steps]
        counts = {v: sum(s.verdict == v for s in every) for v in VERDICTS}
        click.echo(
            f"{counts['same']} same, {counts['differs']} differ, {counts['network']} used the network, "
            f"{counts['nondeterministic']} nondeterministic"
        )
    sys.exit(1 if any(s.verdict == "differs" for _, steps in runs for s in steps) else 0)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check what this host allows (namespaces, overlayfs, id ranges, seccomp, cgroups) and print fixes.

    \b
    Example:
      jailbox doctor --json
    """
    import json

    from .sandbox.checks.doctor import run

    probes = run()
    if as_json:
        click.echo(json.dumps([p.model_dump() for p in probes], indent=2))
    else:
        width = max(len(p.name) for p in probes)
        for p in probes:
            click.echo(printable(f"{p.status.upper():9} {p.name:{width}}  {p.detail}"))
            if p.fix:
                click.echo(printable(f"{'':9} {'':{width}}  fix: {p.fix}"))
    sys.exit(1 if any(p.status == "failing" for p in probes) else 0)


@main.command()
@click.option("--force", is_flag=True, help="Also remove sandboxes whose host process still runs.")
def cleanup(force: bool) -> None:
    """Remove what crashed host processes left: jail processes, writable layers, state, cgroups.

    \b
    Example:
      jailbox cleanup
    """
    from .sandbox.limits.cgroups import reap_stale as reap_stale_cgroups
    from .sandbox.service.client import remove_stale_socket
    from .sandbox.state import cleanup as cleanup_state
    from .sandbox.state import state_dir

    removed, failed = cleanup_state(state_dir(), force=force)
    stale = remove_stale_socket()  # a killed service's; its sandboxes are among the removed
    # --force does not reach the cgroups of live owners: they go when it closes its sandboxes
    groups_removed, groups_failed = reap_stale_cgroups()
    for path in [*removed, *([stale] if stale else []), *groups_removed]:
        click.echo(f"removed {path}")
    for path, why in failed + groups_failed:
        click.echo(f"could not remove {path}: {why}", err=True)
    groups = f"cgroups: {len(groups_removed)} removed, {len(groups_failed)} failed"
    click.echo(f"{len(removed)} removed, {len(failed)} failed; {groups}")
    sys.exit(1 if failed or groups_failed else 0)


# --- long-lived sandboxes, held by the per-user service (sandbox/service/) ----------------------


def _service_fail(exc: Exception, code: int = 1) -> NoReturn:
    click.echo(printable(f"jailbox: {exc}"), err=True)
    sys.exit(code)


def _service_call(request: Any, start: bool = False) -> Any:
    """Send one request to this user's service (started on demand only for ``start``); None when no
    service runs."""
    from .sandbox.service.client import connect

    conn = connect(start)
    if conn is None:
        return None
    with conn:
        return conn.call(request)


def _service_exec(ref: str, command: tuple[str, ...], timeout: float | None, jail: dict[str, Any]) -> NoReturn:
    """``exec --id``: output streams as it comes, stdin (unless a terminal) streams in, the exit code comes
    back. Ctrl-C drops the connection and the service kills the command's whole tree."""
    from click.core import ParameterSource
    from pydantic import ValidationError

    from .sandbox.service import protocol
    from .sandbox.service.client import connect

    ctx = click.get_current_context()
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    for name in jail:
        given = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        if given and name not in ("workdir", "envs"):
            raise click.UsageError(
                f"{flags[name]} cannot change a running sandbox (only --workdir and --env can, per command); "
                f"give it to jailbox create, e.g. jailbox create {flags[name]} ..."
            )
    with _fed_by("--env"):
        env = _env_pairs(jail["envs"])
    try:
        request = protocol.Exec(
            op="exec",
            id=ref,
            argv=list(command),
            cwd=jail["workdir"],
            env=env,
            timeout=timeout,
            stdin=sys.stdin is not None and not sys.stdin.isatty(),
        )
    except ValidationError as exc:
        raise click.UsageError(
            f"--id {ref!r}: expected an id or name from jailbox ps ({exc.errors()[0]['msg']})"
        ) from None
    streams = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def show(stream: str, data: bytes) -> None:
        streams[stream].write(data)
        streams[stream].flush()

    try:
        conn = connect(start=False)
        if conn is None:
            raise SandboxError(f"no sandbox {ref!r} (no jailbox service runs); jailbox ps lists them")
        with conn:
            exited = conn.exec(request, sys.stdin.fileno() if request.stdin else None, show)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted; the command's processes were killed", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)  # our own stdout closed (| head): as a shell's command would end
    except SandboxError as exc:
        _service_fail(exc, 125)
    if exited.timed_out:
        click.echo(f"jailbox: command timed out after {timeout}s and was killed", err=True)
        sys.exit(TIMEOUT_EXIT)
    sys.exit(exited.exit)


@main.command()
@_jail_options
@click.option("--name", default=None, help="A unique name to use wherever an ID goes.")
def create(name: str | None, **jail: Any) -> None:
    """Create a sandbox that lives until jailbox stop, and print its ID. jailbox exec --id ID, cp, ps and
    stop use it; a per-user service holds it (started on demand, gone once idle).

    \b
    Example:
      jailbox create --rootfs python:3.11-slim --name work
    """
    from pydantic import ValidationError

    from .sandbox.service import protocol

    config = _config(**jail)
    if config.rootfs != "host" and os.sep in config.rootfs:
        config = config.model_copy(update={"rootfs": os.path.abspath(config.rootfs)})  # the service's cwd is /
    try:
        request = protocol.Create(op="create", config=config.model_dump(mode="json"), name=name)
    except ValidationError:
        raise click.BadParameter(
            f"{name!r}: letters, digits, '_', '.', '-', at most 64, e.g. --name web-1", param_hint="--name"
        ) from None
    try:
        click.echo(_service_call(request, start=True).id)
    except SandboxError as exc:
        _service_fail(exc)


def _server_options(command: Any) -> Any:
    """--server and --api-key-file: ps and stop against a running jailbox serve instead."""
    command = click.option(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="With --server: the server's key (default $E2B_API_KEY, else, for loopback, jailbox serve's own file).",
    )(command)
    return click.option(
        "--server", default=None, metavar="URL", help="A running jailbox serve's URL, e.g. http://127.0.0.1:49982."
    )(command)


def _server_call(call: Any) -> None:
    from .sandbox.serve.client import ClientError

    try:
        call()
    except ClientError as exc:
        click.echo(printable(f"jailbox: {exc}", line=True), err=True)  # one line, whatever the server sent
        sys.exit(exc.code)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_server_options
def ps(as_json: bool, server: str | None, api_key_file: str | None) -> None:
    """List the sandboxes jailbox create made (ID, name, rootfs, created, state; --json adds their bounds), or
    with --server those a jailbox serve holds for your key (and when each expires).

    \b
    Example:
      jailbox ps --json
      jailbox ps --server http://127.0.0.1:49982
    """
    if server is not None:
        from .sandbox.serve import client

        _server_call(lambda: client.ps(server, api_key_file, as_json))
        return
    if api_key_file is not None:
        _flag_error("--api-key-file", "goes with --server URL (the server the key is for)")
    import json

    from .sandbox.service import protocol

    try:
        reply = _service_call(protocol.List(op="ps"))
    except SandboxError as exc:
        _service_fail(exc)
    boxes = reply.sandboxes if reply is not None else []
    if as_json:
        click.echo(json.dumps([b.model_dump() for b in boxes], indent=2))
        return
    click.echo(f"{'ID':12}  {'NAME':20}  {'ROOTFS':24}  {'CREATED':19}  STATE")
    for b in boxes:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.created))
        click.echo(printable(f"{b.id:12}  {b.name or '-':20}  {b.rootfs:24}  {created:19}  {b.state}", line=True))


@main.command()
@click.argument("refs", metavar="ID...", nargs=-1)
@click.option("--all", "stop_all", is_flag=True, help="Stop every sandbox.")
@_server_options
def stop(refs: tuple[str, ...], stop_all: bool, server: str | None, api_key_file: str | None) -> None:
    """Stop sandboxes (IDs, unique ID prefixes or names): kill their processes, remove their state. With
    --server, kill a jailbox serve's sandboxes of your key (IDs or unique prefixes).

    \b
    Example:
      jailbox stop work
      jailbox stop --server http://127.0.0.1:49982 jb4f2e
    """
    if not refs and not stop_all:
        raise click.UsageError("name the sandboxes to stop, e.g. jailbox stop 3f2a9c, or give --all")
    if server is not None:
        from .sandbox.serve import client

        _server_call(lambda: client.stop(server, api_key_file, refs, stop_all))
        return
    if api_key_file is not None:
        _flag_error("--api-key-file", "goes with --server URL (the server the key is for)")
    from pydantic import ValidationError

    from .sandbox.service import protocol

    try:
        request = protocol.Stop(op="stop", ids=list(refs), all=stop_all)
    except ValidationError:
        raise click.UsageError(f"{refs}: expected ids or names from jailbox ps, e.g. jailbox stop 3f2a9c") from None
    try:
        reply = _service_call(request)
    except SandboxError as exc:
        _service_fail(exc)
    if reply is None and refs:
        _service_fail(SandboxError(f"no sandbox {refs[0]!r}; jailbox ps lists them"))
    for sid in reply.stopped if reply is not None else []:
        click.echo(sid)


def _cp_side(arg: str) -> tuple[str | None, str]:
    """``ID:/path`` (a sandbox's path) or a host path; a host path with a colon can be written ./a:b."""
    ref, sep, path = arg.partition(":")
    if sep and ref and "/" not in ref and not ref.startswith("."):
        return ref, path
    return None, arg


@main.command()
@click.argument("src")
@click.argument("dst")
def cp(src: str, dst: str) -> None:
    """Copy between the host and a sandbox: SRC or DST (one of them) is ID:PATH. DST is the path the
    copy gets; one ending in / means inside that directory. Links the jail left are never followed.

    \b
    Example:
      jailbox cp ./data.csv work:/testbed/
    """
    from pydantic import ValidationError

    from .sandbox.service import protocol

    (src_ref, src_path), (dst_ref, dst_path) = _cp_side(src), _cp_side(dst)
    if (src_ref is None) == (dst_ref is None):
        raise click.UsageError("exactly one of SRC and DST is ID:PATH, e.g. jailbox cp ./in.txt 3f2a9c:/work/in.txt")
    if dst_path.endswith("/"):
        dst_path += os.path.basename(src_path.rstrip("/"))
    op: Literal["get", "put"] = "get" if src_ref is not None else "put"
    ref = src_ref or dst_ref or ""
    host, jail = (dst_path, src_path) if op == "get" else (src_path, dst_path)
    try:
        request = protocol.Copy(op=op, id=ref, host=os.path.abspath(host), jail=jail)
    except ValidationError as exc:
        raise click.UsageError(f"cp {src} {dst}: {exc.errors()[0]['msg']}") from None
    try:
        reply = _service_call(request)
    except SandboxError as exc:
        _service_fail(exc)
    if reply is None:
        _service_fail(SandboxError(f"no sandbox {ref!r}; jailbox ps lists them"))


@main.command("serve")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="address to bind (loopback unless exposed on purpose)"
)
@click.option("--port", type=click.IntRange(0, 65535), default=49982, show_default=True)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False),
    help="keys, one a line (default: made on first start)",
)
@click.option("--max-sandboxes", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--max-per-key", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--timeout",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="a sandbox's default lifetime, seconds",
)
@click.option("--max-timeout", type=click.IntRange(min=1), default=86400, show_default=True)
@click.option("--warm", type=click.IntRange(0, 64), default=2, show_default=True, help="jails kept ready per template")
@click.option("-v", "--verbose", is_flag=True, help="log every request")
@_bound_options
def serve_cmd(
    host: str,
    port: int,
    api_key_file: str | None,
    max_sandboxes: int,
    max_per_key: int,
    timeout: int,
    max_timeout: int,
    warm: int,
    verbose: bool,
    **bounds: Any,
) -> None:
    """Serve sandboxes over the E2B API, for the E2B SDKs (see docs/e2b.md).
    Each sandbox gets the bounds given here (the API has no way to ask for others).

    \b
    Example:
      jailbox serve --port 49982 --memory 1g --cpus 1
    """
    limits = _limits(**bounds)  # a bad bound is named before anything else is loaded or started
    from pathlib import Path

    from .sandbox.serve.keys import KeyFileError
    from .sandbox.serve.listen import BadFlag

    try:
        from .sandbox.serve.main import run
    except ImportError as exc:
        _missing_extra("serve", exc)
    try:
        keys = Path(api_key_file) if api_key_file is not None else None
        run(host, port, keys, max_sandboxes, max_per_key, timeout, max_timeout, warm, verbose, limits)
    except BadFlag as exc:
        _flag_error(exc.flag, str(exc))
    except KeyFileError as exc:  # its text names the flag and the file: --api-key-file PATH: ...
        _flag_error("", str(exc))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("mcp")
@click.option("--http", is_flag=True, help="Serve streamable HTTP at /mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http: the address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="With --http (0: any).")
@click.option(
    "--token-file",
    default=None,
    metavar="FILE",
    help="With --http: tokens, one a line, that clients send as Authorization: Bearer TOKEN (default: made on "
    "first start).",
)
@click.option("--max-sandboxes", type=click.IntRange(1, 1024), default=8, show_default=True, help="Per session.")
@click.option("--allow-host-network", is_flag=True, help="Let clients ask for network 'host' (unconfined).")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True, help="With --http.")
def mcp_cmd(http: bool, host: str, port: int, token_file: str | None, idle_timeout: float, **limits: Any) -> None:
    """Serve sandboxes to an MCP client: tools to create, run, read, write, list and kill; they end with the session.

    \b
    Example:
      jailbox mcp                      # what a client's mcpServers entry runs (stdio)
      jailbox mcp --http --port 8765   # http://127.0.0.1:8765/mcp
    """
    from .sandbox.serve.keys import KeyFileError
    from .sandbox.serve.listen import BadFlag

    try:
        from .sandbox.serve import mcp
    except ImportError as exc:
        _missing_extra("mcp", exc)
    try:
        mcp.main(
            http,
            host,
            port,
            token_file,
            mcp.Options(idle_timeout=idle_timeout, **limits),
        )
    except BadFlag as exc:
        _flag_error(exc.flag, str(exc))
    except KeyFileError as exc:  # its text names the flag and the file: --api-key-file PATH: ...
        _flag_error("", str(exc))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("_service", hidden=True)
@click.option("--idle", type=click.FloatRange(min=0, min_open=True), default=300.0)
@click.option("--warm", is_flag=True, help="Make the fast path's default sandboxes at once.")
def service_cmd(idle: float, warm: bool) -> None:
    """The per-user service that holds jailbox create's sandboxes (started by the first create).

    \b
    Example:
      jailbox _service --idle 60
    """
    from .sandbox.service.server import main as serve

    serve(idle, warm)


def settings_reference(group: click.Group, ctx: click.Context, indent: str = "") -> list[str]:
    """The config file's every key, a section per command (a group's nested), with its default and the flag
    it sets: read off the commands themselves, so it cannot drift from them."""
    import json

    lines = []
    for name, keys in _settings_keys(group, ctx).items():
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            lines += [f"{indent}{name}:", *settings_reference(command, ctx, indent + "  ")]
            continue
        if not keys:
            continue
        lines.append(f"{indent}{name}:")
        for key, param in keys.items():
            default = param.default
            if isinstance(default, tuple | list):
                default = list(default)
            elif not isinstance(default, str | int | float | bool):  # click's "no default" marker, or a callable
                default = [] if param.multiple else False if param.is_flag else None
            value = json.dumps(default)
            flag = next(opt for opt in param.opts if opt.startswith("--"))  # its name; aliases come after it
            what = f"{flag}{' (repeatable: a list)' if param.multiple else ''}"
            help_text = " ".join((param.help or "").split())
            lines.append(f"{indent}  {key}: {value}  # {what}{': ' + help_text if help_text else ''}")
    return lines


@main.command("config")
@click.option("--reference", is_flag=True, help="Print every key the config file takes, per command.")
@click.pass_context
def config_cmd(ctx: click.Context, reference: bool) -> None:
    """Show where the config file is (and whether it exists), or with --reference every key it takes:
    a section per command, a key per option (its name with - or _), its value what the flag takes.

    \b
    Example:
      jailbox config --reference > ~/.config/jailbox/config.yaml.example
    """
    path = _settings_path()
    if not reference:
        click.echo(
            f"{path} ({'in use' if os.path.exists(path) else 'none yet'}); `jailbox config --reference` lists its keys"
        )
        return
    root = ctx.find_root()
    click.echo(f"# {path}: defaults per command; a flag given on the command line wins")
    for line in settings_reference(main, root):
        click.echo(line)


@main.group("rootfs")
def rootfs_group() -> None:
    """Root filesystems: pull OCI images, import archives, list and remove them.

    \b
    Example:
      jailbox rootfs pull python:3.11-slim && jailbox exec --rootfs python:3.11-slim -- python3 -V
    """


def _rootfs_fail(exc: Exception) -> NoReturn:
    click.echo(printable(f"jailbox: {exc}"), err=True)
    sys.exit(1)


def _progress() -> Any:
    """Download progress on stderr: on a terminal one line per blob redrawn in place; piped (CI logs, a
    file) one line per blob when it has arrived, never a carriage return."""
    tty = sys.stderr.isatty()
    last = {"t": 0.0}

    def show(digest: str, done: int, total: int | None) -> None:
        if not tty:
            if done == total:
                click.echo(f"{digest[7:19]}  {done / 1e6:9.1f} MB  downloaded", err=True)
            return
        now = time.monotonic()
        if now - last["t"] < 0.1 and done != total:
            return
        last["t"] = now
        pct = f"{100 * done / total:5.1f}%" if total else ""
        click.echo(f"\r{digest[7:19]}  {done / 1e6:9.1f} MB {pct}", nl=done == total, err=True)

    return show


def _interrupt_once(signum: int, frame: object) -> None:
    """SIGINT handler for commands that clean up after Ctrl-C: the first one interrupts; more are
    ignored until the cleanup (bounded) is done, and so are its helpers', which inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


@rootfs_group.command("pull")
@click.argument("ref")
@click.option("--name", default=None, help="Store it under this name (default: the full reference).")
@click.option("--platform", default=None, help="os/arch[/variant] from a multi-platform image (default: this host).")
@click.option("--insecure", is_flag=True, help="Plain HTTP (always allowed for localhost registries).")
def rootfs_pull(ref: str, name: str | None, platform: str | None, insecure: bool) -> None:
    """Pull image REF (python:3.11-slim, ghcr.io/org/img@sha256:..., localhost:5000/x:y), no Docker.

    \b
    Example:
      jailbox rootfs pull python:3.11-slim --name py311
    """
    from .sandbox.rootfs.pull import pull

    default_sigint = signal.signal(signal.SIGINT, _interrupt_once)
    try:
        entry = pull(ref, name, platform=platform, insecure=insecure, progress=_progress(), log=click.echo)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted; nothing stored (what was downloaded is kept: pull again to resume)", err=True)
        sys.exit(130)
    except SandboxError as exc:
        _rootfs_fail(exc)
    finally:
        signal.signal(signal.SIGINT, default_sigint)
    click.echo(f"{entry.name}  {entry.digest}  {entry.tree}")


def _build_display(tty: bool) -> Any:
    """Shows a build's progress on stderr: stages as lines; package progress redrawn in place on a terminal,
    and piped every ``PIPED_EVERY``-th package of a phase and its last (a line per package is too many)."""
    shown = {"transient": False}

    def show(update: Any) -> None:
        text = printable(update.text, line=True)  # mmdebstrap's lines name what the mirror sent
        if tty and update.transient:
            click.echo(f"\r\x1b[2K{text}", nl=False, err=True)
        elif update.transient and update.count % PIPED_EVERY and update.count != update.total:
            return
        else:
            click.echo(("\r\x1b[2K" if tty and shown["transient"] else "") + text, err=True)
        shown["transient"] = tty and update.transient

    return show


@rootfs_group.command("build")
@click.argument("name", required=False)
@click.option(
    "--recipe",
    default=None,
    help="A recipe file, or a shipped recipe's name [default: NAME, which must then be one; no NAME: default].",
)
@click.option("--quiet", "-q", is_flag=True, help="Do not show mmdebstrap's progress.")
def rootfs_build(name: str | None, recipe: str | None, quiet: bool) -> None:
    """Build a root filesystem with mmdebstrap (rootless with subordinate ids, or as root).

    With no arguments it builds the paper's environment as "default".

    \b
    Example:
      jailbox rootfs build slim
    """
    from .sandbox.rootfs import build, shipped

    if recipe is None:
        if name is not None and name not in shipped.names():
            _rootfs_fail(build.unknown_recipe(name))  # a typo must not build the 1.4 GB default
        recipe = name or "default"
    started = time.monotonic()
    default_sigint = signal.signal(signal.SIGINT, _interrupt_once)
    try:
        entry = build.build(name, recipe, log=None if quiet else _build_display(sys.stderr.isatty()))
    except build.Interrupted as exc:
        done = f"stopped mmdebstrap, removed the unfinished tree {exc.removed}" if exc.removed else "nothing started"
        click.echo(f"jailbox: interrupted; {done}; nothing stored", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted before the build started; nothing stored", err=True)
        sys.exit(130)
    except SandboxError as exc:
        _rootfs_fail(exc)
    finally:
        signal.signal(signal.SIGINT, default_sigint)
    took = time.monotonic() - started
    click.echo(f"{entry.name}  {entry.size / 1e6:.0f} MB in {took:.0f} s  {entry.tree}")


@rootfs_group.command("import")
@click.argument("source", type=click.Path(exists=True))
@click.argument("name")
@click.option("--platform", default=None, help="os/arch from a multi-platform OCI layout (default: this host).")
@click.option("--tag", default=None, help="Which image of an archive or layout holding several (its tag).")
def rootfs_import(source: str, name: str, platform: str | None, tag: str | None) -> None:
    """Import SOURCE (docker/podman save archive, OCI layout directory, rootfs tarball) as NAME.

    \b
    Example:
      docker save python:3.11-slim -o py.tar && jailbox rootfs import py.tar py311
    """
    from .sandbox.rootfs.importer import import_rootfs

    try:
        entry = import_rootfs(source, name, platform=platform, tag=tag)
    except SandboxError as exc:
        _rootfs_fail(exc)
    click.echo(f"{entry.name}  {entry.tree}")


@rootfs_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rootfs_list(as_json: bool) -> None:
    """Stored root filesystems with kind, size, creation date and source.

    \b
    Example:
      jailbox rootfs list --json
    """
    import json

    from .sandbox.rootfs.store import Store

    store = Store()
    entries = store.list()
    if as_json:
        click.echo(json.dumps([{**e.model_dump(mode="json"), "path": str(e.tree)} for e in entries], indent=2))
        return
    if not entries:
        click.echo(
            f"no root filesystems stored in {store.root}; get one with `jailbox rootfs pull python:3.11-slim` "
            "or `jailbox rootfs build` (or use --rootfs host, which needs none)",
            err=True,
        )
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created))
        click.echo(f"{e.name:40} {e.kind:6} {e.size / 1e6:9.1f} MB  {created}  {e.source}")


@rootfs_group.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Remove even while live sandboxes use it.")
def rootfs_rm(names: tuple[str, ...], force: bool) -> None:
    """Remove stored root filesystems (their files may belong to subordinate ids).

    \b
    Example:
      jailbox rootfs rm py311
    """
    from .sandbox.rootfs.store import Store

    store = Store()
    for name in names:
        try:
            click.echo(f"removed {store.remove(name, force=force).name}")
        except SandboxError as exc:
            _rootfs_fail(exc)


@rootfs_group.command("path")
@click.argument("name")
def rootfs_path(name: str) -> None:
    """Print the directory of a stored root filesystem.

    \b
    Example:
      ls "$(jailbox rootfs path default)/usr/bin"
    """
    from .sandbox.rootfs.store import Store

    try:
        click.echo(str(Store().require(name).tree))
    except SandboxError as exc:
        _rootfs_fail(exc)


@rootfs_group.command("du")
@click.argument("name")
def rootfs_du(name: str) -> None:
    """Bytes used by a stored root filesystem (apparent and on disk; hard links once).

    \b
    Example:
      jailbox rootfs du default
    """
    from .sandbox.rootfs.store import Store

    try:
        usage = Store().du(name)
    except SandboxError as exc:
        _rootfs_fail(exc)
    click.echo(
        f"{usage['bytes'] / 1e6:.1f} MB apparent, {usage['disk'] / 1e6:.1f} MB on disk, {usage['entries']} entries"
    )


if __name__ == "__main__":
    main()
