"""``jailbox serve``'s signed file URLs and metrics, driven by the unmodified E2B SDK.

The server runs as a subprocess on loopback; the SDK runs in a fresh interpreter and the URLs it
signs are fetched by a plain HTTP client, as a browser or ``curl`` given one would. Real jails.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.serve import KEY_A, Served, api, need_sdk, sdk, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    need_sdk()
    served = yield from serving(tmp_path_factory.mktemp("signed"), "--max-per-key", "6")
    assert "Traceback" not in "".join(served.log), "".join(served.log)


@pytest.mark.slow
def test_signed_urls_open_only_what_they_were_signed_for(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        import urllib.parse

        import httpx
        from e2b import Sandbox
        from e2b.sandbox.signature import get_signature

        sb = Sandbox.create(template="host", secure=True)
        other = Sandbox.create(template="host", secure=True)
        sb.files.write("/tmp/a.txt", "secret a")
        sb.files.write("/tmp/b.txt", "secret b")
        other.files.write("/tmp/a.txt", "other a")

        def get(url):
            return httpx.get(url, timeout=30)

        def put(url, data):
            return httpx.post(url, files={"file": ("x", data)}, timeout=30)

        def with_query(url, **changes):
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query))
            query.update(changes)
            return parts._replace(query=urllib.parse.urlencode(query)).geturl()

        # signed URLs, with and without an expiry, download and upload through no header at all
        for expiry in (None, 60):
            r = get(sb.download_url("/tmp/a.txt", use_signature_expiration=expiry))
            assert (r.status_code, r.text) == (200, "secret a"), (r.status_code, r.text)
        r = put(sb.upload_url("/tmp/up.txt", use_signature_expiration=60), b"uploaded")
        assert r.status_code == 200, (r.status_code, r.text)
        assert sb.files.read("/tmp/up.txt") == "uploaded"
        r = get(other.download_url("/tmp/a.txt"))  # the signature finds its own sandbox
        assert (r.status_code, r.text) == (200, "other a"), (r.status_code, r.text)

        # each way of reusing a signature for something else is 401, as envd answers it
        read_a = sb.download_url("/tmp/a.txt", use_signature_expiration=60)
        write_a = sb.upload_url("/tmp/a.txt", use_signature_expiration=60)
        base = read_a.split("?")[0]
        refused = {
            "bare": get(base + "?path=/tmp/a.txt"),
            "another path": get(with_query(read_a, path="/tmp/b.txt")),
            "another user": get(with_query(read_a, username="root")),
            "a later expiry": get(with_query(read_a, signature_expiration=str(int(time.time()) + 3600))),
            "no expiry": get(read_a.split("&signature_expiration")[0]),
            "read as write": put(read_a, b"overwritten"),
            "write as read": get(write_a),
            "expired": get(sb.download_url("/tmp/a.txt", use_signature_expiration=-10)),
            "malformed": get(with_query(read_a, signature="v1_" + "A" * 43)),
            "bad expiry": get(with_query(read_a, signature_expiration="soon")),
        }
        for why, r in refused.items():
            assert r.status_code == 401, (why, r.status_code, r.text)
            assert "Traceback" not in r.text and r.json()["message"], (why, r.text)
        assert refused["expired"].json()["message"] == "signature is already expired"
        assert sb.files.read("/tmp/a.txt") == "secret a"  # the refused upload wrote nothing

        # the other sandbox's token signs nothing of this one's
        forged = get_signature("/tmp/a.txt", "read", None, other._envd_access_token)
        r = get(with_query(read_a.split("&signature_expiration")[0], signature=forged["signature"]))
        assert (r.status_code, r.text) == (200, "other a"), (r.status_code, r.text)
        # a sandbox named by the SDK's host form is held to its own token
        host = {"Host": f"49983-{sb.sandbox_id}.localhost"}
        r = httpx.get(with_query(base + "?path=/tmp/a.txt", signature=forged["signature"]), headers=host)
        assert r.status_code == 401, (r.status_code, r.text)

        # a killed sandbox's URLs open nothing
        url = sb.download_url("/tmp/a.txt")
        sb.kill()
        assert get(url).status_code == 401
        other.kill()
        """,
    )


@pytest.mark.slow
def test_metrics_are_the_sandboxs_use_now_in_e2bs_shape(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import datetime, time
        from e2b import Sandbox, SandboxException, SandboxNotFoundException

        sb = Sandbox.create(template="host")
        sb.commands.run("python3 -c 'import time; x = bytearray(96 << 20); time.sleep(30)' &")
        sb.commands.run("head -c 16000000 /dev/zero > /big; timeout 1 sh -c 'while :; do :; done'; true")
        time.sleep(0.3)
        for _ in range(100):  # the writable layer is walked by the watcher, a little at a time
            (m,) = sb.get_metrics()
            if m.disk_used >= 16_000_000:
                break
            time.sleep(0.1)
        assert m.cpu_count >= 1 and 0 < m.cpu_used_pct <= 100, m
        assert m.mem_used >= 96 << 20 and m.mem_total == 2 << 30, m
        assert 16_000_000 <= m.disk_used < m.disk_total == 4 << 30, m
        assert abs(m.timestamp.timestamp() - time.time()) < 30, m

        (again,) = Sandbox.get_metrics(sb.sandbox_id)  # the class form, by id
        assert again.mem_total == m.mem_total
        now = datetime.datetime.now(datetime.timezone.utc)
        assert sb.get_metrics(start=now - datetime.timedelta(hours=1), end=now) != []
        assert sb.get_metrics(end=now - datetime.timedelta(hours=1)) == []  # no history is kept
        assert sb.get_metrics(start=now + datetime.timedelta(hours=1)) == []

        other = Sandbox.get_metrics  # another key's sandbox, and one that never was, are not found
        for missing in ("nosuch", sb.sandbox_id):
            key = "jbx_" + "b" * 40 if missing == sb.sandbox_id else None
            try:
                other(missing, api_key=key) if key else other(missing)
                raise AssertionError(f"metrics of {missing} were given")
            except SandboxNotFoundException:
                pass
        sb.kill()
        """,
    )


def test_a_bad_metrics_window_is_named(server: Served) -> None:
    status, made = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(made, dict), made
    try:
        for query in ("start=soon", "end=1e9", "start=" + "9" * 40):
            status, body = api(server, "GET", f"/sandboxes/{made['sandboxID']}/metrics?{query}", KEY_A)
            name = query.split("=")[0]
            assert status == 400 and f"{name} must be Unix seconds" in body["message"], (query, status, body)
    finally:
        api(server, "DELETE", f"/sandboxes/{made['sandboxID']}", KEY_A)


# A server for the jail, stdlib only: GET answers the Host and header names it saw, POST echoes its
# body, and /ws upgrades to a WebSocket that echoes each text frame back.
ECHO = r"""
import base64, hashlib, json, struct, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _reply(self, body, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
            self.end_headers()
            self.wfile.flush()
            while True:
                head = self.rfile.read(2)
                if len(head) < 2 or head[0] & 0x0F == 8:
                    return
                size = head[1] & 0x7F
                if size == 126:
                    size = struct.unpack(">H", self.rfile.read(2))[0]
                mask = self.rfile.read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(size)))
                out = b"echo:" + data
                size = bytes([126]) + struct.pack(">H", len(out)) if len(out) > 125 else bytes([len(out)])
                self.wfile.write(bytes([0x81]) + size + out)
                self.wfile.flush()
        names = sorted(k.lower() for k in self.headers.keys())
        seen = {"host": self.headers["Host"], "names": names, "path": self.path}
        self._reply(json.dumps(seen).encode())
    def do_POST(self):
        self._reply(self.rfile.read(int(self.headers["Content-Length"])), "application/octet-stream")

ThreadingHTTPServer.address_family = __import__("socket").AF_INET
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""


@pytest.mark.slow
def test_get_host_reaches_a_sandbox_port_over_http_and_websocket(server: Served, tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    sdk(
        server,
        tmp_path,
        """
        import json, os, shutil, subprocess, time
        import httpx, websocket
        from e2b import Sandbox

        url = os.environ["E2B_API_URL"]
        sb = Sandbox.create(template="host")
        sb.files.write("/tmp/echo.py", open("echo.py").read())
        sb.commands.run("python3 /tmp/echo.py 8080", background=True)
        host = sb.get_host(8080)
        port = url.rsplit(":", 1)[1]
        assert host == f"8080-{sb.sandbox_id}.localhost:{port}", host  # under localhost: loopback by RFC 6761

        def get(path="/", **headers):
            for _ in range(100):
                r = httpx.get(url + path, headers={"Host": host, **headers}, timeout=30)
                if r.status_code != 502 or "nothing listens" not in r.text:
                    return r
                time.sleep(0.1)
            return r

        # where the resolver knows *.localhost (curl, browsers, systemd-resolved) the name works as it is;
        # any HTTP client reaches it by the server's address and the name as Host
        r = get("/a?b=1", **{"e2b-traffic-access-token": sb.traffic_access_token, "X-Other": "kept"})
        seen = r.json()
        assert r.status_code == 200 and seen["host"] == host and seen["path"] == "/a?b=1", (r.status_code, r.text)
        assert "x-other" in seen["names"] and "e2b-traffic-access-token" not in seen["names"], seen
        if shutil.which("curl"):
            out = subprocess.run(["curl", "-sS", "-m", "30", f"http://{host}/c"], capture_output=True, text=True)
            assert json.loads(out.stdout)["path"] == "/c", out.stdout + out.stderr

        # a body of 3 MiB each way, and keep-alive requests on one connection
        body = os.urandom(3 << 20)
        with httpx.Client(timeout=60) as client:
            for _ in range(3):
                r = client.post(url + "/up", content=body, headers={"Host": host})
                assert r.status_code == 200 and r.content == body, (r.status_code, len(r.content))

        # a WebSocket: the upgrade, then frames both ways
        ws = websocket.create_connection(url.replace("http", "ws") + "/ws", host=host, timeout=30)
        for text in ("hello", "x" * 5000):
            ws.send(text)
            assert ws.recv() == "echo:" + text
        ws.close()

        # a port where nothing listens, a sandbox that does not exist, the daemon's port: as E2B's
        r = httpx.get(url + "/", headers={"Host": sb.get_host(8081)}, timeout=30)
        assert r.status_code == 502 and "nothing listens on its port 8081" in r.text, r.text
        r = httpx.get(url + "/", headers={"Host": f"8080-jb0000000000000000000000.localhost:{port}"}, timeout=30)
        assert r.status_code == 502 and "was not found" in r.text, r.text
        sb.kill()
        r = httpx.get(url + "/", headers={"Host": host}, timeout=30)
        assert r.status_code == 502 and "was not found" in r.text, r.text
        """,
    )


@pytest.mark.slow
def test_a_private_sandbox_port_needs_its_traffic_token_and_masks_the_host(server: Served, tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    sdk(
        server,
        tmp_path,
        """
        import os, time
        import httpx
        from e2b import Sandbox, SandboxException

        url = os.environ["E2B_API_URL"]
        sb = Sandbox.create(
            template="host", network={"allow_public_traffic": False, "mask_request_host": "${PORT}-app.example.com"}
        )
        sb.files.write("/tmp/echo.py", open("echo.py").read())
        sb.commands.run("python3 /tmp/echo.py 3000", background=True)
        host, token = sb.get_host(3000), sb.traffic_access_token

        def get(**headers):
            return httpx.get(url + "/", headers={"Host": host, **headers}, timeout=30)

        for _ in range(100):
            r = get(**{"e2b-traffic-access-token": token})
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["host"] == "3000-app.example.com", r.text
        assert "e2b-traffic-access-token" not in r.json()["names"], r.text
        missing, wrong = get(), get(**{"e2b-traffic-access-token": token[:-1] + ("0" if token[-1] != "0" else "1")})
        other = Sandbox.create(template="host")  # another sandbox's token opens nothing here
        stolen = get(**{"e2b-traffic-access-token": other.traffic_access_token})
        for r in (missing, wrong, stolen):
            assert r.status_code == 502 and "was not found" in r.text, (r.status_code, r.text)
        # the host its forks are reached by is as private
        (child,) = sb.fork(count=1)
        child.files.write("/tmp/echo.py", open("echo.py").read())  # a child's /tmp starts empty
        child.commands.run("python3 /tmp/echo.py 3000", background=True)
        child_host = {"Host": child.get_host(3000)}
        for _ in range(100):
            r = httpx.get(url + "/", headers={**child_host, "e2b-traffic-access-token": child.traffic_access_token})
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["host"] == "3000-app.example.com", r.text
        assert httpx.get(url + "/", headers=child_host, timeout=30).status_code == 502
        for bad in ({"mask_request_host": "a\\r\\nX-Injected: 1"}, {"mask_request_host": ""}):
            try:
                Sandbox.create(template="host", network=bad)
                raise AssertionError(f"{bad} was taken")
            except SandboxException as exc:
                assert "maskRequestHost must be a host name" in str(exc), exc
        for s in (sb, other, child):
            s.kill()
        """,
    )


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_relay_holds_a_bounded_amount_for_a_sandbox_that_stops_reading(server: Served, tmp_path: Path) -> None:
    """A client sending 64 MiB to a port whose server never reads, eight at once: the relay holds at
    most its chunk a direction, so the server grows by the kernel's socket buffers at most."""
    stall = "import socket, time; s = socket.create_server(('127.0.0.1', 7000)); c = [s.accept() for _ in range(8)]"
    (tmp_path / "stall.py").write_text(stall + "; time.sleep(300)\n")
    sandbox_id = sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox
        sb = Sandbox.create(template="host")
        sb.files.write("/tmp/stall.py", open("stall.py").read())
        sb.commands.run("python3 /tmp/stall.py", background=True)
        print(sb.sandbox_id)
        """,
    ).split()[-1]
    port = server.url.rsplit(":", 1)[1]
    head = f"POST / HTTP/1.1\r\nHost: 7000-{sandbox_id}.localhost:{port}\r\nContent-Length: {64 << 20}\r\n\r\n"
    before = _rss(server.proc.pid)
    clients, sent = [], []
    try:
        for _ in range(8):
            for _ in range(100):  # until the stalled server listens
                sock = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
                sock.sendall(head.encode())
                sock.settimeout(0.2)
                try:
                    if b"nothing listens" in sock.recv(4096):
                        sock.close()
                        time.sleep(0.1)
                        continue
                except TimeoutError:
                    pass
                break
            clients.append(sock)
            total, chunk = 0, b"x" * (1 << 20)
            sock.settimeout(1)
            try:
                while total < 64 << 20:
                    total += sock.send(chunk)
            except TimeoutError:
                pass
            sent.append(total)
        grown = _rss(server.proc.pid) - before
    finally:
        for sock in clients:
            sock.close()
        api(server, "DELETE", f"/sandboxes/{sandbox_id}", KEY_A)
    assert len(sent) == 8, sent
    assert all(total < 32 << 20 for total in sent), sent  # the jail never read: only buffers took it
    assert grown < 16 << 20, (grown, sent)
    print(f"sent before the relay stopped taking: {[s >> 20 for s in sent]} MiB; server grew {grown >> 20} MiB")


def test_odd_hosts_and_folded_headers_get_an_answer_not_a_crash(server: Served) -> None:
    status, made = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(made, dict), made
    sandbox_id = made["sandboxID"]
    port = int(server.url.rsplit(":", 1)[1])

    def ask(head: str) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head.encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer

    try:
        for host in ("0-{id}.localhost", "99999-{id}.localhost", "8080-{ID}.localhost", "8080-.localhost", "8080-{id}"):
            answer = ask(f"GET / HTTP/1.1\r\nHost: {host.format(id=sandbox_id, ID=sandbox_id.upper())}\r\n\r\n")
            assert answer.startswith((b"HTTP/1.0 4", b"HTTP/1.0 5", b"HTTP/1.1 4", b"HTTP/1.1 5")), (host, answer)
            assert b" 500 " not in answer.split(b"\r\n")[0] and b"Traceback" not in answer, (host, answer)
        folded = f"GET / HTTP/1.1\r\nHost: 8080-{sandbox_id}.localhost\r\nX-A: 1\r\n\tHost: elsewhere\r\n\r\n"
        answer = ask(folded)
        assert b" 400 " in answer.split(b"\r\n")[0] and b"folded header line" in answer, answer
    finally:
        api(server, "DELETE", f"/sandboxes/{sandbox_id}", KEY_A)
    assert "Traceback" not in "".join(server.log), "".join(server.log)
