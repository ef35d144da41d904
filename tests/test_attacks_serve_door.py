"""``jailbox serve``'s front door: what a client costs the server before its key is checked (huge
headers, bodies sent without a key, hundreds of slow connections from one peer or several, headers
trickled a byte at a time), and what one key can hold at once (large downloads). Under each, the
server's memory grows by at most ``GROWTH`` and another tenant's request is answered within
``SERVED_WITHIN`` seconds. Real server on loopback, real jails, raw sockets; the figures are printed
(``-s`` shows them)."""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import psutil
import pytest
from support.serve import KEY_A, KEY_B, Served, api, key_file, need_sdk, start_server

from jailbox.servers.e2b.httpd import (
    HEAD_TIMEOUT,
    KEEP_ALIVE,
    MAX_HEADER_BYTES,
    MAX_REQUEST_LINE,
    MAX_TENANT_CONNECTIONS,
)

pytestmark = pytest.mark.once  # the server's HTTP parsing is the same whoever runs it

GROWTH = 256 << 20
"""The goal: what an attack may add to the server's resident memory."""
SERVED_WITHIN = 5.0
"""The goal: how long another tenant's request may take while an attack is under way."""
CLOSE_SLACK = 5.0
"""How late past its deadline a connection may be closed: a loaded two-core machine's scheduling."""


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server per test: what one attack leaves allocated (memory freed but kept) is not the next's."""
    need_sdk()
    tmp = tmp_path_factory.mktemp("door")
    served = start_server(tmp, "--api-key-file", str(key_file(tmp, KEY_A, KEY_B)))
    yield served
    served.stop()


def _address(server: Served) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


class Peak:
    """The server's resident memory, sampled every 10 ms while the block runs."""

    def __init__(self, server: Served) -> None:
        self.proc = psutil.Process(server.proc.pid)
        self.before = self.peak = self.proc.memory_info().rss
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._done.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)

    def __enter__(self) -> Peak:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()
        print(f"server memory: {self.before >> 20} MiB before, {self.peak >> 20} MiB at the peak")

    def check(self) -> None:
        assert self.peak - self.before <= GROWTH, f"the server grew by {(self.peak - self.before) >> 20} MiB"


def _tenant_b_is_served(server: Served) -> float:
    """Tenant B lists its sandboxes on a new connection; the seconds it took, asserted within the goal."""
    started = time.monotonic()
    req = urllib.request.Request(server.url + "/v2/sandboxes", headers={"X-API-Key": KEY_B})
    with urllib.request.urlopen(req, timeout=SERVED_WITHIN) as r:
        assert r.status == 200
        r.read()
    took = time.monotonic() - started
    assert took <= SERVED_WITHIN, f"tenant B waited {took:.1f} s"
    return took


class Held:
    """Senders that send all of a request but its end, wait until every one has (``all_sent``), then
    send the ends together when ``go`` is set: what the server holds of each is held at once."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.go = threading.Event()
        self._changed = threading.Condition()

    def sent(self) -> None:
        with self._changed:
            self.left -= 1
            self._changed.notify_all()

    def all_sent(self, timeout: float) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.left == 0, timeout), f"{self.left} still sending"


def _status(server: Served, data: bytes, end: bytes = b"", held: Held | None = None) -> str:
    """Send ``data`` on a new connection, then ``end`` once ``held`` says go (beside the read: a
    server that refuses early stops reading); the reply's status line, or why there is none."""
    with socket.create_connection(_address(server), timeout=120) as c:

        def send() -> None:
            try:
                c.sendall(data)
            except OSError:  # refused and closed before all of it went
                return
            finally:
                if held is not None:
                    held.sent()
            if held is not None and held.go.wait(120):
                try:
                    c.sendall(end)
                except OSError:
                    pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reply = b""
        try:
            while b"\r\n" not in reply and (chunk := c.recv(4096)):
                reply += chunk
        except OSError as exc:
            return f"no reply: {exc}"
        sender.join(120)
    return reply.split(b"\r\n")[0].decode(errors="replace") or "closed without a reply"


def _all_at_once(jobs: list[Callable[[], str]], meanwhile: Callable[[], None]) -> list[str]:
    """Run ``jobs`` in threads at once, ``meanwhile`` after half a second of them; their results."""
    results = [""] * len(jobs)

    def run(i: int) -> None:
        results[i] = jobs[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        meanwhile()
    finally:
        for t in threads:
            t.join(300)
    return results


def test_huge_request_lines_and_headers_without_a_key(server: Served) -> None:
    """100 connections each sending 99 header lines of 64,000 bytes, all held at once before their
    ends arrive together (what ``http.server`` read and parsed whole: before, 100 of them took the
    server from 200 MB to 2.9 GB), beside an endless header line, ten thousand small ones, an endless
    request line, and large headers naming a sandbox: each is 431 or 414 without the rest being read,
    and another tenant is served meanwhile."""
    start = b"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\n"
    wide = start + (b"X-Pad: " + b"p" * 64000 + b"\r\n") * 99
    endless_line = start + b"X-Pad: " + b"p" * (16 << 20)
    many = start + b"A: b\r\n" * 10000
    long_target = b"GET /" + b"a" * (1 << 20)
    envd = b"POST /process.Process/List HTTP/1.1\r\nE2b-Sandbox-Id: jb0\r\n" + wide[len(start) :]
    attacks = [wide] * 100 + [endless_line] * 8 + [many] * 8 + [long_target] * 8 + [envd] * 8
    held = Held(len(attacks))

    def meanwhile() -> None:
        held.all_sent(120)
        print(f"served in {_tenant_b_is_served(server):.2f} s with every head held")
        held.go.set()
        print(f"served in {_tenant_b_is_served(server):.2f} s as the heads end")

    jobs = [
        lambda a=a: _status(server, a, b" HTTP/1.1\r\n\r\n" if a is long_target else b"\r\n\r\n", held) for a in attacks
    ]
    with Peak(server) as peak:
        statuses = _all_at_once(jobs, meanwhile)
    peak.check()
    print(sorted(set(statuses)))
    for attack, status in zip(attacks, statuses, strict=True):
        assert (" 414 " if attack is long_target else " 431 ") in status + " ", status
    # at the bounds exactly, a request is served
    line = b"GET /v2/sandboxes?" + b"a" * (MAX_REQUEST_LINE - 40) + b" HTTP/1.1\r\n"
    pads = b"".join(b"X-P%d: %s\r\n" % (i, b"p" * 1000) for i in range(MAX_HEADER_BYTES // 1024 - 1))
    assert " 200 " in _status(server, line + f"X-API-Key: {KEY_A}\r\n".encode() + pads + b"\r\n")


@pytest.mark.slow
def test_bodies_sent_without_a_key_are_not_read(server: Served) -> None:
    """400 key-less requests each sending all but the last byte of a 1 MiB body (before, each was read
    into memory to be refused after: 400 MiB held), and 16 MiB ones to a sandbox with a wrong token."""
    light = b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 20)
    light += b" " * ((1 << 20) - 1)
    heavy = b"POST /process.Process/List HTTP/1.1\r\nE2b-Sandbox-Id: jb0\r\nX-Access-Token: t\r\n"
    heavy += b"Content-Length: %d\r\n\r\n" % (16 << 20) + b" " * ((16 << 20) - 1)

    def hold(data: bytes) -> str:
        """Send ``data`` and wait (up to 20 s) for the server's answer or close."""
        with socket.create_connection(_address(server), timeout=60) as c:
            try:
                c.sendall(data)
                c.settimeout(20)
                return c.recv(4096).split(b"\r\n")[0].decode() or "closed"
            except OSError as exc:
                return f"closed: {exc}"

    with Peak(server) as peak:
        statuses = _all_at_once(
            [lambda: hold(light)] * 400 + [lambda: hold(heavy)] * 16,
            lambda: print(f"served in {_tenant_b_is_served(server):.2f} s"),
        )
    peak.check()
    print(sorted(set(statuses)))
    for status in statuses:  # refused, or closed to make room for the others' connections
        assert " 401 " in status or " 503 " in status or status.startswith("closed"), status


class Holder:
    """Connections from ``sources`` sending a request's head a byte every ``every`` seconds; each one
    the server closes is opened again at once, so the pressure holds until ``stop``."""

    def __init__(self, server: Served, count: int, sources: list[str], every: float = 1.0) -> None:
        self.address = _address(server)
        self.count, self.sources, self.every = count, sources, every
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._conns: list[socket.socket | None] = [None] * count

    def _open(self, i: int) -> None:
        conn = socket.socket()
        conn.setblocking(False)
        conn.bind((self.sources[i % len(self.sources)], 0))
        try:
            conn.connect(self.address)
        except BlockingIOError:
            pass
        self._conns[i] = conn

    def _run(self) -> None:
        for i in range(self.count):
            self._open(i)
        while not self._stop.wait(self.every):
            for i, conn in enumerate(self._conns):
                assert conn is not None
                try:
                    conn.send(b"G")
                    readable, _, _ = select.select([conn], [], [], 0)
                    if readable and not conn.recv(4096):
                        raise ConnectionResetError
                except BlockingIOError:
                    continue  # not connected yet, or its buffer is full
                except OSError:
                    conn.close()
                    self.reopened += 1
                    self._open(i)

    def __enter__(self) -> Holder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._conns:
            if conn is not None:
                conn.close()


@pytest.mark.parametrize("sources", [["127.0.0.1"], ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]])
@pytest.mark.slow
def test_a_peer_holding_hundreds_of_slow_connections(server: Served, sources: list[str]) -> None:
    """600 connections trickling their request line a byte a second, reopened as soon as they are closed,
    from one address or four (before, one key-less peer held all 512 slots and every tenant was
    refused): for longer than the head deadline, another tenant's new connections are served."""
    with Peak(server) as peak, Holder(server, 600, sources) as holder:
        time.sleep(3)  # the connections are made and held
        took = []
        until = time.monotonic() + HEAD_TIMEOUT + 5
        while time.monotonic() < until:
            took.append(_tenant_b_is_served(server))
            time.sleep(1)
    peak.check()
    print(f"tenant B served {len(took)} times, the slowest in {max(took):.2f} s; {holder.reopened} reopened")


def _closed_after(conn: socket.socket, trickle: bytes, limit: float) -> float | None:
    """Send ``trickle`` a byte a second until the server closes ``conn``; the seconds that took, None if
    it is still open after ``limit``."""
    started = time.monotonic()
    conn.setblocking(False)
    sent = 0
    while time.monotonic() - started < limit:
        try:
            if sent < len(trickle):
                conn.send(trickle[sent : sent + 1])
                sent += 1
            readable, _, _ = select.select([conn], [], [], 1.0)
            while readable:  # a reply to an earlier request may still be unread
                if not conn.recv(65536):
                    return time.monotonic() - started
                readable, _, _ = select.select([conn], [], [], 0)
        except OSError:
            return time.monotonic() - started
    return None


@pytest.mark.slow
def test_slow_and_idle_connections_are_closed_by_their_deadlines(server: Served) -> None:
    """A connection without a key has ``HEAD_TIMEOUT`` seconds in all for its request line and headers,
    silent or trickled a byte a second (before, each byte bought another 120 s); a connection that has
    shown a key has ``KEEP_ALIVE`` seconds for its next request, idle or trickled."""
    request = f"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY_A}\r\n\r\n".encode()
    trickle = b"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 200

    def proven() -> socket.socket:
        conn = socket.create_connection(_address(server), timeout=30)
        conn.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += conn.recv(4096)
        assert b" 200 " in reply.split(b"\r\n")[0]
        return conn

    limit = KEEP_ALIVE + CLOSE_SLACK + 5
    cases = {
        "silent, no key": (socket.create_connection(_address(server)), b"", HEAD_TIMEOUT),
        "trickling, no key": (socket.create_connection(_address(server)), trickle, HEAD_TIMEOUT),
        "idle after a key": (proven(), b"", KEEP_ALIVE),
        "trickling after a key": (proven(), trickle, KEEP_ALIVE),
    }
    took: dict[str, float | None] = {}

    def watch(name: str) -> None:
        conn, data, _ = cases[name]
        with conn:
            took[name] = _closed_after(conn, data, limit)

    threads = [threading.Thread(target=watch, args=(name,)) for name in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print({name: None if t is None else round(t, 1) for name, t in took.items()})
    for name, (_, _, deadline) in cases.items():
        seconds = took[name]
        assert seconds is not None, f"{name}: still open after {limit} s"
        assert deadline - 1 <= seconds <= deadline + CLOSE_SLACK, f"{name}: closed after {seconds:.1f} s"
    _tenant_b_is_served(server)


@pytest.mark.slow
def test_what_one_key_holds_at_once(server: Served) -> None:
    """On all its ``MAX_TENANT_CONNECTIONS`` at once, tenant A asks for its 64 MiB file 8 times, reading
    none of the replies, and sends 120 Connect-JSON bodies just under the size of a large transfer
    (32,000 strings in 0.95 MiB) but their last bytes (before, the 8 files were held at once and took
    the 8 transfers: +634 MiB, and another key's download waited 117 s); at most
    ``MAX_TENANT_TRANSFERS`` files and ``MAX_TENANT_HELD`` bytes of bodies are held, and tenant B's own
    download and listing are served meanwhile."""
    sandboxes = {}
    for key in (KEY_A, KEY_B):
        status, made = api(server, "POST", "/v2/sandboxes", key, {"templateID": "host"})
        assert status == 201, made
        sandboxes[key] = made
    try:

        def head(key: str, method: str, path: str, *extra: str) -> bytes:
            sb = sandboxes[key]
            lines = [f"{method} {path} HTTP/1.1", "Host: x", f"E2b-Sandbox-Id: {sb['sandboxID']}"]  # type: ignore[index]
            lines += [f"X-Access-Token: {sb['envdAccessToken']}", *extra]  # type: ignore[index]
            return ("\r\n".join(lines) + "\r\n\r\n").encode()

        def upload(key: str, path: str, size: int) -> bytes:
            data = b'--b\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
            data += b"\1" * size + b"\r\n--b--\r\n"
            type_ = "Content-Type: multipart/form-data; boundary=b"
            return head(key, "POST", f"/files?path={path}", f"Content-Length: {len(data)}", type_) + data

        assert " 200 " in _status(server, upload(KEY_A, "/tmp/big", 64 << 20))
        assert " 200 " in _status(server, upload(KEY_B, "/tmp/small", 1000))
        download = head(KEY_A, "GET", "/files?path=/tmp/big")
        body = b'{"x": [' + b",".join(b'"%028d"' % i for i in range(32000)) + b"]}"
        listing = head(
            KEY_A, "POST", "/process.Process/List", "Content-Type: application/json", f"Content-Length: {len(body)}"
        )
        bodies = MAX_TENANT_CONNECTIONS - 8
        held = Held(bodies)
        conns = []
        took = 0.0

        def meanwhile() -> None:
            nonlocal took
            held.all_sent(120)
            for _ in range(8):
                conn = socket.create_connection(_address(server), timeout=60)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                conn.sendall(download)
                conns.append(conn)
            time.sleep(3)  # the server reads the files and bodies, and blocks writing the files
            started = time.monotonic()
            got = _status(server, head(KEY_B, "GET", "/files?path=/tmp/small"))
            took = time.monotonic() - started
            assert " 200 " in got, got
            assert took <= SERVED_WITHIN, f"tenant B's download waited {took:.1f} s"
            _tenant_b_is_served(server)
            held.go.set()
            for conn in conns:
                conn.close()

        with Peak(server) as peak:
            statuses = _all_at_once([lambda: _status(server, listing + body[:-1], body[-1:], held)] * bodies, meanwhile)
        peak.check()
        assert set(statuses) == {"HTTP/1.1 200 OK"}, set(statuses)
        print(f"tenant B's download took {took:.2f} s")
    finally:
        for key, made in sandboxes.items():
            api(server, "DELETE", f"/sandboxes/{made['sandboxID']}", key)  # type: ignore[index]


def test_one_key_holding_every_connection(server: Served) -> None:
    """Tenant A opens 520 connections, each makes a request and stays open (before, A held all 512
    slots and every other client's connection was closed unanswered): A keeps
    ``MAX_TENANT_CONNECTIONS``, the others are answered 503 and closed, and tenant B is served."""
    request = f"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY_A}\r\n\r\n".encode()
    conns = []
    statuses = []
    try:
        for _ in range(520):
            try:
                conn = socket.create_connection(_address(server), timeout=30)
                conns.append(conn)
                conn.sendall(request)
                statuses.append(conn.recv(4096).split(b"\r\n")[0].decode() or "closed")
            except OSError as exc:
                statuses.append(f"closed: {exc}")
        took = [_tenant_b_is_served(server) for _ in range(5)]
    finally:
        for conn in conns:
            conn.close()
    counts = {status: statuses.count(status) for status in set(statuses)}
    print(f"tenant A: {counts}; tenant B served in at most {max(took):.2f} s")
    assert counts.get("HTTP/1.1 200 OK") == MAX_TENANT_CONNECTIONS, counts
