"""``jailbox exec`` and ``jailbox shell``: a command, or an interactive shell, in a fresh jail.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..sandbox.execution import ExecRun

from .app import main
from .errors import SETUP_EXIT, TIMEOUT_EXIT, failing
from .options import _config, _jail_options
from .sandboxes import _service_exec

SHELL = "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"


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
    from ..sandbox import Sandbox
    from ..sandbox.execution import run_sync

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

    with failing(SETUP_EXIT), Sandbox(config) as sb:
        run = sb.begin_exec(list(command), stdin=stdin, on_stdout=write(out), on_stderr=write(err))
        result = run_sync(run, timeout)
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
    from ..sandbox import Sandbox
    from ..sandbox.terminal import attach

    config = _config(**jail)
    with failing(SETUP_EXIT), Sandbox(config) as sb:
        command = sb.exec_tty(["/bin/sh", "-c", SHELL], env={"TERM": os.environ.get("TERM", "xterm")})
        code = attach(command, sys.stdin.fileno(), sys.stdout.fileno())
    sys.exit(code)
