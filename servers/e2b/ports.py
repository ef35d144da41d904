"""A served sandbox's own ports, reached through ``jailbox serve`` as E2B's ``get_host`` names them.

Runs in the serving host process, on a connection's thread (and one more thread per relayed
connection, for the jail's direction). A request whose ``Host`` is ``<port>-<sandbox id>.<domain>``
(what ``Sandbox.get_host(port)`` gives; the server reports ``localhost:<its port>`` as the domain),
for a port other than the daemon's (49983) and the code interpreter's (49999), is a connection to
that port on the sandbox's loopback: ``Sandbox.connect_port`` has the jail's init connect inside
its network namespace, and the socket it hands back is checked there (``sandbox/ports.py``).

The request's head goes to the jail as it came, but for E2B's own headers (the traffic access
token and the daemon's access token are dropped: the jail's server never sees them) and, where the
sandbox was made with ``network={"mask_request_host": ...}``, its ``Host``, which becomes that value
(``${PORT}`` replaced by the port). Then bytes are relayed both ways as they come, so HTTP bodies,
keep-alive requests and a WebSocket after its upgrade all pass; the connection stays with that port
of that sandbox until either side closes it. At most ``CHUNK`` bytes a direction are held at a time;
the relay ends after ``RELAY_IDLE`` seconds without a byte either way, and when the sandbox closes.
A sandbox is reachable so by whoever can reach the server and knows its id (E2B's
``allow_public_traffic``, its default), or, made with ``allow_public_traffic=False``, only with its
traffic access token (``e2b-traffic-access-token``, compared in constant time); an unknown
sandbox, a paused one and a missing or wrong token are answered alike (502), so ids cannot be probed.
"""

from __future__ import annotations

import hmac
import io
import json
import re
import select
import socket
import threading
import time
from email.message import Message
from typing import Any

from ...sandbox.errors import ProtocolError, SandboxError
from . import interpreter
from .httpd import Response
from .registry import Registry, Served, ServeError

HOST = re.compile(r"^(\d{1,5})-([a-z0-9]{1,64})\.", re.ASCII)
ENVD_PORT = 49983
"""The port of E2B's in-sandbox daemon: its host names the daemon's protocol, served by ``envd``."""
CHUNK = 1 << 16
"""Bytes one direction of a relay reads and holds at a time."""
RELAY_IDLE = 600.0
"""Seconds a relayed connection may pass without a byte either way before it is closed."""
MASK = re.compile(r"^[A-Za-z0-9._:\[\]${}-]{1,253}$", re.ASCII)
"""What ``mask_request_host`` may be: a host name, with a port and ``${PORT}``; nothing that could
end or add a header line."""
DROPPED = frozenset({b"e2b-traffic-access-token", b"x-access-token"})
NOT_FOUND = "sandbox {} was not found, or the request carried no valid traffic access token"


def addressed(headers: Message) -> tuple[int, str] | None:
    """The (port, sandbox id) a request's ``Host`` names, if it is a sandbox's own port."""
    if headers.get("E2b-Sandbox-Id") is not None:
        return None
    m = HOST.match(headers.get("Host") or "")
    if m is None or int(m.group(1)) in (ENVD_PORT, int(interpreter.PORT)) or not 1 <= int(m.group(1)) <= 65535:
        return None
    return int(m.group(1)), m.group(2)


def ingress(body: dict[str, Any]) -> tuple[bool, str | None]:
    """A create request's ``network.allowPublicTraffic`` (True when absent, as E2B's default) and
    ``network.maskRequestHost`` (None when absent), checked."""
    network = body.get("network")
    if network is None:
        return True, None
    if not isinstance(network, dict):
        raise ServeError(400, 'network must be an object, e.g. {"network": {"allowPublicTraffic": false}}')
    public = network.get("allowPublicTraffic", True)
    if public is None:
        public = True
    if not isinstance(public, bool):
        raise ServeError(400, 'network.allowPublicTraffic must be true or false, e.g. {"allowPublicTraffic": false}')
    mask = network.get("maskRequestHost")
    if mask is not None and (not isinstance(mask, str) or not MASK.match(mask)):
        raise ServeError(
            400, 'network.maskRequestHost must be a host name (${PORT} for the port), e.g. "${PORT}-app.example.com"'
        )
    return public, mask


def admitted(registry: Registry, sandbox_id: str, headers: Message, wake: bool = False) -> Served | None:
    """The sandbox a port request names, if it takes the request: public, or private and the request
    carries its traffic access token. None, alike, for an unknown, paused or refusing sandbox."""
    with registry.lock:
        served = registry.served.get(sandbox_id)
    if served is None:
        return None
    if not served.public_traffic:
        token = headers.get("e2b-traffic-access-token")
        if token is None or not hmac.compare_digest(interpreter.traffic_token(served).encode(), token.encode()):
            return None
    return registry.by_token(served.id, served.access_token, wake)  # paused: None, unless it resumes on traffic


def _text(status: int, message: str) -> Response:
    return Response(status, json.dumps({"code": status, "message": message}).encode(), "application/json")


class Relay:
    """What ``jailbox serve``'s HTTP server hands a connection whose request names a sandbox's port."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def wants(self, headers: Message) -> bool:
        return addressed(headers) is not None

    def run(self, headers: Message, conn: socket.socket, rfile: io.BufferedReader, head: bytes) -> Response | None:
        """Connect to the port and relay until either side closes; or the answer to send instead."""
        target = addressed(headers)
        assert target is not None  # ``wants`` said so
        port, sandbox_id = target
        served = admitted(self.registry, sandbox_id, headers, wake=True)
        if served is None:
            return _text(502, NOT_FOUND.format(sandbox_id[:64]))
        try:
            head = rewrite(head, None if served.mask_host is None else served.mask_host.replace("${PORT}", str(port)))
        except ValueError as exc:
            return _text(400, str(exc))
        try:
            jail = served.sandbox.connect_port(port)
        except ConnectionRefusedError:
            return _text(502, f"the sandbox {served.id} is running, but nothing listens on its port {port}")
        except (OSError, ProtocolError, SandboxError) as exc:
            return _text(502, f"cannot reach port {port} of sandbox {served.id}: {exc}")
        with jail:
            pump(conn, rfile, jail, head)
        return None


def rewrite(head: bytes, host: str | None) -> bytes:
    """The request's head for the jail: E2B's tokens dropped, ``Host`` made ``host`` if given. A folded
    header line (obsolete, and a way to hide one header in another) is refused."""
    lines = head.split(b"\n")
    out = [lines[0]]
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise ValueError("a folded header line is not relayed: send each header on one line")
        name = line.split(b":", 1)[0].strip().lower()
        if name in DROPPED:
            continue
        if name == b"host" and host is not None:
            line = b"Host: " + host.encode() + b"\r"
        out.append(line)
    return b"\n".join(out)


def _send(sock: socket.socket, data: bytes, last: list[float]) -> bool:
    """All of ``data`` to ``sock``, each wait bounded by what is left of ``RELAY_IDLE``; False if it
    could not be (closed, or no room for that long). ``MSG_DONTWAIT``: the jail shares the socket's
    file status and could make it blocking again, which must not hold this thread."""
    view = memoryview(data)
    while view:
        if not select.select([], [sock], [], max(0.0, last[0] + RELAY_IDLE - time.monotonic()))[1]:
            return False
        try:
            sent = sock.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return False
        view = view[sent:]
        last[0] = time.monotonic()
    return True


def _copy(source: socket.socket, sink: socket.socket, last: list[float], done: threading.Event, final: bool) -> None:
    """Bytes from ``source`` to ``sink`` as they come until ``source`` ends (then ``sink`` is shut for
    writing, and with ``final`` the relay is over: nothing can answer what the other side still
    sends), either fails, nothing moved either way for ``RELAY_IDLE`` seconds, or ``done`` is set."""
    try:
        while not done.is_set():
            wait = min(1.0, last[0] + RELAY_IDLE - time.monotonic())
            if wait <= 0:
                break
            if not select.select([source], [], [], wait)[0]:
                continue
            try:
                data = source.recv(CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                if final:
                    done.set()
                return
            last[0] = time.monotonic()
            if not _send(sink, data, last):
                break
    except OSError:
        pass
    done.set()  # a failure ends both directions


def pump(conn: socket.socket, rfile: io.BufferedReader, jail: socket.socket, head: bytes) -> None:
    """Relay ``conn`` (the client's connection, whose reader may hold bytes past the head) and ``jail``
    both ways: the head first, then whatever either side sends, until both have ended."""
    last = [time.monotonic()]
    try:
        conn.setblocking(False)
        early = rfile.peek()  # what the reader took past the head, never a wait (non-blocking now)
        rfile.read(len(early))
    except OSError:  # the client went away already
        return
    done = threading.Event()
    if not _send(jail, head + early, last):
        return
    back = threading.Thread(target=_copy, args=(jail, conn, last, done, True), name="jailbox-serve-relay", daemon=True)
    back.start()
    _copy(conn, jail, last, done, False)
    back.join(timeout=RELAY_IDLE)
    done.set()
    back.join()
