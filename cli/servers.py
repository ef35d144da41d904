"""``jailbox serve`` (the E2B API), ``jailbox mcp`` (an MCP server), ``jailbox openenv`` (an OpenEnv
environment) and the hidden ``_service`` (the per-user service behind ``jailbox create``).

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .app import main
from .errors import _fed_by, _flag_error, _missing_extra
from .options import NETWORK_HELP, SECRET_OPTION, _bound_options, _config, _jail_options, _limits, _secrets

if TYPE_CHECKING:
    from ..sandbox import Limits
    from ..servers.e2b.registry import Shape


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
@click.option("--network", default="none", show_default=True, metavar="MODE", help=NETWORK_HELP)
@SECRET_OPTION
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
    network: str,
    secrets: tuple[str, ...],
    **bounds: Any,
) -> None:
    """Serve sandboxes over the E2B API, for the E2B SDKs (see docs/e2b.md).
    Each sandbox gets the bounds, network and secrets given here (the API has no way to ask for
    others); a secret needs a stored root filesystem as the template.

    \b
    Example:
      jailbox serve --port 49982 --memory 1g --cpus 1
      jailbox serve --network allow:github --secret GITHUB_TOKEN@api.github.com
    """
    shape = _shape(network, secrets, _limits(**bounds))  # named before anything is loaded or started
    from pathlib import Path

    from ..servers.keys import KeyFileError
    from ..servers.listen import BadFlag

    try:
        from ..servers.e2b.main import run
    except ImportError as exc:
        _missing_extra("serve", exc)
    try:
        keys = Path(api_key_file) if api_key_file is not None else None
        run(host, port, keys, max_sandboxes, max_per_key, timeout, max_timeout, warm, verbose, shape)
    except BadFlag as exc:
        _flag_error(exc.flag, str(exc))
    except KeyFileError as exc:  # its text names the flag and the file: --api-key-file PATH: ...
        _flag_error("", str(exc))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _shape(network: str, secrets: tuple[str, ...], limits: Limits) -> Shape:
    """What every sandbox ``serve`` makes gets from its flags, checked together as a sandbox made
    over a stored root filesystem would be (a secret needs one: the E2B template names it)."""
    from ..sandbox import NetworkPolicy, SandboxConfig

    with _fed_by("--network"):
        policy = NetworkPolicy.parse(network)
    held = _secrets(secrets)
    with _fed_by("--secret"):  # the bounds and the network are checked already: what is left is the secrets'
        SandboxConfig(rootfs="default", network=policy, secrets=held, limits=limits)
    return {"limits": limits, "network": policy, "secrets": held}


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
@click.option(
    "--max-checkpoints",
    type=click.IntRange(0, 1024),
    default=8,
    show_default=True,
    help="Per sandbox (each holds a copy of what the sandbox wrote, on this host's disk).",
)
@click.option(
    "--max-snapshots",
    type=click.IntRange(0, 100_000),
    default=32,
    show_default=True,
    help="Snapshots in your store past which clients may take no more (each outlives the server).",
)
@click.option("--allow-host-network", is_flag=True, help="Let clients ask for network 'host' (unconfined).")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True, help="With --http.")
def mcp_cmd(http: bool, host: str, port: int, token_file: str | None, idle_timeout: float, **limits: Any) -> None:
    """Serve sandboxes to an MCP client: tools to create, run, read, write, branch and kill; they end with the session.

    \b
    Example:
      jailbox mcp                      # what a client's mcpServers entry runs (stdio)
      jailbox mcp --http --port 8765   # http://127.0.0.1:8765/mcp
    """
    from ..servers.keys import KeyFileError
    from ..servers.listen import BadFlag

    try:
        from ..servers import mcp
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


@main.command("openenv")
@_jail_options
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless exposed on purpose)."
)
@click.option("--port", type=click.IntRange(0, 65535), default=8100, show_default=True, help="0: any free port.")
@click.option(
    "--token-file",
    default=None,
    metavar="FILE",
    help="Tokens, one a line; a client's URL starts with one: http://HOST:PORT/TOKEN (default: made on first start).",
)
@click.option("--max-episodes", type=click.IntRange(1, 1024), default=8, show_default=True, help="Live sandboxes.")
@click.option("--max-connections", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option("--episodes-per-minute", type=click.IntRange(1, 100_000), default=60, show_default=True)
@click.option(
    "--step-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds a step's command may run (a step's timeout_s may ask less).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=900.0,
    show_default=True,
    help="Seconds without a message before a connection and its sandbox end.",
)
@click.option(
    "--max-message", type=click.IntRange(1 << 10, 64 << 20), default=1 << 20, show_default=True, help="Bytes."
)
@click.option(
    "--output-limit",
    type=click.IntRange(1, 16 << 20),
    default=64 << 10,
    show_default=True,
    help="Bytes kept of each output stream per step (head and tail).",
)
@click.option(
    "--reward-command",
    default=None,
    metavar="CMD",
    help="What an 'evaluate' step runs in the sandbox: exit 0 is reward 1.0, anything else 0.0.",
)
def openenv_cmd(host: str, port: int, token_file: str | None, **given: Any) -> None:
    """Serve sandboxes as an OpenEnv environment, for openenv-core's GenericEnvClient (see docs/rl.md): each
    connection's reset starts a sandbox (over --snapshot when given), a step runs a command or writes a file.

    \b
    Example:
      jailbox openenv --port 8100 --memory 1g --max-episodes 16
      jailbox openenv --snapshot repo-ready --step-timeout 60 --reward-command 'cd /repo && pytest -q'
    """
    names = ("max_episodes", "max_connections", "episodes_per_minute", "step_timeout", "idle_timeout", "max_message")
    bounds = {name: given.pop(name) for name in (*names, "output_limit", "reward_command")}
    if bounds["reward_command"] is not None and not bounds["reward_command"].strip():
        _flag_error("--reward-command", "an empty command", "--reward-command 'cd /repo && pytest -q'")
    config = _config(**given)
    from pathlib import Path

    from ..servers.keys import KeyFileError
    from ..servers.listen import BadFlag

    try:
        from ..servers import openenv
    except ImportError as exc:
        _missing_extra("openenv", exc)
    if config.snapshot is not None:
        from ..sandbox import snapshots
        from ..sandbox.errors import SnapshotNotFound

        try:
            snapshots.get(config.snapshot)
        except SnapshotNotFound as exc:
            _flag_error("--snapshot", f"{exc} (jailbox snapshots lists them)")
    try:
        openenv.main(config, host, port, Path(token_file) if token_file else None, openenv.Options(**bounds))
    except BadFlag as exc:
        _flag_error(exc.flag, str(exc))
    except KeyFileError as exc:  # its text names the flag and the file: --token-file PATH: ...
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
    from ..servers.exec_service.server import main as serve

    serve(idle, warm)
