"""``jailbox view``'s HTTP server: the standard library's, on loopback, every request checked for the token.

Runs in the viewer's process, one thread per request. What it serves was chosen by a model or a jail, so:
every page carries a Content Security Policy that allows scripts from this origin's ``/static/`` only (none
inline, none remote); a produced file is sent with ``nosniff`` and a sandboxing policy, inline only when its
type cannot run as a page (``pages.MEDIA``: images, audio, video; never SVG or HTML), else as an attachment;
a file is opened beneath its source's held directory (``sources``), never through a link or ``..``, and a
text view reads at most ``sources.MAX_SHOWN`` bytes. The token is compared in constant time; a request with
another Host than the loopback name it was given (a DNS-rebound page) is refused too.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import sys
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlsplit

from ...sandbox import printable  # the exception may quote a record: shown escaped on the terminal
from .html import Html, el
from .pages import (
    MEDIA,
    Links,
    batch_live,
    batch_stamp,
    compare_html,
    index_html,
    page,
    run_html,
    source_html,
)
from .sources import MAX_SHOWN, Source, Unreadable

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
FILE_POLICY = "sandbox; default-src 'none'; frame-ancestors 'none'"
"""On every produced file: opened as a document anyway, it has an opaque origin and may run nothing."""
STATIC = {"view.js": "text/javascript; charset=utf-8", "view.css": "text/css; charset=utf-8"}


def static(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


class Viewer:
    """The sources being viewed and the token that opens them; ``serve`` runs the server until closed."""

    def __init__(self, sources: Sequence[Source], token: str | None = None) -> None:
        self.sources = list(sources)
        self.token = token or secrets.token_urlsafe(24)
        self.links = Links(self.token)
        self.server: ThreadingHTTPServer | None = None
        self.serving = False
        self.hosts: set[bytes] = set()  # the Host headers it answers: its loopback names with its port

    def bind(self, port: int = 0, host: str = "127.0.0.1") -> str:
        """Listen on loopback; the URL to open (the token in it)."""
        viewer = self

        class Handler(_Handler):
            pass

        Handler.viewer = viewer
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.hosts = {f"{name}:{self.server.server_port}".encode() for name in (host, "localhost", "127.0.0.1")}
        return f"http://{host}:{self.server.server_port}/?token={self.token}"

    def serve(self) -> None:
        """Serve until ``close`` (from another thread) or an exception (Ctrl-C) ends it."""
        assert self.server is not None
        self.serving = True
        try:
            self.server.serve_forever(poll_interval=0.2)
        finally:
            self.serving = False

    def close(self) -> None:
        if self.server is not None:
            if self.serving:  # shutdown() waits for the loop: only while there is one
                self.server.shutdown()
            self.server.server_close()
            self.server = None
        for src in self.sources:
            src.close()


class _Handler(BaseHTTPRequestHandler):
    viewer: Viewer
    protocol_version = "HTTP/1.1"
    server_version = "jailbox-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests carry the token in their URL."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v.encode("latin-1") for k, v in parse_qsl(url.query, encoding="latin-1")}
        token = query.get("token", b"")
        if not hmac.compare_digest(token, self.viewer.token.encode()):
            return self._error(HTTPStatus.FORBIDDEN, "open the URL jailbox view printed (it carries the token)")
        if self.headers.get("Host", "").encode("latin-1", "replace") not in self.viewer.hosts:
            return self._error(HTTPStatus.FORBIDDEN, "this viewer answers on its loopback address only")
        try:
            self._route(url.path, query)
        except Unreadable as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a record no page expected: said, not a dropped connection
            print(printable(f"jailbox view: {type(exc).__name__}: {exc}", line=True), file=sys.stderr)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__} (see the viewer's terminal)")

    def do_POST(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the viewer only reads")

    def _source(self, query: dict[str, bytes]) -> tuple[Source, int]:
        try:
            number = int(query.get("s", b""))
            return self.viewer.sources[number], number
        except (ValueError, IndexError):
            raise Unreadable("no such source") from None

    def _route(self, path: str, query: dict[str, bytes]) -> None:
        v, links = self.viewer, self.viewer.links
        rel = query.get("p", b"")
        if path == "/":
            body = index_html(v.sources, links)
            if len(v.sources) == 1:
                body = Html(body + source_html(v.sources[0], 0, links))
            return self._page("sources", body)
        if path.startswith("/static/") and path[8:] in STATIC:
            return self._send(static(path[8:]), STATIC[path[8:]])
        if path == "/source":
            src, n = self._source(query)
            return self._page(src.path, source_html(src, n, links))
        if path == "/run":
            src, n = self._source(query)
            return self._page(f"{src.path} {os.fsdecode(rel)}", run_html(src, n, rel, links))
        if path == "/live":
            src, n = self._source(query)
            stamp = batch_stamp(src)
            payload: dict[str, Any] = {"stamp": stamp}
            if query.get("stamp", b"").decode("latin-1") != stamp:
                payload["html"] = batch_live(src, n, links)
            return self._send(json.dumps(payload).encode(), "application/json")
        if path == "/file":
            src, n = self._source(query)
            return self._file(src, rel, download=b"dl" in query)
        if path == "/text":
            src, n = self._source(query)
            data, size = src.read(rel, MAX_SHOWN)
            note = f"{size:,} bytes" + (f", the first {len(data):,} shown" if size > len(data) else "")
            download = links.file(src, n, rel, download=True)
            body = el(
                "section",
                el("h2", os.fsdecode(rel)),
                el("p", note, " ", el("a", "download", href=download, download=True), class_="summary"),
                el("pre", data.decode("utf-8", "replace"), class_="textfile"),
            )
            return self._page(os.fsdecode(rel), body)
        if path == "/compare":
            sides = []
            for key in ("a", "b"):
                number, _, quoted = query.get(key, b"").decode("latin-1").partition(":")
                src, n = self._source({"s": number.encode()})
                sides.append((src, n, unquote_to_bytes(quoted)))
            return self._page("compare", compare_html(sides[0], sides[1], links))
        self._error(HTTPStatus.NOT_FOUND, "no such page")

    def _headers(self, status: int, kind: str, length: int, policy: str = PAGE_POLICY) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", policy)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")

    def _send(self, data: bytes, kind: str, status: int = HTTPStatus.OK) -> None:
        self._headers(status, kind, len(data))
        self.end_headers()
        self.wfile.write(data)

    def _page(self, title: str, body: Html, status: int = HTTPStatus.OK) -> None:
        self._send(page(title, body, self.viewer.links).encode(), "text/html; charset=utf-8", status)

    def _error(self, status: int, message: str) -> None:
        body = el("section", el("h2", f"{status} {HTTPStatus(status).phrase}"), el("p", message))
        self._page(HTTPStatus(status).phrase, body, status)

    def _file(self, src: Source, rel: bytes, download: bool) -> None:
        """The file's bytes (at most its size when opened), inline only as a type that cannot be a page."""
        fd, size = src.open_file(rel)
        try:
            name = os.fsdecode(rel.rsplit(b"/", 1)[-1])
            kind = MEDIA.get(os.path.splitext(name.lower())[1])
            self._headers(
                HTTPStatus.OK, kind if kind and not download else "application/octet-stream", size, FILE_POLICY
            )
            if download or kind is None:
                ascii_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100] or "file"
                disposition = (
                    f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='', errors='replace')}"
                )
                self.send_header("Content-Disposition", disposition)
            self.end_headers()
            left = size
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)
            if left:  # the file shrank while it was sent: the length promised cannot be kept
                self.close_connection = True
        finally:
            os.close(fd)
