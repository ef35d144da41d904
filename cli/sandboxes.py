"""Long-lived sandboxes: ``create``, ``exec --id``, ``cp``, ``ps``, ``pause``, ``resume``, ``fork``, ``snapshot``
and ``stop``, through
the per-user service (``servers/exec_service``), or ``ps``/``stop`` against a ``jailbox serve`` with ``--server``.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal, NoReturn

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .app import main
from .errors import SETUP_EXIT, TIMEOUT_EXIT, _fed_by, _flag_error, fail, failing
from .options import _config, _env_pairs, _jail_options


def _service_call(request: Any, start: bool = False) -> Any:
    """Send one request to this user's service (started on demand only for ``start``); None when no
    service runs."""
    from ..servers.exec_service.client import connect

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

    from ..servers.exec_service import protocol
    from ..servers.exec_service.client import connect

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
        fail(exc, SETUP_EXIT)
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

    from ..servers.exec_service import protocol

    config = _config(**jail)
    if config.rootfs != "host" and os.sep in config.rootfs:
        config = config.model_copy(update={"rootfs": os.path.abspath(config.rootfs)})  # the service's cwd is /
    try:
        dumped = config.model_dump(mode="json")
        # the values travel to the user's own service over its private socket; JSON masks them
        dumped["secrets"] = [{**s.model_dump(mode="json"), "value": s.value.get_secret_value()} for s in config.secrets]
        request = protocol.Create(op="create", config=dumped, name=name)
    except ValidationError:
        raise click.BadParameter(
            f"{name!r}: letters, digits, '_', '.', '-', at most 64, e.g. --name web-1", param_hint="--name"
        ) from None
    with failing():
        click.echo(_service_call(request, start=True).id)


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
    from ..servers.e2b.client import ClientError

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
        from ..servers.e2b import client

        _server_call(lambda: client.ps(server, api_key_file, as_json))
        return
    if api_key_file is not None:
        _flag_error("--api-key-file", "goes with --server URL (the server the key is for)")
    import json

    from ..servers.exec_service import protocol

    with failing():
        reply = _service_call(protocol.List(op="ps"))
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
        from ..servers.e2b import client

        _server_call(lambda: client.stop(server, api_key_file, refs, stop_all))
        return
    if api_key_file is not None:
        _flag_error("--api-key-file", "goes with --server URL (the server the key is for)")
    from pydantic import ValidationError

    from ..servers.exec_service import protocol

    try:
        request = protocol.Stop(op="stop", ids=list(refs), all=stop_all)
    except ValidationError:
        raise click.UsageError(f"{refs}: expected ids or names from jailbox ps, e.g. jailbox stop 3f2a9c") from None
    with failing():
        reply = _service_call(request)
    if reply is None and refs:
        fail(SandboxError(f"no sandbox {refs[0]!r}; jailbox ps lists them"))
    for sid in reply.stopped if reply is not None else []:
        click.echo(sid)


def _pause_call(op: Literal["pause", "resume"], ref: str) -> None:
    """``pause`` and ``resume``: the sandbox's ID on stdout; a note on stderr if it was so already."""
    from pydantic import ValidationError

    from ..servers.exec_service import protocol

    try:
        request = protocol.Pause(op=op, id=ref)
    except ValidationError:
        raise click.UsageError(f"{ref!r}: expected an id or name from jailbox ps, e.g. jailbox {op} 3f2a9c") from None
    with failing():
        reply = _service_call(request)
    if reply is None:
        fail(SandboxError(f"no sandbox {ref!r} (no jailbox service runs); jailbox ps lists them"))
    if not reply.changed:
        click.echo(f"jailbox: {reply.id} was {'paused' if op == 'pause' else 'running'} already", err=True)
    click.echo(reply.id)


@main.command()
@click.argument("ref", metavar="ID")
def pause(ref: str) -> None:
    """Pause a sandbox (ID, unique ID prefix or name): every process in it stopped, using no CPU, until
    jailbox resume. Its processes, memory and files stay; exec --id and cp refuse it meanwhile, and a
    command running in it waits, its timeout not counting the pause. Pausing a paused sandbox does nothing.

    \b
    Example:
      jailbox pause work
    """
    _pause_call("pause", ref)


@main.command()
@click.argument("ref", metavar="ID")
def resume(ref: str) -> None:
    """Resume a sandbox jailbox pause stopped: its processes go on where they were. Resuming a running
    sandbox does nothing.

    \b
    Example:
      jailbox resume work
    """
    _pause_call("resume", ref)


@main.command()
@click.argument("ref", metavar="ID")
@click.option(
    "-n", "--count", "count", type=click.IntRange(1, 64), default=1, show_default=True, help="How many children."
)
def fork(ref: str, count: int) -> None:
    """Fork a sandbox (ID, unique ID prefix or name) into N new ones, each starting from its files now, with
    its settings, and print their IDs. Its processes are not copied; it is paused only for the cut. Each
    child lives until jailbox stop, as if made by jailbox create.

    \b
    Example:
      jailbox fork work -n 4
    """
    from pydantic import ValidationError

    from ..servers.exec_service import protocol

    try:
        request = protocol.Fork(op="fork", id=ref, count=count)
    except ValidationError:
        raise click.UsageError(f"{ref!r}: expected an id or name from jailbox ps, e.g. jailbox fork 3f2a9c") from None
    with failing():
        reply = _service_call(request)
    if reply is None:
        fail(SandboxError(f"no sandbox {ref!r} (no jailbox service runs); jailbox ps lists them"))
    for child in reply.made:
        click.echo(child)


@main.command()
@click.argument("ref", metavar="ID")
@click.option("--name", default=None, help="A name to start from it by (moves from an older snapshot).")
def snapshot(ref: str, name: str | None) -> None:
    """Keep a sandbox's files (ID, unique ID prefix or name) as a snapshot that outlives it, and print the
    snapshot's ID. Start sandboxes from it with --snapshot; jailbox snapshots lists and removes them.

    \b
    Example:
      jailbox snapshot work --name repo-ready
      jailbox create --snapshot repo-ready
    """
    from pydantic import ValidationError

    from ..servers.exec_service import protocol

    try:
        request = protocol.Snap(op="snapshot", id=ref, name=name)
    except ValidationError:
        raise click.UsageError(
            f"{ref!r} / --name {name!r}: expected an id or name from jailbox ps, and a name of at most 128 "
            "characters, e.g. jailbox snapshot 3f2a9c --name repo-ready"
        ) from None
    with failing():
        reply = _service_call(request)
    if reply is None:
        fail(SandboxError(f"no sandbox {ref!r} (no jailbox service runs); jailbox ps lists them"))
    click.echo(reply.id)


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

    from ..servers.exec_service import protocol

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
    with failing():
        reply = _service_call(request)
    if reply is None:
        fail(SandboxError(f"no sandbox {ref!r}; jailbox ps lists them"))
