"""The HTTP/1.1 server of ``jailbox serve``: one thread per connection, bounded heads and bodies, chunked streams.

Runs in the serving host process. The standard library's threading server is the stack on purpose:
the jail's API is blocking and thread-safe, so one thread per request maps onto it with no event loop
in between and no dependency to audit, and Connect's server streams are plain chunked responses over
HTTP/1.1. What a client sends is bounded here before any handler sees it.

Before a key: a request line of at most ``MAX_REQUEST_LINE`` bytes and at most ``MAX_HEADERS`` header
lines of ``MAX_HEADER_BYTES`` together (read here, not by ``http.server``, which reads 100 lines of
64 KiB each), all of it within ``HEAD_TIMEOUT`` seconds of the connection's start, however slowly it
trickles. A connection is *proven* once a request on it carries a key or a sandbox's token (the
application's ``tenant`` check, on the headers alone); until then at most ``MAX_WAITING`` such
connections are held, ``MAX_PEER_WAITING`` of one peer address (an IPv6 /64), and a new one past
either closes the oldest, so unproven peers cannot take the slots that proven work needs. A request
that proves nothing is answered from its headers with its body unread, and its connection closed.

A proven request the ``Tunnel`` wants (a sandbox's own port, ``ports.py``) is handed to it with its
head, its body unread, and the connection is the tunnel's until it returns; it counts among its
tenant's connections meanwhile.

After the key: at most ``MAX_CONNECTIONS`` connections at once, ``MAX_TENANT_CONNECTIONS`` of one
tenant, ``KEEP_ALIVE`` seconds for a proven connection's next request to arrive whole, a request body
(declared or chunked) of at most ``MAX_HELD`` bytes read whole before the handler runs, or ``MAX_BODY``
for a file upload, which the handler reads as it arrives, ``MAX_TRANSFERS`` large, compressed or file
transfers at once, ``MAX_TENANT_TRANSFERS`` of them one tenant's, ``MAX_TENANT_HELD`` bytes of smaller
bodies held for one tenant at once (a streamed reply's small request, chunked or not, counts among
these for as long as it streams, not as a transfer), and ``IDLE`` seconds of silence while a body
arrives. A request
refused before its body is read has the rest of it read first when that is at most ``READ_FIRST``
bytes arriving within ``LINGER`` seconds, and is otherwise closed lingering, so the client reads why
(at most ``LINGER_BYTES`` and ``LINGER`` seconds of it are dropped).
"""

from __future__ import annotations

import io
import ipaddress
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
from typing import Any, Protocol

from ...sandbox.errors import ServerError
from .connect import MAX_MESSAGE

MAX_BODY = 65 << 20
"""Largest request body (a 64 MiB file upload with its multipart framing)."""
MAX_HELD = MAX_MESSAGE + 5
"""Largest body read whole (a Connect message in its envelope); only an upload streams up to
``MAX_BODY``. Eight 65 MiB bodies held at once grew the server by 375 MiB."""
MAX_CONNECTIONS = 512
IDLE = 120.0
"""Seconds a body may stay silent (per read) before the request is dropped."""
MAX_REQUEST_LINE = 8 << 10
MAX_HEADER_BYTES = 16 << 10
MAX_HEADERS = 100
"""A request's line, and its header lines (count and bytes together), as Apache and nginx bound
them; past them 414 or 431 and the connection closed. Once 100 lines of 64 KiB each were parsed:
100 connections without a key took the server from 200 MB to 2.9 GB."""
HEAD_TIMEOUT = 10.0
"""Seconds from a connection's start for its first request line and headers to arrive whole, however
slowly they trickle: a connection without a key holds its slot no longer."""
MAX_TENANT_CONNECTIONS = 128
"""Connections one tenant holds at once (counted by the key that first proved each): a key holder
cannot take every slot from the others. Past it a request is answered 503 and its connection closed."""
KEEP_ALIVE = 60.0
"""Seconds a proven connection may wait for its next request, until that request's headers are whole."""
MAX_WAITING = 256
MAX_PEER_WAITING = 64
"""Connections not yet proven (no request on them has carried a key or token yet) held at once, and
of one peer address (an IPv6 /64); a new one past either bound closes the oldest such connection
(of that peer, else of all), so at least ``MAX_CONNECTIONS - MAX_WAITING`` slots stay for proven
work. Once one peer without a key held every slot by sending a byte every couple of minutes."""
SMALL_BODY = 1 << 20
MAX_REASON = 200
"""Characters of a reason phrase sent at most (``Response.reason``)."""
MAX_TRANSFERS = 8
MAX_TENANT_TRANSFERS = 2
"""Requests with a body over ``SMALL_BODY``, or moving a file, at once (of one tenant): what they hold
in memory is bounded (a download holds its file, up to 64 MiB), and one key cannot take them all.
A request past either waits (up to ``IDLE`` seconds) before its body is read."""
MAX_TENANT_HELD = 16 << 20
"""Bytes of smaller bodies one tenant's requests hold at once, from their reading until they are
handled (parsing costs a few times a body's size); a request past it waits as a transfer does. One
key's 120 bodies of 1 MiB held beside its two unread 64 MiB downloads grow the server by 171 to 181
MiB, by 253 to 283 MiB without this bound."""
LINGER_BYTES = MAX_BODY
READ_FIRST = 1 << 16  # of a refused body's rest, read before the answer (``_read_rest``)
LINGER = 5.0
"""After refusing a request whose body is still arriving: at most this many bytes, and seconds, of it
read and dropped, so the client gets to read the refusal instead of a reset."""
MAX_PARTS = 1000
"""Files in one multipart upload. Each costs an open in the jail, and once cost host memory too (9.6
million empty parts in a 64 MiB body held 1.2 GB): the upload now streams, and this bounds the rest."""
MAX_PART_HEAD = 8 << 10
"""Bytes of one multipart part's headers: the only part of an upload held whole, so a header without
end is refused here rather than read to the end of the body."""
STREAMED = frozenset({("POST", "/files"), ("POST", "/process.Process/StreamInput")})
"""Requests whose body the handler reads as it arrives (``Request.stream``) instead of whole: a file
upload is written to the jail a chunk at a time, so what it holds does not grow with the file, and a
client stream of input reaches the process message by message, as the client sends it."""


class BodyTooLarge(ServerError):
    pass


class HeadRefused(ServerError):
    """A request line or headers past their bounds; ``status`` is the answer (414 or 431)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyCut(ServerError):
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

    def remaining(self) -> int | None:
        """Bytes of a declared body not read yet (None for a chunked one: not known)."""
        return None if self._chunked else self._left

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
    reason: str | None = None
    """The status line's reason phrase (None: the status's standard one): where a client shows only
    that, it can say what failed (printable ASCII, ``MAX_REASON`` characters at most, is sent)."""


class Tunnel(Protocol):
    """Takes over connections whose request it wants (by its headers, once they proved a tenant): the
    request's head as received and the connection, its body still unread, for as long as it likes."""

    def wants(self, headers: Message) -> bool: ...

    def run(self, headers: Message, conn: socket.socket, rfile: io.BufferedReader, head: bytes) -> Response | None:
        """Relay the connection; or the answer to send instead (then the connection closes)."""


App = Callable[[Request], Response]
Tenant = Callable[[Message, str, str], "str | None"]
"""Who a request's headers, method and target (path and query: a signed URL's signature) prove it comes
from (a key's tenant), or None: checked before its body is read."""


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
    proven: bool
    """Whether a request on this connection has carried a key or token: it may then stay open between requests."""
    waited_from: float
    head: bytes
    """The current request's line and headers as received (what a ``Tunnel`` relays)."""
    expect_continue: bool

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

    def setup(self) -> None:
        super().setup()
        self.proven = False
        self.waited_from = time.monotonic()  # when the wait for the next request's head began
        self.expect_continue = False

    def handle_one_request(self) -> None:
        """One request: its head read here within its bounds, then parsed and handled as
        ``http.server`` would (which would read the head itself without a bound on the total)."""
        deadline = self.waited_from + (KEEP_ALIVE if self.proven else HEAD_TIMEOUT)
        try:
            head = self._read_head(deadline)
        except HeadRefused as exc:
            self.requestline, self.request_version, self.command = "", "HTTP/1.1", ""
            self._refuse(_error(exc.status, str(exc)))
            return
        except OSError:  # the deadline passed, the client reset, or the server closed it to make room
            self.close_connection = True
            return
        if head is None:
            self.close_connection = True
            return
        self.raw_requestline = head[0]
        self.head = b"".join(head)
        rfile, self.rfile = self.rfile, io.BytesIO(b"".join(head[1:]))  # parse_request reads the headers here
        try:
            parsed = self.parse_request()
        finally:
            self.rfile = rfile
        self.connection.settimeout(IDLE)
        if not parsed:  # answered (400, 505) and closing
            return
        method = getattr(self, "do_" + self.command, None)
        try:
            if method is None:
                self.send_error(501, f"Unsupported method ({self.command!r})")
            else:
                method()
        except TimeoutError:  # a write to a client that stopped reading
            self.close_connection = True
        self.waited_from = time.monotonic()

    def _read_head(self, deadline: float) -> list[bytes] | None:
        """The request line and header lines up to the blank one, all by ``deadline``; None if the
        client closed before a byte. Each wait on the socket is given what is left of the deadline, and
        only what is already buffered is consumed, never a byte past the head (the body stays unread)."""
        rfile = self.rfile
        assert isinstance(rfile, io.BufferedReader)  # the socket's buffered reader: it can peek
        lines: list[bytes] = []
        line = bytearray()
        header_bytes = 0
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError("the request's headers did not arrive in time")
            self.connection.settimeout(wait)
            data = rfile.peek(1)  # what is buffered, or one read of the socket when nothing is
            if not data:
                if lines or line:
                    raise ConnectionResetError("the client closed in the middle of its headers")
                return None
            end = data.find(b"\n")
            take = len(data) if end < 0 else end + 1
            if not lines and len(line) + take > MAX_REQUEST_LINE:
                raise HeadRefused(414, f"the request line is over {MAX_REQUEST_LINE} bytes")
            if lines and header_bytes + len(line) + take > MAX_HEADER_BYTES:
                raise HeadRefused(431, f"the headers are over {MAX_HEADER_BYTES} bytes")
            line += rfile.read(take)
            if end < 0:
                continue
            lines.append(bytes(line))
            if len(lines) > 1:
                if line in (b"\r\n", b"\n"):
                    return lines
                header_bytes += len(line)
                if len(lines) > MAX_HEADERS + 1:
                    raise HeadRefused(431, f"more than {MAX_HEADERS} header lines")
            line = bytearray()

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue`` is answered only once the request may send its body (``_invite``):
        a request refused on its headers is never invited to send it."""
        self.expect_continue = True
        return True

    def _invite(self) -> None:
        if self.expect_continue:
            self.expect_continue = False
            self.send_response_only(100)
            self.end_headers()
            self.wfile.flush()

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
        tenant = self.server.tenant(self.headers, self.command, self.path)
        if tenant is None:
            self._answer_unproven(url)
            return
        if not self.proven:
            if not self.server.prove(self.connection, tenant):
                self._refuse(_error(503, f"this key holds {MAX_TENANT_CONNECTIONS} connections already"))
                return
            self.proven = True
        tunnel = self.server.tunnel
        if tunnel is not None and tunnel.wants(self.headers):
            self.close_connection = True
            rfile = self.rfile
            assert isinstance(rfile, io.BufferedReader)
            try:
                refused = tunnel.run(self.headers, self.connection, rfile, self.head)
            except Exception:  # a bug here must cost one connection, never the server
                self.log_error("relay failed:\n%s", traceback.format_exc())
                return
            if refused is not None:
                self._refuse(refused)
            return
        heavy = self._heavy(url.path)
        small = 0 if heavy else max(0, int(self.headers.get("Content-Length") or 0))  # _heavy parsed it
        if heavy and not self.server.take_transfer(tenant):
            self._refuse(
                _error(
                    503, f"{MAX_TENANT_TRANSFERS} large transfers of this key, or {MAX_TRANSFERS} in all, are under way"
                )
            )
            return
        if small and not self.server.hold(tenant, small):
            self._refuse(_error(503, f"this key's requests already hold {MAX_TENANT_HELD} bytes of bodies; try again"))
            return
        try:
            try:
                streamed = (self.command, url.path) in STREAMED
                body = Body(self.rfile, self.headers, MAX_BODY if streamed else MAX_HELD)
                self._invite()
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
            if heavy and self._held_as_small(tenant, request, response):
                # a stream of replies (a command's output, a watch) to a small body read whole: it
                # holds one frame at a time for as long as the command runs, so its body counts
                # among the key's small ones instead of taking a transfer slot (two open command
                # streams of a key once held up every other large or chunked request)
                self.server.give_transfer(tenant)
                heavy, small = False, len(request.body)
            try:
                if body.done:
                    self._send(response)
                elif self._read_rest(body):
                    # the handler refused a streamed body it had not read to the end: a small rest is
                    # read first, so the client is not answered while it still sends (the SDK's client,
                    # under load, then failed reading the answer: 1 upload in 150 with 3 busy loops)
                    self.close_connection = True
                    self._send(response)
                else:  # a larger rest is not read: answered, then closed lingering
                    self._refuse(response)
            except OSError:  # the client went away during the reply
                self.close_connection = True
            # Freed before the slots are given back: the next transfer's file, or the next body, is
            # not read while this one is still held (eight unread downloads then peaked at 4 files).
            del request, response
        finally:
            if heavy:
                self.server.give_transfer(tenant)
            if small:
                self.server.unhold(tenant, small)

    def _held_as_small(self, tenant: str, request: Request, response: Response) -> bool:
        """Whether a streamed reply's request can count as a small body from now on: its body was
        read whole, is at most ``SMALL_BODY`` and not compressed, and fits the key's ``MAX_TENANT_HELD``
        now (taken if so)."""
        if isinstance(response.body, bytes) or not 0 < len(request.body) <= SMALL_BODY:
            return False
        for name in ("Content-Encoding", "Connect-Content-Encoding"):
            if (self.headers.get(name) or "identity").strip().lower() != "identity":
                return False
        return self.server.hold(tenant, len(request.body), wait=0.0)

    def _answer_unproven(self, url: urllib.parse.SplitResult) -> None:
        """A request with no valid key or token: the application says why from its headers alone (its
        body, if any, is never read) and the connection closes."""
        try:
            query = urllib.parse.parse_qs(url.query, max_num_fields=64)
        except ValueError as exc:
            self._refuse(_error(400, f"bad query string: {exc}"))
            return
        try:
            response = self.server.app(Request(self.command, url.path, query, self.headers, b""))
        except Exception:
            self.log_error("request failed:\n%s", traceback.format_exc())
            response = _error(500, "internal error (see the server's log)")
        self._refuse(response)

    def _read_rest(self, body: Body) -> bool:
        """Read and drop what is left of a declared body of at most ``READ_FIRST`` bytes, within
        ``LINGER`` seconds in all (a client dripping it gets no more); whether it all came."""
        left = body.remaining()
        if left is None or left > READ_FIRST:
            return False
        deadline = time.monotonic() + LINGER
        try:
            while left > 0:
                if (wait := deadline - time.monotonic()) <= 0:
                    return False
                self.connection.settimeout(wait)
                data = self.rfile.read1(left)  # what is buffered, else one read of the socket
                if not data:
                    return False
                left -= len(data)
        except OSError:
            return False
        return True

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
        reason = None
        if response.reason is not None:
            reason = " ".join("".join(c if " " <= c <= "~" else " " for c in response.reason).split())[:MAX_REASON]
        self.send_response(response.status, reason or None)
        if self.close_connection:
            self.send_header("Connection", "close")
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


def _peer(address: Any) -> str:
    """The key connections are counted by: the peer's address, or its /64 for IPv6 (one host's)."""
    try:
        ip = ipaddress.ip_address(address[0])
    except (ValueError, TypeError, IndexError):
        return str(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the listen backlog: a burst of SDK clients must queue, not be reset

    def __init__(
        self, address: tuple[str, int], app: App, tenant: Tenant, verbose: bool = False, tunnel: Tunnel | None = None
    ) -> None:
        self.app = app
        self.tenant = tenant
        self.tunnel = tunnel
        self.verbose = verbose
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.transfers = threading.BoundedSemaphore(MAX_TRANSFERS)
        self._lock = threading.Lock()
        self._waiting: dict[socket.socket, str] = {}  # unproven connections, oldest first, and their peer
        self._proven: dict[socket.socket, str] = {}  # proven connections and the tenant that proved each
        self._tenant_connections: dict[str, int] = {}
        self._tenant_transfers: dict[str, threading.BoundedSemaphore] = {}
        self._held: dict[str, int] = {}  # bytes of small bodies each tenant's requests hold
        self._room = threading.Condition(self._lock)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # over the limit: refuse the connection, do not queue it
            self.shutdown_request(request)
            return
        assert isinstance(request, socket.socket)
        self._wait(request, _peer(client_address))
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        """Forget the connection before its socket closes: ``_wait`` shuts down only sockets still open
        (under the same lock), never a descriptor number another socket has been given since."""
        assert isinstance(request, socket.socket)
        self._end(request)
        super().shutdown_request(request)

    def _wait(self, conn: socket.socket, peer: str) -> None:
        """Count a new connection as unproven; past ``MAX_PEER_WAITING`` of its peer, or
        ``MAX_WAITING`` in all, the oldest unproven one (of that peer first) is closed to make room."""
        with self._lock:
            mine = [c for c, p in self._waiting.items() if p == peer]
            if len(mine) >= MAX_PEER_WAITING:
                oldest: socket.socket | None = mine[0]
            else:
                oldest = next(iter(self._waiting), None) if len(self._waiting) >= MAX_WAITING else None
            if oldest is not None:
                del self._waiting[oldest]
                try:  # its thread's read returns at once, and the thread ends the connection
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._waiting[conn] = peer

    def prove(self, conn: socket.socket, tenant: str) -> bool:
        """``conn`` carried ``tenant``'s key: it no longer counts as waiting but as one of the tenant's
        ``MAX_TENANT_CONNECTIONS`` (False: the tenant holds them all)."""
        with self._lock:
            if self._tenant_connections.get(tenant, 0) >= MAX_TENANT_CONNECTIONS:
                return False
            self._waiting.pop(conn, None)
            self._proven[conn] = tenant
            self._tenant_connections[tenant] = self._tenant_connections.get(tenant, 0) + 1
            return True

    def _end(self, conn: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(conn, None)
            tenant = self._proven.pop(conn, None)
            if tenant is not None:
                self._tenant_connections[tenant] -= 1
                if not self._tenant_connections[tenant]:
                    del self._tenant_connections[tenant]

    def take_transfer(self, tenant: str) -> bool:
        """A large transfer's slot, of the tenant's and of all; False after ``IDLE`` seconds without."""
        with self._lock:
            mine = self._tenant_transfers.setdefault(tenant, threading.BoundedSemaphore(MAX_TENANT_TRANSFERS))
        deadline = time.monotonic() + IDLE
        if not mine.acquire(timeout=IDLE):
            return False
        if not self.transfers.acquire(timeout=max(0.0, deadline - time.monotonic())):
            mine.release()
            return False
        return True

    def give_transfer(self, tenant: str) -> None:
        self.transfers.release()
        self._tenant_transfers[tenant].release()

    def hold(self, tenant: str, size: int, wait: float = IDLE) -> bool:
        """Room for a small body of ``size`` bytes among the tenant's ``MAX_TENANT_HELD``; False after
        ``wait`` seconds without."""
        with self._room:
            if not self._room.wait_for(lambda: self._held.get(tenant, 0) + size <= MAX_TENANT_HELD, wait):
                return False
            self._held[tenant] = self._held.get(tenant, 0) + size
            return True

    def unhold(self, tenant: str, size: int) -> None:
        with self._room:
            self._held[tenant] -= size
            if not self._held[tenant]:
                del self._held[tenant]
            self._room.notify_all()
