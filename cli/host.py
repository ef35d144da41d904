"""``jailbox doctor``, ``jailbox cleanup`` and ``jailbox config``: this host, and what is left on it.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import os
import sys

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .app import main
from .settings import _settings_path, settings_reference


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check what this host allows (namespaces, overlayfs, id ranges, seccomp, cgroups) and print fixes.

    \b
    Example:
      jailbox doctor --json
    """
    import json

    from ..sandbox.checks.doctor import run

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
@click.option(
    "--force", is_flag=True, help="Also remove sandboxes whose host process still runs, and recent partial downloads."
)
def cleanup(force: bool) -> None:
    """Remove what crashed host processes left: jail processes, writable layers, state, cgroups, and in the
    rootfs store unfinished trees and partial downloads no live pull holds (those over a day old, any with --force).

    \b
    Example:
      jailbox cleanup
    """
    from ..sandbox.limits.reap import reap_stale as reap_stale_cgroups
    from ..sandbox.rootfs.store import Store
    from ..sandbox.state import cleanup as cleanup_state
    from ..sandbox.state import state_dir
    from ..servers.exec_service.client import remove_stale_socket

    removed, failed = cleanup_state(state_dir(), force=force)
    stale = remove_stale_socket()  # a killed service's; its sandboxes are among the removed
    # --force does not reach the cgroups of live owners: they go when it closes its sandboxes
    groups_removed, groups_failed = reap_stale_cgroups()
    try:
        removed += Store().remove_stale(force)
    except SandboxError as exc:
        failed.append((Store().root, str(exc)))
    for path in [*removed, *([stale] if stale else []), *groups_removed]:
        click.echo(f"removed {path}")
    for path, why in failed + groups_failed:
        click.echo(f"could not remove {path}: {why}", err=True)
    groups = f"cgroups: {len(groups_removed)} removed, {len(groups_failed)} failed"
    click.echo(f"{len(removed)} removed, {len(failed)} failed; {groups}")
    sys.exit(1 if failed or groups_failed else 0)


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
