"""Host side of ``allow`` mode: one filtering HTTP/HTTPS proxy for every sandbox of this process.

Each ``allow`` jail's init binds a listening socket to 127.0.0.1:3128 inside the jail's own network
namespace and hands it over; the proxy accepts from it directly, so there is no relay process in
the jail and every connection is known to come from that sandbox. A connection carries one
request: an absolute ``http://`` URL (forwarded with ``Connection: close`` and the URL's own ``Host``;
a ``Host`` header naming another place is refused, and bytes after the request's body are never
forwarded, so a pipelined second request cannot reach another host through the same server) or a
``CONNECT`` tunnel. The host name and port are matched against the sandbox's rules (deny wins),
resolved here (names never resolve inside the jail), and its addresses checked again so DNS cannot
point the jail at the host's loopback or LAN. Refusals get a 403 whose body names the rule. Every request is logged.
A sandbox's rules can be replaced while it runs (``Proxy.update``, on the loop's thread): a request is
decided by the rules of the moment its head is read; connections already relaying are left open.
Inside TLS the proxy ends for a host a secret is bound to (``secrets.py``), a connection carries one
request after another instead, each checked and filled on its own, each answer relayed up to its end
(``_Response``) before the next request is read.

Bounds: at most ``MAX_CONNECTIONS`` connections (``MAX_PER_SANDBOX`` per sandbox); each reads into
two fixed ``CHUNK`` buffers and stops reading a side while the other side's write buffer is above
``HIGH_WATER``, so memory is at most ``MAX_CONNECTIONS * PER_CONNECTION`` whatever the jail sends.
The connections are shared fairly: every sandbox keeps ``RESERVED`` of them for itself, so a sandbox
past its own ``RESERVED`` is refused while taking one more would eat into another sandbox's unused
reserve (eight jails holding 64 tunnels each cannot leave a ninth with nothing). A relayed connection
on which no byte moves either way for ``Proxy.idle_timeout`` seconds is cut, half-closed ones too, so
idle tunnels do not hold those shares forever; a request head must arrive within ``HEAD_TIMEOUT``.
The event loop runs on one daemon thread, started with the first ``allow`` jail and stopped after
the last one closes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ipaddress
import os
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from ..errors import SandboxSetupError
from .policy import IPAddress, NetworkPolicy, Rules, normalize_host

if TYPE_CHECKING:
    from .secrets import Vault

CHUNK = 16 * 1024
HIGH_WATER = 32 * 1024
HEAD_LIMIT = 16 * 1024
PER_CONNECTION = HEAD_LIMIT + 2 * CHUNK + 2 * (HIGH_WATER + CHUNK)
MAX_CONNECTIONS = 512
MAX_PER_SANDBOX = 64
RESERVED = 8
IDLE_TIMEOUT = 300.0
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 20.0
RESOLVE_TIMEOUT = 20.0
CALL_TIMEOUT = 10.0
LOG_LIMIT = 2_000
RESOLVERS = 8
Verdict = Literal["allowed", "denied", "failed"]
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te"}


class NetworkLogEntry(BaseModel):
    """One request through the proxy. ``bytes_sent``: jail to destination; ``bytes_received``: back."""

    model_config = ConfigDict(frozen=True)

    time: float
    method: str
    host: str
    port: int
    verdict: Verdict
    reason: str
    bytes_sent: int = 0
    bytes_received: int = 0


class ProxyStats(BaseModel):
    """What the proxy holds now and at most so far (``peak_write_buffer``: largest write buffer of any
    connection side; it stays under ``HIGH_WATER + CHUNK`` by construction)."""

    sandboxes: int
    connections: int
    peak_connections: int
    refused_over_limit: int
    peak_write_buffer: int
    memory_bound: int


class _Record:
    __slots__ = ("host", "method", "port", "reason", "received", "sent", "time", "verdict")

    def __init__(self, method: str, host: str, port: int, verdict: Verdict, reason: str) -> None:
        self.verdict: Verdict = verdict
        self.time = time.time()
        self.method, self.host, self.port, self.reason = method, host, port, reason
        self.sent = self.received = 0

    def entry(self) -> NetworkLogEntry:
        return NetworkLogEntry(
            time=self.time,
            method=self.method,
            host=self.host,
            port=self.port,
            verdict=self.verdict,
            reason=self.reason,
            bytes_sent=self.sent,
            bytes_received=self.received,
        )


class Tenant:
    """One sandbox as the proxy sees it: its rules, its listener, its connections, its log."""

    def __init__(self, sandbox_id: str, policy: NetworkPolicy, vault: Vault | None = None) -> None:
        self.id = sandbox_id
        self.vault = vault  # its secrets: CONNECTs to their hosts end here (``secrets.py``)
        self.rules, self.hosts = _compiled(policy)
        self.log: collections.deque[_Record] = collections.deque(maxlen=LOG_LIMIT)
        self.conns: set[_Conn] = set()
        self.server: asyncio.AbstractServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def record(self, method: str, host: str, port: int, verdict: Verdict, reason: str) -> _Record:
        rec = _Record(method, host, port, verdict, reason)
        self.log.append(rec)
        return rec


def _compiled(policy: NetworkPolicy) -> tuple[Rules, dict[str, IPAddress]]:
    """A policy as the proxy matches it: its rules, and the names it pins to addresses."""
    return Rules(policy.allow, policy.deny), {
        name: ipaddress.ip_address(str(addr)) for name, addr in policy.hosts.items()
    }


class _BadRequest(Exception):
    pass


class _Body:
    """Where one HTTP request's body ends, fed the bytes that follow its head (RFC 9112 section 6):
    ``Content-Length`` bytes, or chunks up to the last chunk and its trailer. Whatever follows is a
    second request on the connection, which is never forwarded unchecked."""

    def __init__(self, length: int | None) -> None:
        self.left = length if length is not None else 0
        self.chunked = length is None
        self.state = "size" if self.chunked else "data"
        self.line = bytearray()
        self.done = not self.chunked and self.left == 0

    def feed(self, data: bytes) -> int:
        """How many leading bytes of ``data`` still belong to this request's body."""
        used = 0
        while used < len(data) and not self.done:
            if self.state == "data":
                take = min(self.left, len(data) - used)
                used += take
                self.left -= take
                if self.left == 0:
                    self.state = "crlf" if self.chunked else "end"
                    self.done = not self.chunked
                continue
            end = data.find(b"\n", used)
            stop = len(data) if end < 0 else end + 1
            self.line += data[used:stop]
            used = stop
            if len(self.line) > HEAD_LIMIT:
                raise _BadRequest("chunk line too long")
            if end < 0:
                break
            self._line(bytes(self.line).rstrip(b"\r\n"))
            self.line.clear()
        return used

    def _line(self, line: bytes) -> None:
        if self.state == "size":
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _BadRequest("bad chunk size") from None
            if size < 0:
                raise _BadRequest("bad chunk size")
            self.left = size
            self.state = "data" if size else "trailer"
        elif self.state == "crlf":
            if line:
                raise _BadRequest("chunk data longer than its size")
            self.state = "size"
        elif self.state == "trailer" and not line:
            self.done = True


class _Request:
    def __init__(
        self,
        method: str,
        host: str,
        port: int,
        literal: IPAddress | None,
        forward: bytes | None,
        body: _Body | None = None,
    ) -> None:
        self.method, self.host, self.port, self.literal, self.forward = method, host, port, literal, forward
        self.body = body  # plain HTTP: where this request ends (CONNECT: a tunnel, no end)


def _authority(text: str, default_port: int | None) -> tuple[str, int, IPAddress | None]:
    if "@" in text:
        raise _BadRequest("credentials in the URL are not forwarded")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise _BadRequest(f"CONNECT {text}: a port is required")
        port = default_port
    elif port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise _BadRequest(f"bad port in {text!r}")
    try:
        literal = ipaddress.ip_address(host)
        return str(literal), port, literal
    except ValueError:
        pass
    try:
        return normalize_host(host), port, None
    except ValueError:
        raise _BadRequest(f"{host!r} is not a host name") from None


def _split_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """(method, target, version, headers) of a request head ending with an empty line."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("malformed request line")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest("malformed header line")
        headers.append((name, value.strip()))
    return method, target, version, headers


def parse_head(head: bytes) -> _Request:
    """The request line and headers of one proxy request (``head`` ends with an empty line)."""
    method, target, version, headers = _split_head(head)
    if method == "CONNECT":
        host, port, literal = _authority(target, None)
        return _Request(method, host, port, literal, None)
    if not target.lower().startswith("http://"):
        if target.lower().startswith("https://"):
            raise _BadRequest("https:// URLs go through CONNECT (set HTTPS_PROXY)")
        raise _BadRequest("this is jailbox's proxy: send absolute http:// URLs or CONNECT")
    url = urlsplit(target)
    host, port, literal = _authority(url.netloc, 80)
    _check_host_header(headers, host, port)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [f"{n}: {v}" for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() != "host"]
    forward = "\r\n".join([f"{method} {path} {version}", f"Host: {url.netloc}", *kept, "Connection: close", "", ""])
    return _Request(method, host, port, literal, forward.encode("latin-1"), _body_of(headers))


class _Inner(NamedTuple):
    """One request inside TLS the proxy ended, made ready for the real server."""

    forward: bytes  # the head to send, the secrets in place of their placeholders
    body: _Body  # where the request's body ends
    used: list[str]  # the names of the secrets put in
    keep: bool  # the jail lets the connection carry another request after this one


def parse_inner(head: bytes, host: str, port: int, vault: Vault) -> _Inner:
    """One request inside TLS the proxy ended for ``host`` (a secret's): origin-form only, with a
    ``Host`` naming ``host``; sent on with the connection kept open unless the jail closes it."""
    method, target, version, headers = _split_head(head)
    if not target.startswith("/"):
        raise _BadRequest(f"inside TLS to {host}, a request names a path, not {target[:64]!r}")
    if not any(n.lower() == "host" for n, _ in headers):
        raise _BadRequest("a request without a Host header")
    _check_host_header(headers, host, port, default_port=443)
    body = _body_of(headers)
    tokens = {t.strip().lower() for n, v in headers if n.lower() == "connection" for t in v.split(",")}
    keep = version == "HTTP/1.1" and "close" not in tokens
    kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() != "host"]
    swapped, used = vault.swap(host, kept)
    authority = host if port == 443 else f"{host}:{port}"
    lines = [
        f"{method} {target} {version}",
        f"Host: {authority}",
        *(f"{n}: {v}" for n, v in swapped),
        *([] if keep else ["Connection: close"]),
    ]
    return _Inner(("\r\n".join([*lines, "", ""])).encode("latin-1"), body, used, keep)


class _Response:
    """Where one response of the real server ends (RFC 9112 section 6.3), fed what it sends after a
    request forwarded inside TLS the proxy ended, so that the connection can carry the jail's next
    request. A response whose end is only the connection's (no length, an upgrade, a head past
    ``HEAD_LIMIT``, framing that does not parse) is relayed to the end and ``keep`` is False."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.head = bytearray()
        self.body: _Body | None = None
        self.done = False
        self.keep = True
        self.to_eof = False

    def feed(self, data: bytes) -> int:
        """How many leading bytes of ``data`` belong to this response."""
        used = 0
        while used < len(data) and not self.done:
            if self.to_eof:
                return len(data)
            if self.body is not None:
                try:
                    used += self.body.feed(data[used:])
                except _BadRequest:
                    self._to_eof()
                    continue
                self.done = self.body.done
                continue
            start = max(0, len(self.head) - 3)
            self.head += data[used:]
            end = self.head.find(b"\r\n\r\n", start)
            if end < 0:
                used = len(data)
                if len(self.head) > HEAD_LIMIT:
                    self._to_eof()
                continue
            used = len(data) - (len(self.head) - end - 4)
            del self.head[end + 4 :]
            self._framing(bytes(self.head))
            self.head.clear()
        return used

    def _to_eof(self) -> None:
        self.to_eof, self.keep = True, False

    def _framing(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status_text = rest[:3]
        if not version.startswith("HTTP/1.") or not status_text.isdigit():
            return self._to_eof()
        status = int(status_text)
        headers = [(n.strip().lower(), v.strip()) for n, sep, v in (line.partition(":") for line in lines[1:]) if sep]
        if 100 <= status < 200 and status != 101:
            return  # an interim response: the real one follows
        tokens = {t.strip().lower() for n, v in headers if n == "connection" for t in v.split(",")}
        self.keep = version == "HTTP/1.1" and "close" not in tokens
        if status == 101:
            return self._to_eof()
        if self.method == "HEAD" or status in (204, 304):
            self.done = True
            return
        codings = [v.strip().lower() for n, v in headers if n == "transfer-encoding"]
        lengths = {v for n, v in headers if n == "content-length"}
        if codings:
            if codings[-1] != "chunked":
                return self._to_eof()
            self.body = _Body(None)
        elif len(lengths) == 1 and next(iter(lengths)).isdigit():
            self.body = _Body(int(next(iter(lengths))))
            self.done = self.body.done
        else:
            self._to_eof()


def _check_host_header(headers: list[tuple[str, str]], host: str, port: int, default_port: int = 80) -> None:
    """The server answers for the ``Host`` header, not for the URL the rules were checked on: they must
    name the same place (the proxy then sends the URL's own ``Host``)."""
    given = [v for n, v in headers if n.lower() == "host"]
    if len(given) > 1:
        raise _BadRequest("more than one Host header")
    if given:
        try:
            named = _authority(given[0], default_port)[:2]
        except _BadRequest:
            raise _BadRequest(f"bad Host header {given[0]!r}") from None
        if named != (host, port):
            raise _BadRequest(f"the Host header names {given[0]!r} but the URL names {host}:{port}")


def _body_of(headers: list[tuple[str, str]]) -> _Body:
    lengths = {v for n, v in headers if n.lower() == "content-length"}
    codings = [v.strip().lower() for n, v in headers if n.lower() == "transfer-encoding"]
    if codings:
        if lengths:
            raise _BadRequest("both Transfer-Encoding and Content-Length")  # the classic smuggling shape
        if codings != ["chunked"]:
            raise _BadRequest(f"unsupported Transfer-Encoding {', '.join(codings)!r}")
        return _Body(None)
    if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        raise _BadRequest("bad Content-Length")
    return _Body(int(next(iter(lengths))) if lengths else 0)


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate is not trusted here ({exc.verify_message})"
    return getattr(exc, "strerror", None) or str(exc) or "timed out"


def _response(status: int, phrase: str, message: str) -> bytes:
    body = f"jailbox proxy: {message}\n".encode(errors="replace")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1", errors="replace") + body


class _Side(asyncio.BufferedProtocol):
    """One socket of a proxied connection: reads into its own fixed buffer, writes to the other."""

    def __init__(self, conn: _Conn, upstream: bool) -> None:
        self.conn = conn
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.view = memoryview(bytearray(CHUNK))
        self.eof = False
        self.tls = False  # TLS ended here (``_Conn.end_tls``) or spoken to the real server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)
        if self.upstream:
            transport.pause_reading()  # until the relay starts: a server may speak first
        else:
            self.conn.accepted()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.received(self, bytes(self.view[:nbytes]))

    def eof_received(self) -> bool:
        self.eof = True
        self.conn.eof(self)
        return not self.tls  # half-close where TCP has it; TLS has none, and closes its transport itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost(self)

    def pause_writing(self) -> None:
        self.conn.flow(self, pause=True)

    def resume_writing(self) -> None:
        self.conn.flow(self, pause=False)


class _Conn:
    """One connection from a jail: read the request head, decide, then relay bytes both ways."""

    def __init__(self, proxy: Proxy, tenant: Tenant) -> None:
        self.proxy = proxy
        self.tenant = tenant
        self.client = _Side(self, upstream=False)
        self.server: _Side | None = None
        self.head = bytearray()
        self.relaying = False
        self.closed = False
        self.record: _Record | None = None
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.body: _Body | None = None
        self.body_overrun = False
        self.moved = 0.0  # loop time a byte last moved through the relay
        self.inner: tuple[_Request, list[IPAddress]] | None = None  # TLS ended here: the CONNECT, its addresses
        self.response: _Response | None = None  # inside TLS ended here: where the real server's answer ends
        self.keep = False  # inside TLS ended here: the jail lets the connection carry another request
        self.pending = bytearray()  # inside TLS ended here: the jail's next request, read during this one

    def accepted(self) -> None:
        p = self.proxy
        if not p.admits(self.tenant):
            p.refused_over_limit += 1
            self.tenant.record("-", "", 0, "denied", "too many connections")
            self.reply(503, "Service Unavailable", "too many connections from this sandbox or host")
            return
        p.active += 1
        p.peak = max(p.peak, p.active)
        self.tenant.conns.add(self)
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self.close)

    def received(self, side: _Side, data: bytes) -> None:
        if self.closed:
            return
        if self.relaying:
            other = self.server if side is self.client else self.client
            assert other is not None and other.transport is not None and self.record is not None
            if side is self.client and self.body is not None:
                data = self.one_request(data)
            elif side is self.server and self.response is not None:
                data = self.one_response(data)
            if data:
                other.transport.write(data)
                self.moved = asyncio.get_running_loop().time()
                if side is self.client:
                    self.record.sent += len(data)
                else:
                    self.record.received += len(data)
                self.proxy.peak_buffer = max(self.proxy.peak_buffer, other.transport.get_write_buffer_size())
            if side is self.server and self.response is not None and self.response.done:
                self.exchanged()
            return
        if side is not self.client or self.task is not None:
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > HEAD_LIMIT:
                self.tenant.record("-", "", 0, "denied", "request head too large")
                self.reply(431, "Request Header Fields Too Large", f"request head over {HEAD_LIMIT} bytes")
            return
        if end + 4 > HEAD_LIMIT:
            self.tenant.record("-", "", 0, "denied", "request head too large")
            self.reply(431, "Request Header Fields Too Large", f"request head over {HEAD_LIMIT} bytes")
            return
        if self.inner is not None and not self.client.tls:
            return  # TLS with the jail is still being set up: ``end_tls`` reads it then
        assert self.client.transport is not None
        self.client.transport.pause_reading()
        if self.timer is not None:
            self.timer.cancel()
        head, extra = bytes(self.head[: end + 4]), bytes(self.head[end + 4 :])
        self.head = bytearray()
        opening = self.open(head, extra) if self.inner is None else self.open_inner(head, extra)
        self.task = asyncio.get_running_loop().create_task(opening)

    async def open(self, head: bytes, extra: bytes) -> None:
        try:
            req = parse_head(head)
        except _BadRequest as exc:
            self.tenant.record("-", "", 0, "denied", str(exc))
            self.reply(400, "Bad Request", str(exc))
            return
        rules, hosts = self.tenant.rules, self.tenant.hosts  # one policy decides it, even if changed meanwhile
        if req.literal is not None:
            ok, reason = rules.check_address(req.literal, req.port)
            candidates = [req.literal] if ok else []
        else:
            ok, reason = rules.check_name(req.host, req.port)
            candidates = []
            if ok:
                candidates, reason = await self.reachable_addresses(req, rules, hosts)
                if self.closed:
                    return
        self.record = self.tenant.record(req.method, req.host, req.port, "allowed" if candidates else "denied", reason)
        if not candidates:
            if reason.startswith("cannot resolve"):
                self.record.verdict = "failed"
                self.reply(502, "Bad Gateway", reason)
            else:
                self.reply(403, "Forbidden", f"{req.method} {req.host}:{req.port} refused: {reason}")
            return
        vault = self.tenant.vault
        if req.forward is None and vault is not None and vault.binds(req.host):
            await self.end_tls(req, candidates, extra, vault)
            return
        if not await self.connect(req, candidates):
            return
        assert self.server is not None and self.server.transport is not None and self.client.transport is not None
        self.start_relay(req.body, head if req.forward is not None else b"", req.forward, extra)

    async def connect(self, req: _Request, candidates: list[IPAddress], tls: ssl.SSLContext | None = None) -> bool:
        """Connect ``self.server`` to the first of ``candidates`` that answers (TLS verified for
        ``req.host`` with ``tls``); else reply 502 and return False."""
        assert self.record is not None
        error = ""
        for addr in candidates:
            side = _Side(self, upstream=True)
            side.tls = tls is not None

            def protocol(side: _Side = side) -> _Side:
                return side

            try:
                loop = asyncio.get_running_loop()
                made = loop.create_connection(
                    protocol, str(addr), req.port, ssl=tls, server_hostname=None if tls is None else req.host
                )
                await asyncio.wait_for(made, CONNECT_TIMEOUT)
            except (OSError, asyncio.TimeoutError) as exc:
                error = f"connecting to {addr} port {req.port}: {_why(exc)}"
                continue
            if self.closed:
                assert side.transport is not None
                side.transport.abort()
                return False
            self.server = side
            break
        if self.server is None or self.server.transport is None or self.client.transport is None:
            self.record.verdict, self.record.reason = "failed", error
            self.reply(502, "Bad Gateway", error)
            return False
        return True

    def start_relay(self, body: _Body | None, head: bytes, forward: bytes | None, extra: bytes) -> None:
        assert self.server is not None and self.server.transport is not None and self.client.transport is not None
        assert self.record is not None
        self.relaying = True
        self.body = body
        self.moved = asyncio.get_running_loop().time()
        self.idle_check()
        if forward is None:
            self.client.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            self.server.transport.write(forward)
            self.record.sent += len(head)
        if extra:
            self.received(self.client, extra)
        if self.client.eof:
            self.eof(self.client)
        self.client.transport.resume_reading()
        self.server.transport.resume_reading()

    async def end_tls(self, req: _Request, candidates: list[IPAddress], extra: bytes, vault: Vault) -> None:
        """A CONNECT to a host a secret is bound to: TLS with the jail ends here, under a certificate of
        the sandbox's CA for that name; the request inside is read next (``open_inner``)."""
        assert self.client.transport is not None and self.record is not None
        if extra:  # bytes before the 200: nothing a TLS client sends, and never relayed unread
            self.record.verdict, self.record.reason = "denied", "bytes sent before the tunnel was open"
            self.reply(400, "Bad Request", "send nothing after CONNECT until its 200")
            return
        self.client.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        loop = asyncio.get_running_loop()
        # the request may come in the same read as the handshake's end, before start_tls returns:
        # it is kept in ``head`` from here, and read once the transport is the TLS one
        self.inner, self.task = (req, candidates), None
        try:
            context = vault.server_context(req.host)
            tls = await asyncio.wait_for(
                loop.start_tls(self.client.transport, self.client, context, server_side=True), HEAD_TIMEOUT
            )
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            self.record.verdict, self.record.reason = "failed", f"TLS with the jail for {req.host}: {_why(exc)}"
            self.abort()
            return
        if self.closed or tls is None:
            return
        tls.set_write_buffer_limits(high=HIGH_WATER)
        self.client.transport, self.client.tls = tls, True
        self.timer = loop.call_later(HEAD_TIMEOUT, self.close)
        early, self.head = bytes(self.head), bytearray()
        if early:
            self.received(self.client, early)

    async def open_inner(self, head: bytes, extra: bytes) -> None:
        """A request inside TLS ended here: checked, its secrets put in, sent over TLS to the real
        server (verified against the host's trust store), on the connection the last request of
        this one used while the server keeps it; its answer relayed up to its end (``exchanged``)."""
        assert self.inner is not None and self.tenant.vault is not None
        req, candidates = self.inner
        try:
            inner = parse_inner(head, req.host, req.port, self.tenant.vault)
        except _BadRequest as exc:
            self.tenant.record("-", req.host, req.port, "denied", str(exc))
            self.reply(400, "Bad Request", str(exc))
            return
        method = head.split(b" ", 1)[0].decode("latin-1")
        used = inner.used
        reason = "TLS ended at the proxy; " + (f"secrets {', '.join(used)} added" if used else "no secret in it")
        self.record = self.tenant.record(method, req.host, req.port, "allowed", reason)
        self.keep = inner.keep
        if self.server is None and not await self.connect(req, candidates, self.tenant.vault.upstream):
            return
        self.response = _Response(method)
        self.start_relay(inner.body, inner.forward, inner.forward, extra)

    def one_response(self, data: bytes) -> bytes:
        """The part of ``data`` that is still the real server's answer to the request in flight;
        bytes past its end answer nothing asked, and end the connection after it."""
        assert self.response is not None
        used = self.response.feed(data)
        if used < len(data):
            self.response.keep = False
        return data[:used]

    def exchanged(self) -> None:
        """An answer relayed whole inside TLS ended here: the connection waits for the jail's next
        request (``HEAD_TIMEOUT`` at most), or closes where either end does not keep it."""
        assert self.response is not None and self.client.transport is not None
        body_done = self.body is not None and self.body.done
        keep = self.response.keep and self.keep and body_done and not self.client.eof
        self.response = None
        if not keep:
            self.close()
            return
        self.relaying, self.task, self.body, self.record = False, None, None, None
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self.close)
        pending, self.pending = bytes(self.pending), bytearray()
        self.client.transport.resume_reading()
        if pending:
            self.received(self.client, pending)

    def idle_check(self) -> None:
        """Cut the relay once nothing has moved for ``idle_timeout`` seconds; else look again then."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        left = self.moved + self.proxy.idle_timeout - loop.time()
        if left <= 0:
            if self.record is not None:
                self.record.reason += f"; cut after {self.proxy.idle_timeout:g}s idle"
            self.abort()
            return
        self.timer = loop.call_later(left, self.idle_check)

    async def reachable_addresses(
        self, req: _Request, rules: Rules, hosts: dict[str, IPAddress]
    ) -> tuple[list[IPAddress], str]:
        """Addresses of an allowed name that ``rules`` let the jail reach (pinned ones first)."""
        pinned = hosts.get(req.host)
        if pinned is not None:
            found: list[IPAddress] = [pinned]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(req.host, req.port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT
                )
            except (OSError, asyncio.TimeoutError) as exc:
                return [], f"cannot resolve {req.host}: {getattr(exc, 'strerror', None) or 'timed out'}"
            found = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
        good, reason = [], ""
        for addr in found:
            ok, why = rules.check_resolved(addr, pinned is not None)
            if ok:
                good.append(addr)
            elif not reason:
                reason = why
        _, allowed_by = rules.check_name(req.host, req.port)
        return good, allowed_by if good else reason

    def one_request(self, data: bytes) -> bytes:
        """The part of ``data`` that is still the forwarded request's body. Anything after it would be a
        second request on a connection already checked for the first (pipelined, perhaps to another
        host through the same server): it is logged as refused and the jail's side is read no more."""
        assert self.body is not None and self.client.transport is not None
        try:
            used = self.body.feed(data)
        except _BadRequest as exc:
            self.tenant.record("-", "", 0, "denied", str(exc))
            self.abort()
            return b""
        if used < len(data):
            if self.inner is not None and self.keep:
                self.pending += data[used:]  # the next request: read once this one's answer is whole
            elif not self.body_overrun:
                self.body_overrun = True
                self.tenant.record("-", "", 0, "denied", "a second request on one connection (one request each)")
            self.client.transport.pause_reading()
        return data[:used]

    def reply(self, status: int, phrase: str, message: str) -> None:
        transport = self.client.transport
        if transport is not None and not transport.is_closing():
            transport.write(_response(status, phrase, message))
        self.close()

    def eof(self, side: _Side) -> None:
        if not self.relaying:
            if side is self.client and self.task is None:
                self.close()
            elif side is self.server and self.server.transport is not None:
                # the real server ended a kept connection between two requests: the next one opens another
                transport = self.server.transport
                self.server = None
                transport.close()
            return
        other = self.server if side is self.client else self.client
        if other is not None and other.transport is not None and other.transport.can_write_eof():
            other.transport.write_eof()
        if self.client.eof and self.server is not None and self.server.eof:
            self.close()

    def flow(self, side: _Side, pause: bool) -> None:
        """``side``'s write buffer crossed a limit: stop or restart reading from the other side."""
        other = self.server if side is self.client else self.client
        if other is not None and other.transport is not None and not other.transport.is_closing():
            if pause:
                other.transport.pause_reading()
            elif self.relaying:
                other.transport.resume_reading()

    def lost(self, side: _Side) -> None:
        if side is self.client or side is self.server:  # not a kept connection to the real server dropped before
            self.close()

    def close(self) -> None:
        """Close both sides once (pending writes are flushed first)."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        if self in self.tenant.conns:
            self.tenant.conns.discard(self)
            self.proxy.active -= 1
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                side.transport.close()

    def abort(self) -> None:
        self.close()
        if self.task is not None:
            self.task.cancel()
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                side.transport.abort()


class Proxy:
    """The process's proxy: ``attach`` a sandbox's listener, ``detach`` it on close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._tenants: dict[str, Tenant] = {}
        self._served: set[Tenant] = set()  # touched on the loop's thread only
        self.idle_timeout = IDLE_TIMEOUT
        self.active = 0
        self.peak = 0
        self.refused_over_limit = 0
        self.peak_buffer = 0

    def attach(self, sandbox_id: str, listener_fd: int, policy: NetworkPolicy, vault: Vault | None = None) -> Tenant:
        """Serve ``listener_fd`` (a listening TCP socket inside the jail) with ``policy``; takes the fd."""
        listener = socket.socket(fileno=listener_fd)
        try:
            if listener.type != socket.SOCK_STREAM or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise SandboxSetupError("the jail's init handed over something that is not a listening TCP socket")
            listener.setblocking(False)
            tenant = Tenant(sandbox_id, policy, vault)
            with self._lock:
                if self._loop is None or self._pid != os.getpid():
                    self._start()
                assert self._loop is not None
                self._tenants[sandbox_id] = tenant
                loop = self._loop
            tenant.loop = loop
            asyncio.run_coroutine_threadsafe(self._serve(tenant, listener), loop).result(CALL_TIMEOUT)
        except BaseException:
            listener.close()
            raise
        return tenant

    def detach(self, tenant: Tenant) -> None:
        """Stop accepting for this sandbox and cut its connections; stop the thread after the last."""
        with self._lock:
            loop = tenant.loop
            assert loop is not None
            if self._tenants.get(tenant.id) is tenant:
                del self._tenants[tenant.id]
            last = loop is self._loop and not self._tenants
            thread = self._thread
            if last:
                self._loop = self._thread = None
        if self._pid != os.getpid() or not loop.is_running():
            return  # a forked child, or the loop thread is already gone (interpreter exit)
        asyncio.run_coroutine_threadsafe(self._close(tenant), loop).result(CALL_TIMEOUT)
        if last and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CALL_TIMEOUT)

    def update(self, tenant: Tenant, policy: NetworkPolicy) -> None:
        """Decide this sandbox's requests by ``policy`` from now on: every request whose head is
        read after this returns. Connections already relaying (tunnels, forwarded requests) are
        left as they are: they were allowed when they opened."""
        rules, hosts = _compiled(policy)
        loop = tenant.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            tenant.rules, tenant.hosts = rules, hosts
            return
        asyncio.run_coroutine_threadsafe(self._update(tenant, rules, hosts), loop).result(CALL_TIMEOUT)

    def log(self, tenant: Tenant) -> list[NetworkLogEntry]:
        loop = tenant.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return [r.entry() for r in list(tenant.log)]
        return asyncio.run_coroutine_threadsafe(self._snapshot(tenant), loop).result(CALL_TIMEOUT)

    def stats(self) -> ProxyStats:
        with self._lock:
            sandboxes = len(self._tenants)
        return ProxyStats(
            sandboxes=sandboxes,
            connections=self.active,
            peak_connections=self.peak,
            refused_over_limit=self.refused_over_limit,
            peak_write_buffer=self.peak_buffer,
            memory_bound=MAX_CONNECTIONS * PER_CONNECTION,
        )

    def admits(self, tenant: Tenant) -> bool:
        """May ``tenant`` open one more connection? Within its ``RESERVED`` yes while any is free; past
        it only if every other sandbox's unused reserve stays free (on the loop's thread)."""
        held = len(tenant.conns)
        if held >= MAX_PER_SANDBOX or self.active >= MAX_CONNECTIONS:
            return False
        if held < RESERVED:
            return True
        reserved = sum(max(0, RESERVED - len(t.conns)) for t in self._served if t is not tenant)
        return self.active + 1 + reserved <= MAX_CONNECTIONS

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        resolvers = concurrent.futures.ThreadPoolExecutor(RESOLVERS, thread_name_prefix="jailbox-dns")
        loop.set_default_executor(resolvers)
        ready = threading.Event()
        thread = threading.Thread(target=self._run, args=(loop, resolvers, ready), name="jailbox-proxy", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()
        self._served = set()  # a forked child's copy names its parent's sandboxes

    @staticmethod
    def _run(
        loop: asyncio.AbstractEventLoop, resolvers: concurrent.futures.ThreadPoolExecutor, ready: threading.Event
    ) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            resolvers.shutdown(wait=False, cancel_futures=True)  # a lookup stuck in the resolver ends on its own
            loop.close()

    async def _serve(self, tenant: Tenant, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        tenant.server = await loop.create_server(lambda: _Conn(self, tenant).client, sock=listener, backlog=256)
        self._served.add(tenant)

    async def _close(self, tenant: Tenant) -> None:
        self._served.discard(tenant)
        if tenant.server is not None:
            tenant.server.close()
        for conn in list(tenant.conns):
            conn.abort()

    @staticmethod
    async def _update(tenant: Tenant, rules: Rules, hosts: dict[str, IPAddress]) -> None:
        tenant.rules, tenant.hosts = rules, hosts  # on the loop's thread: no request sees half of it

    @staticmethod
    async def _snapshot(tenant: Tenant) -> list[NetworkLogEntry]:
        return [r.entry() for r in tenant.log]


PROXY = Proxy()
