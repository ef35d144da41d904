"""Option groups shared by the commands (a jail's shape, its bounds, an agent's model bounds) and
what they build (``SandboxConfig``, ``Limits``), with the help texts they share.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..sandbox.limits import DEFAULT_DISK, DEFAULT_INODES, DEFAULT_MEMORY, DEFAULT_PIDS  # constants only

if TYPE_CHECKING:
    from ..sandbox import Limits, SandboxConfig

from .errors import _fed_by

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


CAP_HELP = "uid 0 {} capability NAME in the jail's user namespace (capabilities(7), CAP_ optional, or ALL)."


CA_CERT_HELP = (
    "Trust the CA certificates of PEM file FILE inside the jail too (repeatable): appended to the root filesystem's "
    "bundles (system, pip's certifi) in its writable layer, for a TLS-intercepting proxy."
)


def _group(name: str, *options: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``options`` (click options, or groups of them such as ``_shaping_options``), shown in that order, that
    reach the command as one argument ``name``: a dict of their values by parameter name, for a builder that
    takes them as keywords. A command of many flags then declares a few groups, not a parameter a flag."""

    def probe() -> None: ...

    for option in options:
        option(probe)
    names = {param.name for param in getattr(probe, "__click_params__", ())}

    def add(func: Any) -> Any:
        @functools.wraps(func)  # click reads the help from the docstring, and the options declared below
        def command(**given: Any) -> Any:
            rest = {key: value for key, value in given.items() if key not in names}
            return func(**rest, **{name: {key: given[key] for key in names}})

        for option in reversed(options):
            command = option(command)
        return command

    return add


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
    from ..sandbox import Limits

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
    from ..sandbox.config import parse_size

    with _fed_by("--llm-max-reply"):
        return {"max_reply_bytes": parse_size(max_reply), "timeout": {"total": timeout}}


def _endpoint(llm_name: str, base_url: str | None, api_key: str | None) -> dict[str, Any]:
    """``LLMConfig``'s model, base_url and api_key from the endpoint flags `run` and `bench` share: a litellm
    provider prefix of the name picks its endpoint (``route_model``) unless --llm-base-url names one."""
    from ..agent.llm import route_model

    model, provider_url = route_model(llm_name)
    fields: dict[str, Any] = {"model": model}
    if base_url or provider_url:
        fields["base_url"] = base_url or provider_url
    if api_key:
        fields["api_key"] = api_key
    return fields


def _agent_jail_options(func: Any) -> Any:
    """``_jail_options`` with the agent commands' defaults: the paper's environment and network."""
    return _jail_options(func, rootfs=None, network="full")


SECRET_OPTION = click.option(
    "--secret",
    "secrets",
    multiple=True,
    metavar="NAME@HOST[,HOST][:FILE]",
    help="A credential commands see only as a placeholder in $NAME; its value from $NAME here, or FILE; "
    "added at jailbox's proxy to HTTPS requests to HOST (repeatable; docs/secrets.md).",
)


def _secrets(texts: tuple[str, ...]) -> list[Any]:
    """``--secret`` flags as ``Secret``s, their values from this process's environment or files."""
    if not texts:
        return []
    from ..sandbox.net.secrets import from_flag

    with _fed_by("--secret"):
        return [from_flag(text, dict(os.environ)) for text in texts]


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
        click.option(
            "--snapshot",
            default=None,
            metavar="ID|NAME",
            help="Start from a snapshot (jailbox snapshots), over the root filesystem it was made over.",
        ),
        click.option("--workdir", default=None, help="Working directory inside [default: the image's, else /testbed]."),
        click.option("--env", "envs", multiple=True, metavar="K=V", help="Set a variable inside (repeatable)."),
        SECRET_OPTION,
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
    snapshot: str | None,
    binds: tuple[str, ...],
    workdir: str | None,
    envs: tuple[str, ...],
    secrets: tuple[str, ...],
    network: str,
    publishes: tuple[str, ...],
    hostname: str,
    upper: str,
    **shaping: Any,
) -> SandboxConfig:
    from ..sandbox import Mount, NetworkPolicy, SandboxConfig

    with _fed_by("--env"):
        env = _env_pairs(envs)
    held = _secrets(secrets)
    with _fed_by("--bind"):
        mounts = [Mount.parse(b) for b in binds]
    with _fed_by("--network"):
        policy = NetworkPolicy.parse(network)
    with _fed_by("--publish"):
        if publishes:
            policy = NetworkPolicy(mode=policy.mode, publish=publishes)
    shaped = _shaped(**shaping)
    extra: dict[str, Any] = {"workdir": workdir} if workdir else {}
    if held:
        extra["secrets"] = held
    if snapshot is not None:
        extra["snapshot"] = snapshot
        if _given("rootfs"):
            extra["rootfs"] = rootfs
    else:
        extra["rootfs"] = rootfs
    with _fed_by():
        return SandboxConfig(mounts=mounts, env=env, network=policy, hostname=hostname, upper=upper, **shaped, **extra)


def _given(name: str) -> bool:
    """Whether the option ``name`` was given (not left to its default), in the command running now."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def _env_pairs(envs: tuple[str, ...]) -> dict[str, str]:
    """``--env K=V`` pairs; a ValueError for one without ``=`` (callers run it under ``_fed_by``)."""
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r}: expected K=V, e.g. --env LANG=C.UTF-8")
        env[key] = value
    return env


def default_rootfs() -> str:
    """What ``run``, ``bench`` and ``replay`` start from unless told: the paper's environment (``default``, the
    name ``jailbox rootfs build`` gives the default recipe's tree) when the store holds it, else the host's."""
    from ..sandbox.rootfs.store import Store

    return "default" if Store().get("default") is not None else "host"
