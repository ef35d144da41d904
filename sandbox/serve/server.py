"""The HTTP/1.1 server of ``jailbox serve``: one thread per connection, bounded bodies, chunked streams.

Runs in the serving host process. The standard library's threading server is the stack on purpose:
the jail's API is blocking and thread-safe, so one thread per request maps onto it with no event loop
in between and no dependency to audit, and Connect's server streams are plain chunked responses over
HTTP/1.1. What a client sends is bounded here before any handler sees it: header count and size (the
standard library's), at most ``MAX_CONNECTIONS`` connections at once, a request body (declared or
chunked) of at most ``MAX_HELD`` bytes read whole before the handler runs, or ``MAX_BODY`` for a file
upload, which the handler reads as it arrives, ``MAX_TRANSFERS`` large, compressed or file transfers
at once, and ``IDLE`` seconds of silence on a connection. A request refused before its body is read is closed
lingering, so the client reads why (at most ``LINGER_BYTES`` and ``LINGER`` seconds of it are dropped).
"""

from __future__ import annotations

import io
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

from .connect import MAX_MESSAGE

MAX_BODY = 65 << 20
"""Largest request body (a 64 MiB file upload with its multipart framing)."""
MAX_HELD = MAX_MESSAGE + 5
"""Largest body read whole (a Connect message in its envelope); only an upload streams up to
``MAX_BODY``. Eight 65 MiB bodies held at once grew the server by 375 MiB."""
MAX_CONNECTIONS = 512
IDLE = 120.0
SMALL_BODY = 1 << 20
MAX_TRANSFERS = 8
"""Requests with a body over ``SMALL_BODY``, or moving a file, at once: what they hold in memory is bounded."""
LINGER_BYTES = MAX_BODY
LINGER = 5.0
"""After refusing a request whose body is still arriving: at most this many bytes, and seconds, of it
read and dropped, so the client gets to read the refusal instead of a reset."""
MAX_PARTS = 1000
"""Files in one multipart upload. Each costs an open in the jail, and once cost host memory too (9.6
million empty parts in a 64 MiB body held 1.2 GB): the upload now streams, and this bounds the rest."""
MAX_PART_HEAD = 8 << 10
"""Bytes of one multipart part's headers: the only part of an upload held whole, so a header without
end is refused here rather than read to the end of the body."""
STREAMED = frozenset({("POST", "/files")})
"""Requests whose body the handler reads as it arrives (``Request.stream``) instead of whole: a file
upload is written to the jail a chunk at a time, so what it holds does not grow with the file."""


class BodyTooLarge(Exception):
    pass


class BodyCut(Exception):
    """The client stopped sending its body before the end: it closed, or stayed silent ``IDLE`` seconds."""


class Body:
    """A request body as it arrives, declared (``Content-Length``) or chunked, never past ``limit``.

    ``read`` raises ``BodyTooLarge`` past the bound or on bad framing, and ``BodyCut`` when the client
    stops sending before the end: either way the request ends there."""

    def __init__(self, rfile: io.BufferedIOBase, headers: Message, limit: int) -> None:
        self._rfile = rfile
        self._limit = limit
        self._chunked = "chunked" in (headers.get("Transfer-Encoding") or "").lower()
        self._total = 0
        self.done = False
        if self._chunked:
            self._left = 0  # of the current chunk; a chunk header is read when it is 0
            return
        try:
            self._left = int(headers.get("Content-Length") or 0)
        except ValueError:
            raise BodyTooLarge("bad Content-Length") from None
        if self._left < 0 or self._left > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        self.done = self._left == 0

    def read(self, size: int) -> bytes:
        """At most ``size`` bytes of the body, ``b""`` at its end."""
        if self.done:
            return b""
        if self._left == 0 and not self._next_chunk():
            return b""
        try:
            data = self._rfile.read(min(size, self._left))
        except OSError as exc:  # the connection's timeout (IDLE) or a reset
            raise BodyCut(f"the body stopped arriving: {exc}") from None
        if not data:
            raise BodyCut("the client closed before the end of its body")
        self._left -= len(data)
        if self._left == 0:
            if self._chunked:
                self._rfile.readline(16)  # the chunk's CRLF
            else:
                self.done = True
        return data

    def read_all(self) -> bytes:
        if not self._chunked:  # one allocation of the declared size, not pieces joined (twice the body)
            data = self.read(self._left)
            if not self.done:  # a short read: the client closed
                raise BodyCut("the client closed before the end of its body")
            return data
        parts = []
        while data := self.read(1 << 20):
            parts.append(data)
        return b"".join(parts)

    def _next_chunk(self) -> bool:
        """Start the next chunk; False (and done) at the last one."""
        line = self._rfile.readline(1024)
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            raise BodyTooLarge("bad chunk header") from None
        if size == 0:
            for _ in range(64):  # trailers, read and dropped; a client cannot send them forever
                if not self._rfile.readline(1024).strip():
                    self.done = True
                    return False
            raise BodyTooLarge("more than 64 trailer lines")
        self._total += size
        if size < 0 or self._total > self._limit:
            raise BodyTooLarge(f"request body over {self._limit} bytes")
        self._left = size
        return True


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
    body: bytes
    stream: Body | None = None
    """For ``STREAMED`` requests, the body still to read (``body`` is then empty)."""

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

    def _heavy(self, path: str) -> bool:
        """Whether this request may hold a large body or reply (a file, a body over ``SMALL_BODY``, or a
        compressed one: 16 KB of gzip inflate to 16 MiB, so it costs what its inflated size would)."""
        if path == "/files" or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return True
        for name in ("Content-Encoding", "Connect-Content-Encoding"):
            if (self.headers.get(name) or "identity").strip().lower() != "identity":
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
                streamed = (self.command, url.path) in STREAMED
                body = Body(self.rfile, self.headers, MAX_BODY if streamed else MAX_HELD)
                request = Request(
                    self.command,
                    url.path,
                    urllib.parse.parse_qs(url.query, max_num_fields=64),
                    self.headers,
                    b"" if streamed else body.read_all(),
                    body if streamed else None,
                )
            except BodyTooLarge as exc:
                self._refuse(_error(413, str(exc)))
                return
            except BodyCut:  # nobody is left to answer
                self.close_connection = True
                return
            except ValueError as exc:
                self._refuse(_error(400, f"bad query string: {exc}"))
                return
            try:
                response = self.server.app(request)
            except Exception:  # a bug here must cost one request, never the server
                self.log_error("request failed:\n%s", traceback.format_exc())
                response = _error(500, "internal error (see the server's log)")
            if body.done:
                self._send(response)
            else:  # the handler stopped reading a streamed body (refused it): what is left is not read
                self._refuse(response)
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
        try:
            self._send(response)
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
