"""The ``jailbox`` command: thin over ``sandbox/`` (parse, call, print)."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import sys
import termios
import tty
from typing import Any

import click
from pydantic import ValidationError

from sandbox import Mount, Sandbox, SandboxConfig
from sandbox.errors import SandboxError
from sandbox.execution import TtyCommand
from sandbox.state import cleanup as cleanup_state
from sandbox.state import state_dir

TIMEOUT_EXIT = 124
SHELL = "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"


def _jail_options(func: Any) -> Any:
    options = [
        click.option("--rootfs", default="host", show_default=True, help='"host" or a root filesystem directory.'),
        click.option(
            "--bind", "binds", multiple=True, metavar="SRC:DST[:ro|rw]", help="Bind a host path (ro default)."
        ),
        click.option("--workdir", default="/testbed", show_default=True, help="Working directory inside."),
        click.option("--env", "envs", multiple=True, metavar="K=V", help="Set a variable inside (repeatable)."),
        click.option("--network", type=click.Choice(["none", "host"]), default="none", show_default=True),
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
    rootfs: str, binds: tuple[str, ...], workdir: str, envs: tuple[str, ...], network: str, hostname: str, upper: str
) -> SandboxConfig:
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: expected K=V", param_hint="--env")
        env[key] = value
    try:
        mounts = [Mount.parse(b) for b in binds]
        return SandboxConfig(
            rootfs=rootfs, mounts=mounts, workdir=workdir, env=env, network=network, hostname=hostname, upper=upper
        )
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """jailbox: rootless sandboxes for running untrusted code and LLM agents, without Docker."""


@main.command("exec", context_settings={"ignore_unknown_options": True})
@_jail_options
@click.option("--timeout", type=float, default=None, help="Kill the command's whole tree after S seconds.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(command: tuple[str, ...], timeout: float | None, **jail: Any) -> None:
    """Run COMMAND in a fresh sandbox; exit with its exit code (124 on timeout)."""
    config = _config(**jail)
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def write(stream: Any) -> Any:
        def callback(data: bytes) -> None:
            stream.write(data)
            stream.flush()

        return callback

    try:
        with Sandbox(config) as sb:
            result = sb.exec(list(command), timeout=timeout, stdin=stdin, on_stdout=write(out), on_stderr=write(err))
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    if result.timed_out:
        click.echo(f"jailbox: command timed out after {timeout}s and was killed", err=True)
        sys.exit(TIMEOUT_EXIT)
    sys.exit(result.exit_code)


@main.command()
@_jail_options
def shell(**jail: Any) -> None:
    """Open an interactive shell on a pty inside a fresh sandbox."""
    config = _config(**jail)
    try:
        with Sandbox(config) as sb:
            code = _interactive(sb)
    except SandboxError as exc:
        click.echo(f"jailbox: {exc}", err=True)
        sys.exit(125)
    sys.exit(code)


def _interactive(sb: Sandbox) -> int:
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()
    interactive = os.isatty(in_fd)
    command = sb.exec_tty(["/bin/sh", "-c", SHELL], env={"TERM": os.environ.get("TERM", "xterm")})

    def resize(*_: object) -> None:
        if interactive:
            size = fcntl.ioctl(in_fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(command.master, termios.TIOCSWINSZ, size)

    resize()
    saved = termios.tcgetattr(in_fd) if interactive else None
    previous = signal.signal(signal.SIGWINCH, resize)
    try:
        if interactive:
            tty.setraw(in_fd, termios.TCSADRAIN)  # keep typeahead
        return _pump(in_fd, out_fd, command)
    finally:
        if saved is not None:
            termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        command.close()


def _pump(in_fd: int, out_fd: int, command: TtyCommand) -> int:
    master = command.master
    watch = [in_fd, master, command.fileno()]
    while True:
        try:
            ready, _, _ = select.select(watch, [], [])
        except InterruptedError:
            continue
        if master in ready and not _copy(master, out_fd):
            watch.remove(master)
        if in_fd in ready and not _copy(in_fd, master):
            watch.remove(in_fd)
        if command.fileno() in ready:
            os.set_blocking(master, False)
            while _copy(master, out_fd):
                pass
            return command.exit_code()


def _copy(src: int, dst: int) -> bool:
    try:
        data = os.read(src, 65536)
    except OSError:
        return False
    if data:
        os.write(dst, data)
    return bool(data)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check what this host allows (namespaces, overlayfs, id ranges, seccomp, cgroups) and print fixes."""
    from sandbox.doctor import run

    probes = run()
    if as_json:
        click.echo(json.dumps([p.model_dump() for p in probes], indent=2))
    else:
        width = max(len(p.name) for p in probes)
        for p in probes:
            click.echo(f"{p.status.upper():9} {p.name:{width}}  {p.detail}")
            if p.fix:
                click.echo(f"{'':9} {'':{width}}  fix: {p.fix}")
    sys.exit(1 if any(p.status == "failing" for p in probes) else 0)


@main.command()
@click.option("--force", is_flag=True, help="Also remove sandboxes whose host process still runs.")
def cleanup(force: bool) -> None:
    """Remove what crashed host processes left: jail processes, writable layers, state."""
    removed, failed = cleanup_state(state_dir(), force=force)
    for path in removed:
        click.echo(f"removed {path}")
    for path, why in failed:
        click.echo(f"could not remove {path}: {why}", err=True)
    click.echo(f"{len(removed)} removed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
