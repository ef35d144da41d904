"""``jailbox rootfs``: build, pull, import, list, remove and locate stored root filesystems.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import click

from ..sandbox.errors import SandboxError  # stdlib only, and every command catches it
from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .app import main
from .errors import fail, failing

PIPED_EVERY = 25  # rootfs build, piped: a progress line every this many packages


@main.group("rootfs")
def rootfs_group() -> None:
    """Root filesystems: pull OCI images, import archives, list and remove them.

    \b
    Example:
      jailbox rootfs pull python:3.11-slim && jailbox exec --rootfs python:3.11-slim -- python3 -V
    """


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
    """SIGINT (and for ``pull``, SIGTERM) handler for commands that clean up after Ctrl-C: the first one
    interrupts; more are ignored until the cleanup (bounded) is done, and so are its helpers', which
    inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
    from ..sandbox.rootfs.pull import pull

    default_sigint = signal.signal(signal.SIGINT, _interrupt_once)
    default_sigterm = signal.signal(signal.SIGTERM, _interrupt_once)  # kill, as Ctrl-C: nothing half-made is left
    try:
        entry = pull(ref, name, platform=platform, insecure=insecure, progress=_progress(), log=click.echo)
    except KeyboardInterrupt:
        click.echo("jailbox: interrupted; nothing stored (what was downloaded is kept: pull again to resume)", err=True)
        sys.exit(130)
    except SandboxError as exc:
        fail(exc)
    finally:
        signal.signal(signal.SIGINT, default_sigint)
        signal.signal(signal.SIGTERM, default_sigterm)
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
    from ..sandbox.rootfs import build, shipped

    if recipe is None:
        if name is not None and name not in shipped.names():
            fail(build.unknown_recipe(name))  # a typo must not build the 1.4 GB default
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
        fail(exc)
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
    from ..sandbox.rootfs.importer import import_rootfs

    with failing():
        entry = import_rootfs(source, name, platform=platform, tag=tag)
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

    from ..sandbox.rootfs.store import Store

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
    from ..sandbox.rootfs.store import Store

    store = Store()
    for name in names:
        with failing():
            click.echo(f"removed {store.remove(name, force=force).name}")


@rootfs_group.command("path")
@click.argument("name")
def rootfs_path(name: str) -> None:
    """Print the directory of a stored root filesystem.

    \b
    Example:
      ls "$(jailbox rootfs path default)/usr/bin"
    """
    from ..sandbox.rootfs.store import Store

    with failing():
        click.echo(str(Store().require(name).tree))


@rootfs_group.command("du")
@click.argument("name")
def rootfs_du(name: str) -> None:
    """Bytes used by a stored root filesystem (apparent and on disk; hard links once).

    \b
    Example:
      jailbox rootfs du default
    """
    from ..sandbox.rootfs.store import Store

    with failing():
        usage = Store().du(name)
    click.echo(
        f"{usage['bytes'] / 1e6:.1f} MB apparent, {usage['disk'] / 1e6:.1f} MB on disk, {usage['entries']} entries"
    )
