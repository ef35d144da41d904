"""The attack battery, ``allow:`` proxy: a request the rules allowed cannot carry another one.

The upstream here is a raw TCP server that records every byte it receives and answers every request
head it sees, as a lenient server or CDN front would (it ignores ``Connection: close``): what matters
is what the proxy lets through, not what a polite server does with it.
"""

from __future__ import annotations

import socket
import textwrap
import threading

import pytest

from jailbox.sandbox import NetworkPolicy, Sandbox
from jailbox.sandbox.net.policy import Rules

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"


class RawServer:
    """Accepts connections on loopback; keeps each connection's bytes; answers each request head."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.accepted = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        data = b""
        answered = 0
        conn.settimeout(2)
        with conn:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
                while data.count(b"\r\n\r\n") > answered:
                    answered += 1
                    conn.sendall(RESPONSE)
        with self.lock:
            self.received.append(data)

    def request_lines(self) -> list[bytes]:
        with self.lock:
            return [line for data in self.received for line in data.split(b"\r\n") if b" HTTP/1." in line]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def upstream():
    server = RawServer()
    yield server
    server.close()


def allow(*rules: str) -> Sandbox:
    names = {"allowed.test": "127.0.0.1", "other.test": "127.0.0.1"}
    return Sandbox(network=NetworkPolicy(mode="allow", allow=rules, hosts=names))


def send_raw(sb: Sandbox, payload: bytes) -> str:
    """Send ``payload`` to the proxy from inside the jail in one write; return what came back."""
    code = textwrap.dedent(f"""
        import socket
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall({payload!r})
        s.settimeout(5)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        print(out.decode("latin-1"))
    """)
    return sb.exec(["python3", "-c", code], timeout=60).stdout


def test_a_host_header_naming_another_host_is_refused(upstream):
    port = upstream.port
    with allow(f"allowed.test:{port}") as sb:
        for host in ("other.test", f"other.test:{port}", f"allowed.test:{port + 1}", "127.0.0.1"):
            out = send_raw(sb, f"GET http://allowed.test:{port}/x HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert out.startswith("HTTP/1.1 400") and f"the Host header names {host!r}" in out
        out = send_raw(sb, f"GET http://allowed.test:{port}/x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".encode())
        assert out.startswith("HTTP/1.1 400") and "more than one Host header" in out
        r = sb.exec(f"curl -sS -H 'Host: other.test' http://allowed.test:{port}/x")
        assert "the Host header names 'other.test'" in r.stdout
        ok = send_raw(sb, f"GET http://allowed.test:{port}/x HTTP/1.1\r\nHost: ALLOWED.test:{port}\r\n\r\n".encode())
        assert ok.startswith("HTTP/1.1 200")
    assert upstream.request_lines() == [b"GET /x HTTP/1.1"]
    assert b"\r\nHost: allowed.test:%d\r\n" % port in upstream.received[0]


@pytest.mark.slow
def test_a_pipelined_second_request_never_reaches_the_server(upstream):
    port = upstream.port
    first = f"GET http://allowed.test:{port}/first HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n"
    second_shapes = [
        f"GET /second HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n",  # origin form, to the same server
        f"GET http://other.test:{port}/second HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n",
    ]
    with allow(f"allowed.test:{port}") as sb:
        for second in second_shapes:
            out = send_raw(sb, (first + second).encode())
            assert out.startswith("HTTP/1.1 200") and out.count("HTTP/1.1") == 1
        body = "a=1\r\nGET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n"
        post = (
            f"POST http://allowed.test:{port}/form HTTP/1.1\r\nHost: allowed.test:{port}\r\nContent-Length: 3\r\n\r\n"
        )
        send_raw(sb, (post + body).encode())
        chunked = (
            f"POST http://allowed.test:{port}/up HTTP/1.1\r\nHost: allowed.test:{port}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n4;ext=1\r\nabcd\r\n0\r\nX-Trailer: 1\r\n\r\n"
            "GET /after-chunks HTTP/1.1\r\nHost: other.test\r\n\r\n"
        )
        send_raw(sb, chunked.encode())
        both = (
            f"POST http://allowed.test:{port}/both HTTP/1.1\r\nHost: allowed.test:{port}\r\n"
            "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        out = send_raw(sb, both.encode())
        assert out.startswith("HTTP/1.1 400") and "both Transfer-Encoding and Content-Length" in out
        refused = [e for e in sb.network_log() if e.reason.startswith("a second request")]
        assert len(refused) == 4
    lines = upstream.request_lines()
    assert lines == [b"GET /first HTTP/1.1"] * 2 + [b"POST /form HTTP/1.1", b"POST /up HTTP/1.1"]
    assert b"4;ext=1\r\nabcd\r\n0\r\nX-Trailer: 1\r\n\r\n" in upstream.received[3]


@pytest.mark.slow
def test_allow_rules_take_ports_and_default_to_http_and_https(upstream):
    port = upstream.port
    connect = f"CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n".encode()
    with allow("allowed.test") as sb:  # no ports: 80 and 443 only
        out = send_raw(sb, connect)
        assert out.startswith("HTTP/1.1 403")
        assert f"port {port} of allowed.test is not allowed by rule 'allowed.test' (name the port" in out
        r = sb.exec(f"curl -sS http://allowed.test:{port}/x")
        assert "is not allowed by rule 'allowed.test'" in r.stdout
    with allow(f"allowed.test:{port - 1}-{port}", f"other.test:{port + 1}") as sb:
        assert send_raw(sb, connect).startswith("HTTP/1.1 200 Connection established")
        other = f"CONNECT other.test:{port} HTTP/1.1\r\n\r\n".encode()
        assert "not allowed by rule" in send_raw(sb, other)
    with allow("*:*") as sb:
        assert send_raw(sb, connect).startswith("HTTP/1.1 200 Connection established")
    with Sandbox(
        network=NetworkPolicy(
            mode="allow", allow=("*:*",), deny=(f"allowed.test:{port}",), hosts={"allowed.test": "127.0.0.1"}
        )
    ) as sb:
        assert f"denied by rule 'allowed.test:{port}'" in send_raw(sb, connect)
    assert upstream.accepted == 2  # the two tunnels that were allowed


def test_rule_ports_parse_and_match():
    rules = Rules(("pypi", "*.example.com:8443", "10.0.0.0/8:22", "[::1]:8080", "a.test:80+8000-8002"), ("pypi:80",))
    assert rules.check_name("pypi.org", 443)[0] and not rules.check_name("pypi.org", 80)[0]
    assert rules.check_name("x.example.com", 8443)[0] and not rules.check_name("x.example.com", 443)[0]
    assert [rules.check_name("a.test", p)[0] for p in (80, 443, 7999, 8000, 8002, 8003)] == [
        True, False, False, True, True, False,
    ]  # fmt: skip
    import ipaddress

    assert rules.check_address(ipaddress.ip_address("10.1.2.3"), 22)[0]
    assert not rules.check_address(ipaddress.ip_address("10.1.2.3"), 443)[0]
    assert rules.check_address(ipaddress.ip_address("::1"), 8080)[0]
    policy = NetworkPolicy.parse("allow:pypi:443,*.example.com:*,[::1]:8080,!bad.example.com:22")
    assert policy.allow == ("pypi:443", "*.example.com:*", "[::1]:8080") and policy.deny == ("bad.example.com:22",)
    for bad in ("allow:a.test:0", "allow:a.test:70000", "allow:a.test:http", "allow:a.test:9-3", "allow:[::1]x"):
        with pytest.raises(ValueError, match="rule"):
            NetworkPolicy.parse(bad)
