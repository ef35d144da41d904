"""``jailbox view``: runs, batches and replays in the browser, served on loopback or exported as one page.

Runs in the viewer's process, which runs no jail and only reads: ``sources`` holds each PATH by descriptor
and reads beneath it without following links, bounded; ``pages`` renders the records to HTML (``html``
escapes every string a model or a jail chose); ``server`` serves them behind a token with a policy that
runs no script but ``static/view.js``; ``export`` writes everything into one self-contained page.

It lives in ``agent/`` because it reads the agent's records (``trajectory``, ``tasks``, ``replay``) through
their models, and needs of the jail only ``hostfs``, a public name of ``jailbox.sandbox``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from pathlib import Path

from ...sandbox import hostfs
from .html import Html
from .pages import Links, index_html, page, run_html, source_html
from .server import Viewer, static
from .sources import Source, Unreadable

__all__ = ["Source", "Unreadable", "Viewer", "export", "open_sources"]


def open_sources(paths: Sequence[str]) -> list[Source]:
    """Each PATH held open; ``Unreadable`` (naming it) for one that is none of a run, a batch or a replay."""
    sources: list[Source] = []
    try:
        for path in paths:
            sources.append(Source(path))
    except Unreadable:
        for src in sources:
            src.close()
        raise
    return sources


def export(paths: Sequence[str], out: Path) -> int:
    """One self-contained page of ``paths`` at ``out`` (written through ``hostfs``, atomically): no script,
    the stylesheet inline and allowed by its hash, media embedded as ``data:`` URIs; its size in bytes."""
    sources = open_sources(paths)
    try:
        links = Links("", export=True)
        body = [index_html(sources, links)]
        for n, src in enumerate(sources):
            body.append(source_html(src, n, links))
            if src.kind == "runs":
                body += [run_html(src, n, rel, links) for rel in src.runs()]
        css = static("view.css").decode()
        digest = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
        document = page("export", Html("".join(body)), links, css, f"sha256-{digest}").encode()
    finally:
        for src in sources:
            src.close()
    with hostfs.Destination(out.parent if str(out.parent) else Path(".")) as dest:
        dest.replace(out.name, document)
    return len(document)
