"""``jailbox view``: runs, batches and replays in the browser (``jailbox.agent.view``), or exported as one page.

Runs in the user's process, as the rest of ``jailbox.cli`` (see ``__init__.py``)."""

from __future__ import annotations

import os

import click

from ..sandbox.escapes import printable  # stdlib only: what others chose is printed through it
from .app import main
from .errors import _flag_error


@main.command("view")
@click.argument("paths", nargs=-1, metavar="[PATH]...", type=click.Path(exists=True))
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port on 127.0.0.1 (0: any free one)."
)
@click.option("--no-browser", is_flag=True, help="Print the URL only (no browser is opened without a display anyway).")
@click.option(
    "--export",
    "export_to",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.html",
    help="Write one self-contained page (no script, media embedded) to FILE.html instead of serving.",
)
def view_cmd(paths: tuple[str, ...], port: int, no_browser: bool, export_to: str | None) -> None:
    """Look at what agents did: each PATH is a run's directory (jailbox run), a directory of runs, a batch's
    directory (jailbox bench), a trajectory.json, or a replay's JSON (jailbox replay --json > FILE.json);
    the current directory if none. Serves on 127.0.0.1 behind a token in the URL it prints; Ctrl-C stops.

    \b
    Example:
      jailbox view ./out/20260101_120000 ./bench-out
      jailbox view ./bench-out --export bench.html
    """
    from pathlib import Path

    from ..agent.view import Unreadable, Viewer, export, open_sources

    try:
        if export_to is not None:
            size = export(paths or (".",), Path(export_to))
            click.echo(printable(f"wrote {export_to} ({size:,} bytes)"))
            return
        viewer = Viewer(open_sources(paths or (".",)))
    except Unreadable as exc:
        _flag_error("PATH", str(exc), "jailbox view ./out/20260101_120000")
    except OSError as exc:
        _flag_error("--export", f"{export_to}: {exc.strerror or exc}", "--export ./view.html")
    try:
        url = viewer.bind(port)
    except OSError as exc:
        viewer.close()
        _flag_error("--port", f"{port}: {exc.strerror}", "--port 0")
    click.echo(f"jailbox view: serving {len(viewer.sources)} source(s) at {url} (Ctrl-C stops)")
    if not no_browser and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        import webbrowser  # only with a display: without one it would start a text browser on this terminal

        webbrowser.open(url)
    try:
        viewer.serve()
    except KeyboardInterrupt:
        pass
    finally:
        viewer.close()
