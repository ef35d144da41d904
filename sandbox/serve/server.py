"""The HTTP/1.1 server of ``jailbox serve``: one thread per connection, bounded bodies, chunked streams.

Runs in the serving host process. The standard library's threading server is the stack on purpose:
the jail's API is blocking and thread-safe, so one thread per request maps onto it with no event loop
in between and no dependency to audit, and Connect's server streams are plain chunked responses over
HTTP/1.1. What a client sends is bounded here before any handler sees it: header count and size (the
standard library's), at most ``MAX_CONNECTIONS`` connections at once, a request body of at most
``MAX_BODY`` bytes (declared or chunked), ``MAX_TRANSFERS`` large bodies or file transfers at once,
and ``IDLE`` seconds of silence on a connection. A request refused before its body is read is closed
lingering, so the client reads why (at most ``LINGER_BYTES`` and ``LINGER`` seconds of it are dropped).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 65 << 20
"""Largest request body (a 64 MiB file upload with its multipart framing)."""
MAX_CONNECTIONS = 512
IDLE = 120.0
SMALL_BODY = 1 << 20
MAX_TRANSFERS = 8
"""Requests with a body over ``SMALL_BODY``, or moving a file, at once: what they hold in memory is bounded."""
LINGER_BYTES = MAX_BODY
LINGER = 5.0
"""After refusing a request whose body is still arriving: at most this many bytes, and seconds, of it
read and dropped, so the client gets to read the refusal instead of a reset."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass
class Response:
    status: int
    body: bytes | Iterator[bytes] = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class BodyTooLarge(Exception):
    pass


App = Callable[[Request], Response]


def _error(status: int, message: str) -> Response:
    return Response(status, json.dumps({"code": status, "message": message}).encode(), "application/json")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE
    # A reply leaves in several writes (headers, body, each stream frame); with Nagle's algorithm a
    # write waits for the ACK of the one before, which the client delays by up to 40 ms: that made
    # every SDK call 40 ms slower. Frames are already whole messages, so nothing is gained by batching.
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked()
        try:
            size = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BodyTooLarge("bad Content-Length") from None
        if size < 0 or size > MAX_BODY:
            raise BodyTooLarge(f"request body over {MAX_BODY} bytes")
        return self.rfile.read(size)

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BodyTooLarge("bad chunk header") from None
            if size == 0:
                for _ in range(64):  # trailers, read and dropped; a client cannot send them forever
                    if not self.rfile.readline(1024).strip():
                        return b"".join(parts)
                raise BodyTooLarge("more than 64 trailer lines")
            total += size
            if size < 0 or total > MAX_BODY:
                raise BodyTooLarge(f"request body over {MAX_BODY} bytes")
            parts.append(self.rfile.read(size))
            self.rfile.readline(16)

    def _heavy(self, path: str) -> bool:
        """Whether this request may hold a large body or reply (a file, or a body over ``SMALL_BODY``)."""
        if path == "/files" or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return True
        try:
            return int(self.headers.get("Content-Length") or 0) > SMALL_BODY
        except ValueError:
            return True

    def _handle(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        heavy = self._heavy(url.path)
        if heavy and not self.server.transfers.acquire(timeout=IDLE):
            self._refuse(_error(503, f"{MAX_TRANSFERS} large transfers are already under way; try again"))
            return
        try:
            try:
                body = self._body()
                query = urllib.parse.parse_qs(url.query, max_num_fields=64)
            except BodyTooLarge as exc:
                self._refuse(_error(413, str(exc)))
                return
            except ValueError as exc:
                self._send(_error(400, f"bad query string: {exc}"))
                return
            try:
                response = self.server.app(Request(self.command, url.path, query, self.headers, body))
            except Exception:  # a bug here must cost one request, never the server
                self.log_error("request failed:\n%s", traceback.format_exc())
                response = _error(500, "internal error (see the server's log)")
            self._send(response)
        finally:
            if heavy:
                self.server.transfers.release()

    def _refuse(self, response: Response) -> None:
        """Answer a request whose body is not read, then close the connection the way HTTP servers do
        (a lingering close): closing a socket with unread input sends a reset, which on the client's
        side discards the answer and fails a send still under way, so the client would see a broken
        connection instead of the reason. What it still sends is read and dropped, bounded in bytes
        and time."""
        self.close_connection = True
        self._send(response)
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER
            left = LINGER_BYTES
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                data = self.connection.recv(min(left, 1 << 16))
                if not data:
                    return
                left -= len(data)
        except OSError:  # the client went away or stayed silent: nothing left to wait for
            pass

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if response.content_type:
            self.send_header("Content-Type", response.content_type)
        if isinstance(response.body, bytes):
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in response.body:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            close = getattr(response.body, "close", None)
            if close is not None:
                close()  # a generator's finally runs now, not at garbage collection


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the listen backlog: a burst of SDK clients must queue, not be reset

    def __init__(self, address: tuple[str, int], app: App, verbose: bool = False) -> None:
        self.app = app
        self.verbose = verbose
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.transfers = threading.BoundedSemaphore(MAX_TRANSFERS)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # over the limit: refuse the connection, do not queue it
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
