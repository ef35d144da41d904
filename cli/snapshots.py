"""Durable snapshots in the user's store: ``jailbox snapshots [list]`` lists them, ``jailbox snapshots rm``
removes them (``jailbox snapshot ID`` takes one, ``--snapshot`` starts from one). Runs in the user's
process, reading the store directly (no service needed)."""

from __future__ import annotations

import time

import click

from .app import main
from .errors import failing


@main.group("snapshots", invoke_without_command=True)
@click.pass_context
def snapshots_group(ctx: click.Context) -> None:
    """Snapshots kept by jailbox snapshot ID (or Sandbox.snapshot()): alone, as jailbox snapshots list.

    \b
    Example:
      jailbox snapshots rm repo-ready
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(snapshots_list)


@snapshots_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def snapshots_list(as_json: bool = False) -> None:
    """Snapshots newest first: ID, name, size, when, the root filesystem it goes over.

    \b
    Example:
      jailbox snapshots list --json
    """
    import json

    from ..sandbox import snapshots

    with failing():
        found = snapshots.list()
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return
    if not found:
        click.echo("no snapshots yet; take one with jailbox snapshot ID (ID from jailbox ps)", err=True)
    for s in found:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created))
        click.echo(f"{s.id}  {s.name or '-':30} {s.size / 1e6:9.1f} MB  {created}  {s.image}")


@snapshots_group.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="ID|NAME...")
def snapshots_rm(refs: tuple[str, ...]) -> None:
    """Remove snapshots (refused while a sandbox runs over one).

    \b
    Example:
      jailbox snapshots rm repo-ready
    """
    from ..sandbox import snapshots

    for ref in refs:
        with failing():
            click.echo(f"removed {snapshots.remove(ref).id}")
