"""Secrets kept out of the jail (``SandboxConfig.secrets``): a jailed curl reaches a stand-in HTTPS
server for a bound host with the real credential in its header, while everything the jail and
jailbox show holds only the placeholder; and the ways to get the value elsewhere, each refused or
shown harmless: another host, plain HTTP, a Host header or SNI that disagree, HTTP/2, a redirect, a
body or query, the CA's reach."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import require
from pydantic import ValidationError
from support.bundle_tree import HOST_BUNDLE, USR, bundle_tree, tree_config
from support.cli import JAILBOX
from support.service_probe import jailbox, own_service
from support.standin import make_ca

from jailbox.sandbox import NetworkPolicy, Sandbox, SandboxConfig, Secret

VALUE = "ghp_real-value-0123456789abcdef"
BOUND, OTHER = "allowed.test", "other.test"


class Server:
    """HTTPS (and a plain HTTP twin) on loopback recording every request's headers, body and path:
    ``/check`` answers whether the Authorization header holds the real value (never echoing it),
    ``/echo`` echoes the headers back (the reflection the design cannot stop), ``/away`` redirects
    to the other host, ``/auth`` asks for Basic credentials first; ``/chunked`` and ``/unsized``
    frame the answer those ways. Records which connection each request came on (``peer``)."""

    def __init__(self, cert: tuple[Path, Path] | None) -> None:
        self.seen: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                owner.seen.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body, "peer": self.client_address[1]}
                )

            def do_GET(self) -> None:
                self._record()
                if self.path.startswith("/away"):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("to=", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.startswith("/auth") and "Authorization" not in self.headers:
                    self.send_response(401)  # what a private Git repository answers first
                    self.send_header("WWW-Authenticate", 'Basic realm="stand-in"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.startswith("/echo"):
                    body = json.dumps(dict(self.headers)).encode()
                else:
                    body = b"real\n" if self.headers.get("Authorization") == f"Bearer {VALUE}" else b"not real\n"
                self.send_response(200)
                if self.path.startswith("/chunked"):  # the answer in two chunks
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (2, body[:2], len(body) - 2, body[2:]))
                    return
                if self.path.startswith("/unsized"):  # no length: the answer ends with the connection
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body)
                    self.close_connection = True
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_POST = do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*cert)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def values(self) -> str:
        return json.dumps(self.seen)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Server, SandboxConfig]]:
    """An HTTPS and an HTTP stand-in, and a sandbox config whose TOKEN is bound to allowed.test."""
    ca, cert, key = make_ca(tmp_path / "pki", ["127.0.0.1"])
    trusted = tmp_path / "host-bundle.pem"
    trusted.write_text(HOST_BUNDLE.read_text() + ca.read_text())
    monkeypatch.setenv("SSL_CERT_FILE", str(trusted))  # the proxy verifies the stand-in as a real server
    tls, plain = Server((cert, key)), Server(None)
    policy = {"mode": "allow", "allow": [f"{BOUND}:*", f"{OTHER}:*"], "hosts": {BOUND: "127.0.0.1", OTHER: "127.0.0.1"}}
    config = tree_config(
        bundle_tree(tmp_path),
        network=policy,
        ca_certs=[ca],  # so the jail can reach the unbound host's stand-in at all
        secrets=[Secret(name="TOKEN", value=VALUE, hosts=[BOUND])],
    )
    yield tls, plain, config
    tls.close()
    plain.close()


def curl(args: str) -> str:
    return f'curl -sS -m 20 -H "Authorization: Bearer $TOKEN" {args}'


@pytest.mark.needs("openssl", "curl")
def test_the_bound_host_gets_the_value_and_nothing_the_jail_or_jailbox_shows_holds_it(world) -> None:
    tls, _, config = world
    with Sandbox(config) as sb:
        r = sb.exec(curl(f"https://{BOUND}:{tls.port}/check"))
        assert (r.exit_code, r.stdout) == (0, "real\n"), r.stderr
        placeholder = sb.exec("printf %s $TOKEN").stdout
        assert placeholder.startswith("jailbox-secret-") and VALUE not in placeholder
        seen = sb.exec(
            "env; cat /proc/self/environ /proc/1/environ 2>/dev/null; ps -eo args; "
            "grep -rsa -- ghp_real /etc /root /tmp /run /var /home /testbed | head -3"
        )
        assert VALUE not in seen.stdout + seen.stderr and placeholder in seen.stdout
        log = sb.network_log()
        assert [(e.method, e.verdict) for e in log] == [("CONNECT", "allowed"), ("GET", "allowed")]
        assert "secrets TOKEN added" in log[1].reason
        shown = repr(config) + config.model_dump_json() + repr(log) + repr(sb.exec("true"))
    assert VALUE not in shown and "**********" in config.model_dump_json()
    assert tls.seen[0]["headers"]["Authorization"] == f"Bearer {VALUE}"


@pytest.mark.needs("openssl", "curl")
def test_other_hosts_plain_http_bodies_queries_and_redirects_get_only_the_placeholder(world) -> None:
    tls, plain, config = world
    with Sandbox(config) as sb:
        placeholder = sb.exec("printf %s $TOKEN").stdout
        sends = [
            curl(f"https://{OTHER}:{tls.port}/check"),  # another host
            curl(f"http://{BOUND}:{plain.port}/check"),  # the bound host over plain HTTP
            curl(f"https://{BOUND}:{tls.port}/check?token=$TOKEN -d token=$TOKEN"),  # a query and a body
            # a redirect from the bound host to another, the header sent on (as --location-trusted does)
            curl(f"--location-trusted https://{BOUND}:{tls.port}/away?to=https://{OTHER}:{tls.port}/check"),
        ]
        for command in sends:
            r = sb.exec(command)
            assert r.exit_code == 0, (command, r.stderr)
    by_host = [(s["headers"]["Host"].split(":")[0], s) for s in tls.seen + plain.seen]
    for host, seen in by_host:
        text = json.dumps(seen)
        if host == OTHER or seen in plain.seen:
            assert VALUE not in text and placeholder in text, seen
    query = next(s for h, s in by_host if s["path"].startswith("/check?token="))
    assert query["path"] == f"/check?token={placeholder}" and query["body"] == f"token={placeholder}"
    redirected = [s for h, s in by_host if h == OTHER and s["path"] == "/check"]
    assert len(redirected) == 2  # the direct request and the redirected one, both with the placeholder


# Through the proxy by hand: CONNECT, TLS with the name ``sni`` (the jail's bundles trust the
# sandbox's CA), then ``send``; prints what came back, or "refused" and why the handshake failed.
RAW = """
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n")
s.recv(4096)
try:
    t = ssl.create_default_context().wrap_socket(s, server_hostname="{sni}")
except ssl.SSLError as exc:
    print("refused", exc.reason)
    raise SystemExit
t.sendall({send!r})
print(t.recv(4096).decode(errors="replace"))
"""
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# bytes sent right behind the CONNECT, before its 200: what would be relayed unread in a plain tunnel
EARLY = """
import socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT {host}:{port} HTTP/1.1\\r\\n\\r\\nGET / HTTP/1.1\\r\\n\\r\\n")
print(s.recv(4096).decode(errors="replace"))
"""


@pytest.mark.needs("openssl", "curl")
def test_a_host_header_sni_http2_or_early_bytes_that_disagree_are_refused(world) -> None:
    tls, _, config = world
    url = f"https://{BOUND}:{tls.port}/check"
    with Sandbox(config) as sb:
        r = sb.exec(curl(f"-H 'Host: {OTHER}:{tls.port}' {url}"))
        assert "Host header names" in r.stdout, (r.stdout, r.stderr, sb.network_log())
        r = sb.exec(curl(f"--http2 {url}"))  # offered: the proxy speaks HTTP/1.1 only, and adds the value there
        assert r.stdout == "real\n", r.stderr
        r = sb.exec(["python3", "-c", RAW.format(host=BOUND, port=tls.port, sni=BOUND, send=H2_PREFACE)])
        assert r.stdout.startswith("HTTP/1.1 400") and "malformed request line" in r.stdout, (r.stdout, r.stderr)
        r = sb.exec(["python3", "-c", RAW.format(host=BOUND, port=tls.port, sni=OTHER, send=H2_PREFACE)])
        assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
        r = sb.exec(["python3", "-c", EARLY.format(host=BOUND, port=tls.port)])
        assert "send nothing after CONNECT" in r.stdout, (r.stdout, r.stderr)
    assert all(VALUE not in json.dumps(s) for s in tls.seen if s["headers"].get("Host", "").startswith(OTHER))
    assert sum(s["headers"].get("Authorization") == f"Bearer {VALUE}" for s in tls.seen) == 1  # --http2's only
    assert all(s["headers"].get("Host", "").startswith(BOUND) for s in tls.seen)


@pytest.mark.needs("openssl", "curl")
def test_a_bound_name_the_jail_points_elsewhere_or_its_address_alone_gets_no_value(world) -> None:
    """The proxy resolves a bound name itself (the policy's pins, else the host's DNS, checked against
    the rules): the jail's /etc/hosts pointing it at another address changes nothing, and a tunnel
    to the bound host's address, with the bound name as TLS server name and Host, is no bound host."""
    tls, _, config = world
    with Sandbox(config) as sb:
        assert sb.exec(f"echo '127.0.0.2 {BOUND}' >> /etc/hosts && grep -c 127.0.0.2 /etc/hosts").stdout == "1\n"
        r = sb.exec(curl(f"https://{BOUND}:{tls.port}/check"))
        assert r.stdout == "real\n", r.stderr  # the bound host, as the proxy resolves it
        send = f"GET /check HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer $TOKEN\r\n\r\n"
        code = RAW.format(host="127.0.0.1", port=tls.port, sni=BOUND, send=b"")
        code = code.replace("t.sendall(b'')", "import os; t.sendall(os.environ['SEND'].encode())")
        r = sb.exec(["sh", "-c", f'SEND="{send}" python3 -c "$0"', code])
        log = sb.network_log()
    assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
    assert log[-1].verdict != "allowed" and "127.0.0.1" in log[-1].host, log[-1]
    assert sum(VALUE in json.dumps(s) for s in tls.seen) == 1


# In the jail: requests one after another on one connection through the proxy (http.client keeps it
# while the answers allow), each with the placeholder; prints each status and body, as JSON.
KEPT = r"""
import http.client, json, os, ssl, sys
conn = http.client.HTTPSConnection("127.0.0.1", 3128, context=ssl.create_default_context())
conn.set_tunnel(sys.argv[1], int(sys.argv[2]))
out = []
for method, path in json.loads(sys.argv[3]):
    body = b"abc" if method == "POST" else None
    conn.request(method, path, body=body, headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
    r = conn.getresponse()
    out.append([method, path, r.status, r.read().decode()])
print(json.dumps(out))
"""
# In the jail: two requests in one write inside one tunnel, the second naming another host.
PIPELINED = r"""
import os, socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
s.recv(4096)
t = ssl.create_default_context().wrap_socket(s, server_hostname=host)
auth = "Authorization: Bearer " + os.environ["TOKEN"]
first = f"POST /check HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\nContent-Length: 3\r\n\r\nabc"
second = f"GET /check HTTP/1.1\r\nHost: {sys.argv[3]}:{port}\r\n{auth}\r\n\r\n"
t.sendall((first + second).encode())
got = b""
while chunk := t.recv(65536):
    got += chunk
print(got.decode(errors="replace"))
"""


@pytest.mark.needs("openssl")
def test_a_kept_connection_carries_request_after_request_each_checked_and_filled(world) -> None:
    """Inside TLS ended at the proxy, the jail's connection carries one request after another and
    the proxy keeps its own to the real server: each request gets its Host checked and the value put
    in, each answer (sized, chunked, to a HEAD) is relayed to its end; an answer that ends only with
    the connection ends the jail's too, and the next request opens another."""
    tls, _, config = world
    sequence = [["GET", "/check"], ["GET", "/chunked"], ["HEAD", "/check"], ["POST", "/check"], ["GET", "/unsized"],
                ["GET", "/check"]]  # fmt: skip
    with Sandbox(config) as sb:
        r = sb.exec(["python3", "-c", KEPT, BOUND, str(tls.port), json.dumps(sequence)])
        log = sb.network_log()
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == [[m, p, 200, "" if m == "HEAD" else "real\n"] for m, p in sequence]
    assert [s["headers"]["Authorization"] for s in tls.seen] == [f"Bearer {VALUE}"] * 6
    peers = [s["peer"] for s in tls.seen]
    assert len(set(peers[:5])) == 1 and peers[5] != peers[4], peers  # one upstream connection until /unsized
    assert [e.method for e in log] == ["CONNECT", "GET", "GET", "HEAD", "POST", "GET", "CONNECT", "GET"], log
    assert tls.seen[3]["body"] == "abc"


@pytest.mark.needs("openssl")
def test_a_pipelined_request_naming_another_host_is_refused_after_the_first_is_answered(world) -> None:
    tls, _, config = world
    with Sandbox(config) as sb:
        r = sb.exec(["python3", "-c", PIPELINED, BOUND, str(tls.port), OTHER])
        log = sb.network_log()
    assert r.stdout.startswith("HTTP/1.1 200") and "real\n" in r.stdout, r.stdout
    assert "HTTP/1.1 400" in r.stdout and f"names '{OTHER}:{tls.port}'" in r.stdout, r.stdout
    assert len(tls.seen) == 1 and tls.seen[0]["body"] == "abc"
    assert [(e.method, e.verdict) for e in log] == [("CONNECT", "allowed"), ("POST", "allowed"), ("-", "denied")]


@pytest.mark.needs("openssl", "curl", "slirp4netns", "tun")
def test_with_full_networking_https_goes_through_the_proxy_and_only_there_gets_the_value(world) -> None:
    tls, _, config = world
    full = config.model_copy(update={"network": NetworkPolicy(mode="full", hosts=config.network.hosts)})
    with Sandbox(SandboxConfig.model_validate(full.model_dump())) as sb:
        r = sb.exec(curl(f"https://{BOUND}:{tls.port}/check"))
        assert (r.exit_code, r.stdout) == (0, "real\n"), r.stderr
        # around the proxy: the name is the jail's loopback there, and the value was never in the jail
        r = sb.exec(curl(f"--noproxy '*' https://{BOUND}:{tls.port}/check"))
        assert r.exit_code != 0
        assert [e.method for e in sb.network_log()] == ["CONNECT", "GET"]
    assert sum(s["headers"].get("Authorization") == f"Bearer {VALUE}" for s in tls.seen) == 1


@pytest.mark.needs("openssl", "curl")
def test_a_bound_server_that_reflects_the_header_is_the_one_way_back(world) -> None:
    """What the design cannot stop, as its peers say too: a bound server that echoes the request
    hands the value to the jail. It is the bound service's own answer, and the only path."""
    tls, _, config = world
    with Sandbox(config) as sb:
        r = sb.exec(curl(f"https://{BOUND}:{tls.port}/echo"))
    assert json.loads(r.stdout)["Authorization"] == f"Bearer {VALUE}"


@pytest.mark.needs("openssl")
def test_the_sandbox_ca_vouches_for_the_bound_hosts_only_and_its_key_stays_out(world) -> None:
    from cryptography import x509

    _, _, config = world
    with Sandbox(config) as sb:
        bundle = sb.exec("cat /etc/ssl/certs/ca-certificates.crt").stdout
        keys = sb.exec("grep -rls 'PRIVATE KEY' /etc /root /tmp /usr/local 2>/dev/null | wc -l").stdout
        ca = sb._jail.vault.ca_pem
    assert ca in bundle and int(keys) == 0
    cert = x509.load_pem_x509_certificate(ca.encode())
    constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical and [n.value for n in constraints.value.permitted_subtrees] == [BOUND]


# Run in the jail as its root with every capability: reads the environment, arguments and every
# readable memory region of each process it can see but itself, and every file outside /proc, /sys,
# /dev and /usr (the host's, read-only, which jailbox never writes), for a needle given XOR-masked
# (so the needle is in no process but the scanner); prints which processes and files hold it, and
# how much it read.
SCAN = r"""
import json, os, sys
needle = bytes(b ^ 0x5A for b in bytes.fromhex(sys.argv[1]))
hits, regions, files = [], 0, 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    for part in ("environ", "cmdline"):
        try:
            if needle in open(f"/proc/{pid}/{part}", "rb").read():
                hits.append(f"{pid}/{part}")
        except OSError:
            pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    for line in maps:
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if "r" not in line.split()[1] or end - start > 1 << 28:
            continue
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        regions += 1
        if needle in data:
            hits.append(f"{pid}/mem {line}")
for top in os.listdir("/"):
    if top in ("proc", "sys", "dev", "usr") or os.path.islink("/" + top):  # /lib, /bin: into /usr
        continue
    for here, dirs, names in os.walk("/" + top):
        for name in names:
            path = os.path.join(here, name)
            try:
                if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 1 << 26:
                    files += 1
                    if needle in open(path, "rb").read():
                        hits.append(path)
            except OSError:
                pass
print(json.dumps({"hits": hits, "regions": regions, "files": files}))
"""


def masked(text: str) -> str:
    return bytes(b ^ 0x5A for b in text.encode()).hex()


@pytest.mark.needs("openssl", "curl")
def test_the_jail_finds_the_value_in_no_process_memory_or_file_it_can_reach(world) -> None:
    """After the proxy has used the value, the jail's root, with every capability, searches each
    process it can see (environment, arguments, memory) and every file it can reach: the proxy and
    its vault live in a host process outside the jail's pid namespace, and its certificates' keys
    never touch a file. The same scan finds a marker a jailed process holds and a file it wrote, so
    it does read."""
    tls, _, config = world
    with Sandbox(config.model_copy(update={"cap_add": ["ALL"]})) as sb:
        assert sb.exec(curl(f"https://{BOUND}:{tls.port}/check")).stdout == "real\n"
        marker = "held-by-a-jailed-process-" + os.urandom(8).hex()
        held = f"nohup python3 -c 'import time; kept = bytes.fromhex(\"{marker.encode().hex()}\"); time.sleep(600)' &"
        assert sb.exec(f"{held} >/dev/null 2>&1; printf %s {marker} > /root/held; sleep 0.5").exit_code == 0
        control = json.loads(sb.exec(["python3", "-c", SCAN, masked(marker)], timeout=300).stdout)
        found = json.loads(sb.exec(["python3", "-c", SCAN, masked(VALUE)], timeout=300).stdout)
    assert any("/mem " in hit for hit in control["hits"]) and "/root/held" in control["hits"], control
    assert found["hits"] == [] and found["regions"] > 20 and found["files"] == control["files"], found
    assert tls.seen[0]["headers"]["Authorization"] == f"Bearer {VALUE}"


def test_secrets_are_refused_where_they_cannot_be_kept_out_in_one_line(tmp_path: Path) -> None:
    secret = Secret(name="TOKEN", value="v", hosts=["api.example.com"])
    for fields, says in [
        ({"network": "none", "rootfs": str(tmp_path)}, "set network='allow:HOST,...' naming their hosts, or 'full'"),
        ({"network": "host", "rootfs": str(tmp_path)}, "with 'host' networking"),
        ({"network": "allow:api.example.com"}, "need a root filesystem"),
        ({"network": "allow:api.example.com", "rootfs": str(tmp_path), "env": {"TOKEN": "x"}}, "both a secret and"),
        ({"network": "allow:pypi", "rootfs": str(tmp_path)}, "bound to api.example.com, which the network rules"),
    ]:
        with pytest.raises(ValidationError, match=says):
            SandboxConfig(secrets=[secret], **fields)
    for bad, says in [
        ({"name": "1X", "value": "v", "hosts": ["h.test"]}, "not an environment variable name"),
        ({"name": "X", "value": "a\r\nInjected: 1", "hosts": ["h.test"]}, "without line breaks"),
        ({"name": "X", "value": "v", "hosts": []}, "1 to 16 host names"),
        ({"name": "X", "value": "v", "hosts": ["*.h.test"]}, "is not a host name"),
        ({"name": "X", "value": "v", "hosts": ["10.0.0.1"]}, "exact host names"),
    ]:
        with pytest.raises(ValidationError, match=says) as caught:
            Secret(**bad)
        assert "a\r\nInjected" not in str(caught.value)


@pytest.mark.needs("openssl")
def test_the_command_line_takes_a_secret_from_the_environment_or_a_file_never_its_arguments(tmp_path: Path) -> None:
    root = bundle_tree(tmp_path)
    usr = [f"--bind=/usr/{d}:/usr/{d}" for d in USR if Path(f"/usr/{d}").is_dir()]
    common = ["exec", "--rootfs", str(root), *usr, "--network", "allow:api.example.com"]
    env = {**os.environ, "JAILBOX_STATE_DIR": str(tmp_path / "state"), "TOKEN": VALUE}
    value_file = tmp_path / "token"
    value_file.write_text(VALUE + "\n")
    for flag in ("TOKEN@api.example.com", f"TOKEN@api.example.com:{value_file}"):
        run_env = env if ":" not in flag else {k: v for k, v in env.items() if k != "TOKEN"}
        r = subprocess.run(
            [*JAILBOX, *common, "--secret", flag, "--", "sh", "-c", "printf %s $TOKEN; env | grep -c ghp_"],
            capture_output=True, text=True, env=run_env, timeout=120,
        )  # fmt: skip
        assert r.stdout.startswith("jailbox-secret-") and r.stdout.endswith("0\n"), (flag, r.stdout, r.stderr)
        assert VALUE not in r.stdout + r.stderr
    for flag, says in [("TOKEN", "expected NAME@HOST"), ("NOPE@x.test", "$NOPE is not set here")]:
        r = subprocess.run([*JAILBOX, *common, "--secret", flag, "--", "true"], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and says in r.stderr and "--secret" in r.stderr, r.stderr


@pytest.mark.needs("openssl")
def test_a_created_sandbox_keeps_its_secret_in_the_service_not_in_its_listing(tmp_path: Path) -> None:
    root = bundle_tree(tmp_path)
    usr = [f"--bind=/usr/{d}:/usr/{d}" for d in USR if Path(f"/usr/{d}").is_dir()]
    with own_service() as env:
        env["TOKEN"] = VALUE
        made = jailbox(env, "create", "--rootfs", str(root), *usr, "--network", "allow:api.example.com",
                       "--secret", "TOKEN@api.example.com")  # fmt: skip
        assert made.returncode == 0, made.stderr
        shown = jailbox(env, "exec", "--id", made.stdout.strip(), "--", "sh", "-c", "printf %s $TOKEN")
        listed = jailbox(env, "ps", "--json")
    assert shown.stdout.startswith("jailbox-secret-") and VALUE not in shown.stdout + listed.stdout


def test_run_takes_the_secret_flag_and_refuses_a_bad_one_before_any_model_call(tmp_path: Path) -> None:
    from support.llm_server import ScriptedServer

    with ScriptedServer() as server:
        base = [*JAILBOX, "run", "--query", "q", "--llm-name", "m", "--llm-base-url", server.url]
        env = {**os.environ, "JAILBOX_STATE_DIR": str(tmp_path / "state")}
        for flag, says in [("NOPE@x.test", "$NOPE is not set here"), ("TOKEN", "expected NAME@HOST")]:
            r = subprocess.run([*base, "--secret", flag], capture_output=True, text=True, env=env, cwd=tmp_path)
            assert r.returncode == 2 and says in r.stderr and "--secret" in r.stderr, r.stderr
        r = subprocess.run(
            [*base, "--rootfs", "host", "--secret", "TOKEN@api.example.com"],
            capture_output=True, text=True, env={**env, "TOKEN": VALUE}, cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 2 and "secrets need a root filesystem" in r.stderr and VALUE not in r.stderr, r.stderr
        assert server.requests == []


@pytest.mark.slow
def test_serve_gives_every_sandbox_its_secrets_as_placeholders(tmp_path: Path, mini_rootfs: Path) -> None:
    """``jailbox serve --secret``: a sandbox made through the unmodified E2B SDK sees a placeholder of
    its own, and neither its commands, the API's answers nor the server's log show the value; a
    flag that cannot hold is refused at start in one line, and the host rootfs at create."""
    from support.serve import KEY_A, api, key_file, need_sdk, sdk, start_server

    need_sdk()
    cache = {"JAILBOX_CACHE_DIR": str(tmp_path / "cache")}
    tarball = tmp_path / "mini.tar"
    subprocess.run(["tar", "-C", str(mini_rootfs), "-cf", str(tarball), "."], check=True)
    made = subprocess.run([*JAILBOX, "rootfs", "import", str(tarball), "mini"], capture_output=True,
                          text=True, env={**os.environ, **cache}, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr
    flags = ["--api-key-file", str(key_file(tmp_path, KEY_A)), "-v", "--secret", f"TOKEN@{BOUND}"]
    refused = subprocess.run([*JAILBOX, "serve", "--port", "0", *flags], capture_output=True, text=True,
                             env={**os.environ, **cache, "TOKEN": VALUE}, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "--secret" in refused.stderr and "network='allow:" in refused.stderr
    assert VALUE not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    server = start_server(tmp_path, *flags, "--network", f"allow:{BOUND}", env={**cache, "TOKEN": VALUE})
    try:
        out = sdk(
            server,
            tmp_path,
            """
            import json
            from e2b import Sandbox
            seen = []
            for _ in range(2):
                sb = Sandbox.create(template="mini")
                r = sb.commands.run("printf '%s\\\\n' $TOKEN; env; cat /proc/self/environ")
                seen.append(r.stdout)
                sb.kill()
            print(json.dumps(seen))
            """,
        )
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
        listed = api(server, "GET", "/v2/sandboxes", KEY_A)
    finally:
        server.stop()
        gone = subprocess.run([*JAILBOX, "rootfs", "rm", "mini"], capture_output=True, text=True,
                              env={**os.environ, **cache}, timeout=120)  # fmt: skip
        assert gone.returncode == 0, gone.stderr  # its files belong to subordinate ids rootless: pytest cannot
    first, second = (text.split("\n", 1)[0] for text in json.loads(out))
    assert first.startswith("jailbox-secret-") and second.startswith("jailbox-secret-") and first != second
    assert status == 400 and "secrets need a root filesystem" in str(body), body
    assert VALUE not in out + str(body) + str(listed) + "".join(server.log)


# Each sends the placeholder to the bound host its own way, through the proxy its variables name and
# trusting the sandbox's CA where it finds CAs (the bundles jailbox extends). Node's own fetch is not
# among them: before Node 24 it ignores proxy variables, so in allow mode it reaches no host at all.
TOOLS = {
    "urllib": 'python3 -c \'import os, urllib.request as u; r = u.Request("{url}", headers={{"Authorization": '
    '"Bearer " + os.environ["TOKEN"]}}); print(u.urlopen(r).read().decode(), end="")\'',
    "requests": 'python3 -c \'import os, requests; print(requests.get("{url}", headers={{"Authorization": '
    '"Bearer " + os.environ["TOKEN"]}}).text, end="")\'',
    "httpx": 'python3 -c \'import os, httpx; print(httpx.get("{url}", headers={{"Authorization": '
    '"Bearer " + os.environ["TOKEN"]}}).text, end="")\'',
    "git": 'git -c http.extraHeader="Authorization: Bearer $TOKEN" ls-remote {url} 2>&1 | head -3',
    # credentials in the URL: the client sends them as Authorization: Basic, which the proxy opens
    "pip": "pip download --no-deps --no-cache-dir --index-url {userinfo}/pip/simple/ nothing-here -d /tmp/pip 2>&1"
    " | tail -2",
    "git-basic": "git ls-remote https://x-access-token:$TOKEN@{host}/auth/repo 2>&1 | head -3",
    "curl-basic": "curl -sS -u x-access-token:$TOKEN {base}/basic; curl -sS -u x-access-token:$TOKEN {other}/basic",
}


@pytest.mark.needs("openssl", "git")
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_jails_tools_trust_the_sandbox_ca_and_send_the_placeholder(world, tool: str) -> None:
    if tool in ("requests", "httpx"):
        found = subprocess.run(["/usr/bin/python3", "-c", f"import {tool}"], capture_output=True).returncode == 0
        require(found, f"Debian's python3-{tool}", f"sudo apt-get install python3-{tool}")
    tls, _, config = world
    base = f"https://{BOUND}:{tls.port}"
    with Sandbox(config.model_copy(update={"env": {"HOME": "/root"}})) as sb:
        userinfo = f"https://__token__:$TOKEN@{BOUND}:{tls.port}"
        other = f"https://{OTHER}:{tls.port}"
        r = sb.exec(
            TOOLS[tool].format(
                url=f"{base}/check", base=base, userinfo=userinfo, other=other, host=f"{BOUND}:{tls.port}"
            ),
            timeout=120,
        )
        placeholder = sb.exec("printf %s $TOKEN").stdout
    assert "certificate" not in (r.stdout + r.stderr).lower() and "SSL" not in r.stdout + r.stderr, r
    got = [s for s in tls.seen if s["headers"].get("Host", "").startswith(BOUND)]
    assert got, (r.stdout, r.stderr)
    if tool in ("urllib", "requests", "httpx"):
        assert r.stdout == "real\n" and got[0]["headers"]["Authorization"] == f"Bearer {VALUE}"
    if tool == "git":
        assert got[0]["path"].startswith("/check/info/refs") and got[0]["headers"]["Authorization"] == f"Bearer {VALUE}"
    if tool == "pip":
        assert got[0]["path"] == "/pip/simple/nothing-here/"
        assert basic(got[0]) == f"__token__:{VALUE}"
    if tool == "git-basic":  # asked for after a 401, as a private repository does
        assert "Authorization" not in got[0]["headers"] and basic(got[1]) == f"x-access-token:{VALUE}"
    if tool == "curl-basic":  # opened for the bound host only
        assert basic(got[0]) == f"x-access-token:{VALUE}"
        elsewhere = [seen for seen in tls.seen if seen["headers"].get("Host", "").startswith(OTHER)]
        assert [basic(seen) for seen in elsewhere] == [f"x-access-token:{placeholder}"]


def basic(seen: dict) -> str:
    scheme, pair = seen["headers"]["Authorization"].split(" ", 1)
    assert scheme == "Basic"
    return base64.b64decode(pair).decode()
