"""Network policies against stand-in "internet" servers on this host: allow (the filtering proxy),
none, full (slirp4netns) and published ports. Runs as root and rootless alike."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import ci_user, need, own_for_jails, require
from pydantic import ValidationError
from support.cli import JAILBOX
from support.descriptors import held_fds
from support.standin import CA_ENV, NAMES, StandIn, host_address, make_ca

from jailbox.sandbox import Mount, NetworkPolicy, Sandbox, SandboxConfig
from jailbox.sandbox.net import proxy as proxy_mod
from jailbox.sandbox.net.proxy import PROXY

ROOT = Path(__file__).resolve().parent.parent
LAN = host_address()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    need("openssl")
    directory = tmp_path_factory.mktemp("pki")
    directory.chmod(0o755)  # bound into jails, whose root as host root is a subordinate id (reads as others)
    return make_ca(directory, ["127.0.0.1"] + ([LAN] if LAN else []))


@pytest.fixture(scope="module")
def web(pki):
    """(HTTP stand-in, HTTPS stand-in) on the host's loopback."""
    _, cert, key = pki
    plain, tls = StandIn(), StandIn(cert=(cert, key))
    yield plain, tls
    plain.close()
    tls.close()


def allow_box(pki, all_caps: bool = False, **policy) -> Sandbox:
    ca = pki[0]
    fields = {"mode": "allow", "hosts": dict.fromkeys(NAMES, "127.0.0.1"), **policy}
    mounts = [Mount(ca.parent, "/etc/jailbox-test-ca")]
    return Sandbox(network=NetworkPolicy(**fields), mounts=mounts, env=CA_ENV, cap_add=["ALL"] if all_caps else [])


@pytest.mark.needs("curl", "git")
def test_allow_mode_reaches_allowed_names_by_curl_urllib_and_requests(pki, web):
    plain, tls = web
    with allow_box(pki, allow=("allowed.test:*", "*.allowed.test:*")) as sb:
        r = sb.exec(f"curl -sS http://allowed.test:{plain.port}/hello")
        assert (r.exit_code, r.stdout) == (0, f"hello from allowed.test:{plain.port}\n"), r.stderr
        r = sb.exec(f"curl -sS https://files.allowed.test:{tls.port}/hello")
        assert (r.exit_code, r.stdout) == (0, f"hello from files.allowed.test:{tls.port}\n"), r.stderr
        r = sb.exec(
            f"python3 -c \"import urllib.request; print(urllib.request.urlopen('https://allowed.test:{tls.port}/hello')"
            ".read().decode(), end='')\""
        )
        assert r.stdout == f"hello from allowed.test:{tls.port}\n", r.stderr
        requests = "requests" if sb.exec("python3 -c 'import requests'").exit_code == 0 else "pip._vendor.requests"
        r = sb.exec(
            f"python3 -c \"import {requests} as rq; r = rq.get('https://allowed.test:{tls.port}/hello'); "
            "print(r.status_code, r.text, end='')\""
        )
        assert r.stdout == f"200 hello from allowed.test:{tls.port}\n", r.stderr
        git = sb.exec("git config --get http.proxy")
        assert git.stdout.strip() == "http://127.0.0.1:3128"


@pytest.mark.needs("git")
def test_git_clones_through_its_own_proxy_setting(pki, tmp_path):
    repo = tmp_path / "demo.git"
    work = tmp_path / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "first"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "update-server-info"], check=True)
    server = StandIn(cert=(pki[1], pki[2]), static=tmp_path)
    try:
        with allow_box(pki, allow=("allowed.test:*",)) as sb:
            names = ("http_proxy", "https_proxy", "all_proxy")
            unset = " ".join(f"-u {v} -u {v.upper()}" for v in names)  # only git's http.proxy is left
            url = f"https://allowed.test:{server.port}/static/demo.git"
            r = sb.exec(f"env {unset} GIT_SSL_CAINFO=$SSL_CERT_FILE git clone -q {url} demo && cat demo/README")
            assert r.stdout == "cloned through the proxy\n", r.stderr
            assert {(e.method, e.host, e.verdict) for e in sb.network_log()} == {("CONNECT", "allowed.test", "allowed")}
    finally:
        server.close()


@pytest.mark.needs("curl")
def test_denied_and_unlisted_names_get_a_403_naming_the_rule(pki, web):
    plain, tls = web
    before = len(plain.hits) + len(tls.hits)
    with allow_box(pki, allow=("*.allowed.test:*",), deny=("blocked.allowed.test",)) as sb:
        r = sb.exec(f"curl -sS -w '%{{http_code}}' http://blocked.allowed.test:{plain.port}/hello")
        assert r.stdout.endswith("403") and "denied by rule 'blocked.allowed.test'" in r.stdout
        r = sb.exec(f"curl -sS -w '%{{http_code}}' http://other.test:{plain.port}/hello")
        assert r.stdout.endswith("403") and "other.test is not in the allow list (*.allowed.test:*)" in r.stdout
        r = sb.exec(f"curl -sS https://other.test:{tls.port}/hello")
        assert r.exit_code == 56 and "403" in r.stderr
        r = sb.exec(
            f"curl -sS -w '%{{http_code}}' http://127.0.0.1:{plain.port}/hello -x http://127.0.0.1:3128 --noproxy ''"
        )
        assert r.stdout.endswith("403") and "127.0.0.1 is not in the allow list" in r.stdout
        r = sb.exec(
            f"python3 -c \"import urllib.request as u\ntry: u.urlopen('http://other.test:{plain.port}/')\n"
            'except Exception as e: print(e.code, e.read().decode())"'
        )
        assert r.stdout.startswith("403 jailbox proxy: GET other.test")
    assert len(plain.hits) + len(tls.hits) == before  # nothing refused reached a server


@pytest.mark.needs("curl")
def test_network_log_shows_each_allowed_and_refused_request(pki, web):
    plain, tls = web
    with allow_box(pki, allow=("allowed.test:*",)) as sb:
        sb.exec(f"curl -sS http://allowed.test:{plain.port}/hello; curl -sS https://allowed.test:{tls.port}/hello")
        sb.exec(f"curl -sS http://other.test:{plain.port}/x; curl -sS https://other.test:{tls.port}/x")
        log = sb.network_log()
    assert [(e.method, e.host, e.port, e.verdict) for e in log] == [
        ("GET", "allowed.test", plain.port, "allowed"),
        ("CONNECT", "allowed.test", tls.port, "allowed"),
        ("GET", "other.test", plain.port, "denied"),
        ("CONNECT", "other.test", tls.port, "denied"),
    ]
    assert log[0].reason == "allowed by rule 'allowed.test:*'" and "not in the allow list" in log[2].reason
    assert log[0].bytes_received > len("hello from allowed.test") and log[0].bytes_sent > 0
    assert log[1].bytes_received > 500  # the TLS handshake and the response, tunnelled
    assert log[2].bytes_sent == log[2].bytes_received == 0
    assert [e.time for e in log] == sorted(e.time for e in log) and log[0].time <= time.time()


def test_pip_installs_a_wheel_from_a_local_index_with_default_seccomp_and_limits(pki, web):
    _, tls = web
    with allow_box(pki, allow=("pypi.test:*",)) as sb:
        assert sb.config.seccomp is not None and sb.config.limits.pids is not None
        r = sb.exec(
            "python3 -m pip install --no-cache-dir --disable-pip-version-check --target /testbed/lib "
            f"--index-url https://pypi.test:{tls.port}/simple/ jbdemo",
            timeout=120,
        )
        assert r.exit_code == 0, r.stdout + r.stderr
        assert "Successfully installed jbdemo-1.0" in r.stdout
        r = sb.exec("PYTHONPATH=/testbed/lib python3 -c 'import jbdemo; print(jbdemo.VALUE)'")
        assert r.stdout == "42\n"
        assert {(e.host, e.verdict) for e in sb.network_log()} == {("pypi.test", "allowed")}
        assert not r.refused_syscalls


def test_programs_ignoring_the_proxy_have_no_route_out(pki, web, loopback_server):
    plain, _ = web
    probe = f"""
import errno, socket
def attempt(make, addr):
    try:
        s = make()
        s.settimeout(3)
        s.connect(addr) if s.type == socket.SOCK_STREAM else s.sendto(bytes([8]) + bytes(15), addr)
        return 'connected'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
tcp = lambda: socket.socket()
raw = lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
packet = lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
print(attempt(tcp, ('127.0.0.1', {plain.port})), attempt(tcp, ('{LAN or "192.0.2.1"}', {plain.port})),
      attempt(tcp, ('1.1.1.1', 443)), attempt(raw, ('1.1.1.1', 0)), attempt(packet, ('lo', 0)))
try:
    socket.getaddrinfo('allowed.test', 80)
    print('resolved')
except OSError:
    print('no-dns')
"""
    for all_caps in (False, True):
        with allow_box(pki, allow=("*:*",), all_caps=all_caps) as sb:
            assert sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split() == ["lo"]
            r = sb.exec(["python3", "-c", probe])
            lines = r.stdout.split("\n")
            tcp_lo, tcp_lan, tcp_net, raw, packet = lines[0].split()
            assert tcp_lo == "ECONNREFUSED" and tcp_lan == tcp_net == "ENETUNREACH", r.stdout
            if all_caps:  # the jail's own namespace: raw sockets open but lead nowhere
                assert raw == "ENETUNREACH" and packet in ("connected", "EPERM")
            else:
                assert raw == packet == "EPERM"
            assert lines[1] == "no-dns"
    assert loopback_server.accepted == 0


@pytest.mark.needs("curl")
def test_none_reaches_nothing_and_has_no_proxy(pki, web):
    plain, _ = web
    with Sandbox() as sb:
        env = sb.exec("env").stdout
        assert "proxy" not in env.lower()
        r = sb.exec(f"curl -sS -m 5 http://127.0.0.1:3128/ ; curl -sS -m 5 http://{LAN or '192.0.2.1'}:{plain.port}/")
        assert r.exit_code != 0 and "Couldn't connect" in r.stderr
        assert sb.network_log() == []


@pytest.mark.needs("curl")
@pytest.mark.slow
def test_one_proxy_serves_64_sandboxes_at_once_within_its_bounds(web):
    plain, _ = web
    size = 1 << 20
    errors: list[str] = []
    boxes: list[Sandbox] = []
    lock = threading.Lock()

    def make(_: int) -> None:
        sb = Sandbox(network={"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}})
        with lock:
            boxes.append(sb)

    threads = [threading.Thread(target=make, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(boxes) == 64
        assert PROXY.stats().sandboxes >= 64 and PROXY.running

        def fetch(sb: Sandbox) -> None:
            r = sb.exec(f"curl -sS http://allowed.test:{plain.port}/big?n={size} | wc -c", timeout=120)
            if r.stdout.strip() != str(size):
                errors.append(f"{r.exit_code} {r.stdout!r} {r.stderr!r}")

        runners = [threading.Thread(target=fetch, args=(sb,)) for sb in boxes]
        for t in runners:
            t.start()
        for t in runners:
            t.join()
        assert errors == []
        for sb in boxes:
            log = sb.network_log()
            assert [(e.verdict, e.bytes_received > size) for e in log] == [("allowed", True)]
        stats = PROXY.stats()
        assert stats.refused_over_limit == 0
        assert stats.peak_connections <= proxy_mod.MAX_CONNECTIONS
        assert stats.peak_write_buffer <= proxy_mod.HIGH_WATER + proxy_mod.CHUNK
        assert stats.memory_bound <= 96 << 20
    finally:
        for sb in boxes:
            sb.close()
    stats = PROXY.stats()
    assert stats.sandboxes == 0 and stats.connections == 0 and not PROXY.running


def test_a_jail_that_stops_reading_cannot_grow_the_proxy(web):
    """64 MiB offered, the jail reads nothing: the proxy's buffers stay at their cap and the server
    stalls once the kernel's socket buffers are full."""
    plain, _ = web
    body = 64 << 20
    with Sandbox(network={"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}}) as sb:
        start = plain.sent
        head = f"GET http://allowed.test:{plain.port}/big?n={body} HTTP/1.1\\r\\nHost: allowed.test:{plain.port}"
        sb.exec(
            "python3 -c \"import socket, time; s = socket.create_connection(('127.0.0.1', 3128)); "
            f"s.sendall(b'{head}\\r\\n\\r\\n'); "
            'time.sleep(3600)" &'
        )
        previous = -1
        for _ in range(400):  # wait until the server stops making progress
            time.sleep(0.05)
            if plain.sent - start == previous and previous > 0:
                break
            previous = plain.sent - start
        stalled = plain.sent - start
        assert 0 < stalled < body // 2
        assert PROXY.stats().peak_write_buffer <= proxy_mod.HIGH_WATER + proxy_mod.CHUNK
        assert PROXY.stats().connections == 1


def test_proxy_limits_connections_per_sandbox():
    with Sandbox(network={"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}}) as sb:
        many = proxy_mod.MAX_PER_SANDBOX + 8
        r = sb.exec(
            f"""python3 -c "
import select, socket
conns = [socket.create_connection(('127.0.0.1', 3128)) for _ in range({many})]
answered = set()
for _ in range(100):
    ready, _, _ = select.select([c for c in conns if c not in answered], [], [], 0.1)
    answered.update(ready)
    if len(answered) >= 8 and not ready:
        break
print(len(conns) - len(answered), sum(c.recv(100).startswith(b'HTTP/1.1 503') for c in answered))
" """
        )
        assert r.stdout.split() == [str(proxy_mod.MAX_PER_SANDBOX), "8"], r.stderr
        assert sum(e.reason == "too many connections" for e in sb.network_log()) == 8


def test_malformed_and_oversized_requests_are_refused(web):
    with Sandbox(network="allow:allowed.test:*") as sb:
        r = sb.exec(
            """python3 -c "
import socket
for req in (b'GET /relative HTTP/1.1\\r\\n\\r\\n', b'garbage\\r\\n\\r\\n',
            b'GET http://a.test/ HTTP/1.1\\r\\nX: ' + b'y' * 20000,
            b'GET https://allowed.test/ HTTP/1.1\\r\\n\\r\\n', b'CONNECT allowed.test HTTP/1.1\\r\\n\\r\\n'):
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(req)
    print(s.recv(4096).split(b'\\r\\n')[0].decode())
" """
        )
        assert r.stdout.splitlines() == [
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 431 Request Header Fields Too Large",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
        ], r.stderr
        assert all(e.verdict == "denied" for e in sb.network_log())


@pytest.mark.needs("curl")
def test_names_resolving_to_local_addresses_need_an_ip_rule(web):
    """The resolver cannot point an allowed name at the host: a name that resolves to loopback is
    refused unless an IP rule (or the hosts mapping) allows that address."""
    plain, _ = web
    with Sandbox(network="allow:*:*") as sb:
        r = sb.exec(f"curl -sS -x http://127.0.0.1:3128 --noproxy '' http://localhost:{plain.port}/hello")
        assert "resolves to 127.0.0.1, a loopback, private or host address" in r.stdout
    with Sandbox(network="allow:*:*,127.0.0.0/8") as sb:
        r = sb.exec(f"curl -sS -x http://127.0.0.1:3128 --noproxy '' http://localhost:{plain.port}/hello")
        assert r.stdout == f"hello from localhost:{plain.port}\n"
    with Sandbox(network="allow:127.0.0.1:*") as sb:
        r = sb.exec(f"curl -sS http://127.0.0.1:{plain.port}/hello --proxy http://127.0.0.1:3128 --noproxy ''")
        assert r.stdout == f"hello from 127.0.0.1:{plain.port}\n"


@pytest.mark.needs("curl")
def test_proxy_thread_and_descriptors_go_with_the_last_sandbox(web):
    plain, _ = web
    policy = {"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}}
    Sandbox(network=policy).close()  # the launcher's own descriptors stay; count from here
    fds = held_fds()
    for _ in range(3):
        with Sandbox(network=policy) as sb:
            assert PROXY.running
            assert sb.exec(f"curl -sS http://allowed.test:{plain.port}/hello").stdout.startswith("hello")
        assert not PROXY.running
        assert not any(t.name.startswith("jailbox-proxy") for t in threading.enumerate())
    assert held_fds() == fds


@pytest.mark.needs("curl")
def test_reset_keeps_the_policy_and_starts_a_fresh_log(web):
    plain, _ = web
    policy = {"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}}
    with Sandbox(network=policy) as sb:
        sb.exec(f"curl -sS http://allowed.test:{plain.port}/hello")
        sb.reset()
        assert sb.network_log() == []
        assert sb.exec(f"curl -sS http://allowed.test:{plain.port}/hello").stdout.startswith("hello")
        assert len(sb.network_log()) == 1


@pytest.mark.needs("curl")
def test_pooled_and_async_sandboxes_use_the_proxy(web):
    import asyncio

    from jailbox.sandbox import AsyncSandbox, SandboxPool

    plain, _ = web
    policy = {"mode": "allow", "allow": ["allowed.test:*"], "hosts": {"allowed.test": "127.0.0.1"}}
    url = f"http://allowed.test:{plain.port}/hello"
    with SandboxPool(size=2, network=policy) as pool:
        sb = pool.acquire()
        assert sb.exec(f"curl -sS {url}").stdout.startswith("hello")
        sb.reset()
        assert sb.exec(f"curl -sS {url}").stdout.startswith("hello") and len(sb.network_log()) == 1
        sb.close()

    async def main() -> list:
        async with AsyncSandbox(network=policy) as asb:
            r = await asb.exec(f"curl -sS {url}")
            assert r.stdout.startswith("hello")
            return asb.network_log()

    assert [e.verdict for e in asyncio.run(main())] == ["allowed"]


@pytest.mark.needs("curl")
def test_set_network_changes_an_allow_sandboxs_rules_while_it_runs(web):
    """Allowed, denied by ``set_network``, allowed again: each request follows the rules of the
    moment; a tunnel opened before a change keeps going; the rules outlive reset, rollback and
    fork, and a pool's sandbox keeps its own through reset."""
    from jailbox.sandbox import SandboxPool

    plain, _ = web
    hosts = {"a.test": "127.0.0.1", "b.test": "127.0.0.1"}
    both = NetworkPolicy(mode="allow", allow=("a.test:*", "b.test:*"), hosts=hosts)
    only_b = NetworkPolicy(mode="allow", allow=("*:*",), deny=("a.test",), hosts=hosts)  # deny wins over '*'
    fetch = f"for h in a.test b.test; do curl -sS http://$h:{plain.port}/hello; echo; done"

    def reach(sb: Sandbox) -> str:
        out = sb.exec(fetch).stdout
        return "".join(h for h in "ab" if f"hello from {h}.test:" in out)

    tunnel = (
        "import socket, os, time\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT a.test:{plain.port} HTTP/1.1\\r\\n\\r\\n')\n"
        "assert s.recv(4096).startswith(b'HTTP/1.1 200')\n"
        "open('/tmp/open', 'w').close()\n"
        "while not os.path.exists('/tmp/go'): time.sleep(0.02)\n"
        "s.sendall(b'GET /hello HTTP/1.1\\r\\nHost: a.test\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "print(s.makefile('rb').read().decode().splitlines()[-1])\n"
    )
    with Sandbox(network=both) as sb:
        assert reach(sb) == "ab"
        sb.write_file("/tmp/tunnel.py", tunnel)
        held = concurrent.futures.ThreadPoolExecutor(1).submit(sb.exec, ["python3", "/tmp/tunnel.py"])
        while sb.exec("test -e /tmp/open").exit_code and not held.done():
            time.sleep(0.02)
        sb.set_network(only_b)
        assert reach(sb) == "b" and sb.config.network == only_b
        assert "denied by rule 'a.test'" in sb.network_log()[-2].reason
        sb.write_file("/tmp/go", "")
        assert held.result(60).stdout.startswith("hello from a.test"), "the tunnel opened before the change was cut"
        sb.set_network("allow:a.test:*")  # the string form; a.test no longer pinned: the host's resolver
        assert "cannot resolve a.test" in sb.exec(fetch).stdout
        sb.set_network(both)
        assert reach(sb) == "ab"
        cp = sb.checkpoint()
        sb.set_network(only_b)
        sb.rollback(cp)
        assert reach(sb) == "b"
        sb.reset()
        assert reach(sb) == "b"
        child = sb.fork(1)[0]
        try:
            assert reach(child) == "b"
        finally:
            child.close()
    with SandboxPool(size=1, network=both) as pool:
        sb = pool.acquire()
        sb.set_network(only_b)
        sb.reset()  # a jail the pool made with its own rules, given this sandbox's
        assert reach(sb) == "b"
        sb.close()
        assert reach(pool.acquire()) == "ab"  # the pool's own rules are untouched

    import asyncio

    from jailbox.sandbox import AsyncSandbox

    async def from_async() -> str:
        async with AsyncSandbox(network=both) as asb:
            await asb.set_network(only_b)
            return (await asb.exec(fetch)).stdout

    assert "denied by rule 'a.test'" in asyncio.run(from_async())


def test_set_network_keeps_the_mode_and_bounds_the_rules():
    from jailbox.sandbox.errors import ConfigError

    with Sandbox() as sb:
        with pytest.raises(ConfigError, match="made with network 'none', which cannot become 'allow'"):
            sb.set_network("allow:pypi")
        sb.set_network("none")  # the same policy: nothing to do
    with Sandbox(network="allow:pypi") as sb:
        for bad, says in [
            ("none", "cannot become 'none'"),
            ("full", "cannot become 'full'"),
            ("allow:" + ",".join(f"h{i}.example.com" for i in range(257)), "at most 256 rules"),
            ("allow:" + "a" * 600 + ".com", "at most 512 characters"),
            ("allow:bad_host!.com", "not a preset, host name"),
            (NetworkPolicy.model_construct(mode="allow", allow=(7,)), "(e.g. 'allow:pypi,github')"),
            (["pypi"], "takes a NetworkPolicy or a string"),
        ]:
            with pytest.raises(ConfigError, match=re.escape(says)) as refused:
                sb.set_network(bad)  # type: ignore[arg-type]
            assert "\n" not in str(refused.value), str(refused.value)
        assert sb.config.network.allow == ("pypi",)  # a refused change changes nothing
    for bad in ([f"h{i}.example.com" for i in range(257)], ["x" * 513], [7]):
        with pytest.raises(ValidationError):
            NetworkPolicy(mode="allow", allow=bad)
        with pytest.raises(ValidationError):
            NetworkPolicy(mode="allow", deny=bad)


# --- full: slirp4netns ------------------------------------------------------------------------


def _slirps() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "slirp4netns"]


needs_full = pytest.mark.needs("slirp4netns", "tun")
needs_lan = pytest.mark.needs("lan")
NO_TUN_CHECK = """
import json, psutil
from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import SandboxSetupError
try:
    Sandbox(network="full").close()
    said = "opened"
except SandboxSetupError as exc:
    said = str(exc)
print(json.dumps([said, [p.name() for p in psutil.Process().children(recursive=True)]]))
"""


@pytest.mark.root
@pytest.mark.needs("slirp4netns", "test-user")
def test_full_without_tun_access_names_the_fix(tmp_path: Path) -> None:
    """As a user who cannot open /dev/net/tun: CI opens it to all, so this user's view of it is a
    root-owned 0600 file bound over it, in a mount namespace of this test's own."""
    user = ci_user()
    assert user is not None
    closed = tmp_path / "closed-tun"
    closed.touch(mode=0o600)
    home = Path(tempfile.mkdtemp(prefix="jailbox-no-tun-"))
    os.chown(home, user.pw_uid, user.pw_gid)
    bind = f"mount --bind {closed} /dev/net/tun && " if os.path.exists("/dev/net/tun") else ""
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "env", "-i",
               f"HOME={home}", f"JAILBOX_STATE_DIR={home}/state", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
               sys.executable, "-c", NO_TUN_CHECK]  # fmt: skip
    try:
        runs = subprocess.run([*as_user[:-2], "-c", "import jailbox.sandbox"], capture_output=True, timeout=60)
        require(
            runs.returncode == 0,
            f"{user.pw_name} able to run {sys.executable} with jailbox ({runs.stderr.decode()[-200:]})",
            "make the checkout and its venv readable to that user (chmod o+rx along their path)",
        )
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{bind}exec "$@"', "sh",
                            *as_user], capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        shutil.rmtree(home)
    assert r.returncode == 0, r.stderr
    said, children = json.loads(r.stdout)
    assert "sudo chmod 0666 /dev/net/tun" in said and ("this host has mode 0600" in said or not bind), said
    assert children == []  # refused before slirp4netns was started
    if bind:  # the bound file stayed in the test's namespace
        assert stat.S_ISCHR(os.stat("/dev/net/tun").st_mode)


@needs_full
@needs_lan
@pytest.mark.needs("curl")
def test_full_reaches_the_internet_but_not_the_hosts_loopback_or_lan(loopback_server):
    outside = StandIn(LAN)
    try:
        with Sandbox(network="full") as sb:
            assert sb.read_file("/etc/resolv.conf") == b"nameserver 10.0.2.3\n"
            r = sb.exec(f"curl -sS -m 5 http://{LAN}:{outside.port}/hello")
            assert r.exit_code == 7 and outside.hits == []  # the host's LAN, not listed in lan
            for target in (f"10.0.2.2:{loopback_server.port}", f"127.0.0.1:{loopback_server.port}"):
                r = sb.exec(f"curl -sS -m 5 http://{target}/")
                assert r.exit_code == 7, target
        with Sandbox(network={"mode": "full", "lan": [LAN], "hosts": {"standin.test": LAN}}) as sb:
            r = sb.exec(
                f"curl -sS -m 5 http://{LAN}:{outside.port}/hello; curl -sS http://standin.test:{outside.port}/hello"
            )
            assert r.stdout == f"hello from {LAN}:{outside.port}\nhello from standin.test:{outside.port}\n", r.stderr
            assert sb.exec(f"curl -sS -m 5 http://10.0.2.2:{loopback_server.port}/").exit_code == 7
            assert sb.network_log() == []
        assert loopback_server.accepted == 0
    finally:
        outside.close()


@needs_full
@pytest.mark.network
def test_full_resolves_names_through_slirps_dns():
    try:
        expected = socket.getaddrinfo("deb.debian.org", 80, type=socket.SOCK_STREAM)
    except OSError:
        expected = []
    require(bool(expected), "a host that resolves deb.debian.org", "network access with a working DNS resolver")
    with Sandbox(network="full") as sb:
        r = sb.exec("getent ahostsv4 deb.debian.org | head -1")
        assert r.exit_code == 0 and r.stdout.split()[0] in {e[4][0] for e in expected}, r.stderr


@needs_full
def test_published_port_is_reachable_from_the_host():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Sandbox(network={"mode": "full", "publish": [f"{port}:8000"]}) as sb:
        sb.exec("cd /tmp && echo published > index.txt && python3 -m http.server 8000 >/dev/null 2>&1 &")
        body = b""
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                    c.sendall(b"GET /index.txt HTTP/1.0\r\n\r\n")
                    body = b"".join(iter(lambda: c.recv(4096), b""))
                if body:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        assert body.endswith(b"\r\n\r\npublished\n")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@needs_full
def test_slirp_goes_with_close_and_with_the_host_process():
    Sandbox(network="full").close()
    fds = held_fds()
    with Sandbox(network="full") as sb:
        assert len(_slirps()) == 1
        assert sb.exec("cat /sys/class/net/tap0/operstate").stdout.strip() in ("up", "unknown")
    assert _slirps() == []
    assert held_fds() == fds
    script = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]); from jailbox.sandbox import Sandbox; "
        "sb = Sandbox(network='full'); sb2 = Sandbox(network='allow:pypi'); print('up', flush=True); time.sleep(600)"
    )
    host = subprocess.Popen([sys.executable, "-c", script, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline() == "up\n"
        ours = [p for p in psutil.Process(host.pid).children(recursive=True) if p.name() == "slirp4netns"]
        assert len(ours) == 1
        host.kill()
        host.wait()
        _, alive = psutil.wait_procs(ours, timeout=10)
        assert alive == []
    finally:
        host.kill()
        host.wait()


# --- configuration and the command line -------------------------------------------------------


def test_policy_strings_presets_and_validation():
    p = SandboxConfig(network="allow:pypi,github,*.example.com,10.0.0.0/8,!gist.github.com").network
    assert p.mode == "allow" and p.allow == ("pypi", "github", "*.example.com", "10.0.0.0/8")
    assert p.deny == ("gist.github.com",)
    assert SandboxConfig(network="none").network.mode == "none"
    assert SandboxConfig(network="full").network.mode == "full"
    for bad, message in [
        ("allow:pipy", "neither a preset"),
        ("allow:ex*mple.com", "only allowed as a leading"),
        ("allow:bad_host!.com", "not a preset, host name"),
        ("full:pypi", "only 'allow:' takes rules"),
        ({"mode": "none", "publish": ["8080:80"]}, "need mode 'full'"),
        ({"mode": "full", "allow": ["pypi"]}, "need mode 'allow'"),
        ({"mode": "full", "publish": ["80"]}, "HOST_PORT:JAIL_PORT"),
        ({"mode": "full", "publish": ["8080:80", "8080:81"]}, "published twice"),
        ({"mode": "full", "lan": ["not-an-ip"]}, "network.lan"),
    ]:
        with pytest.raises(ValidationError, match=message):
            SandboxConfig(network=bad)
    from jailbox.sandbox.net.policy import Rules

    rules = Rules(("pypi", "*.example.com", "10.0.0.0/8"), ("bad.example.com",))
    assert rules.check_name("files.pythonhosted.org", 443) == (True, "allowed by rule 'pypi (files.pythonhosted.org)'")
    assert rules.check_name("a.b.example.com", 80)[0] and not rules.check_name("example.com", 443)[0]
    assert rules.check_name("bad.example.com", 443) == (False, "denied by rule 'bad.example.com'")
    import ipaddress

    assert rules.check_address(ipaddress.ip_address("10.1.2.3"), 443)[0]
    assert not rules.check_address(ipaddress.ip_address("8.8.8.8"), 443)[0]
    assert not rules.check_resolved(ipaddress.ip_address("127.0.0.1"), pinned=False)[0]
    assert rules.check_resolved(ipaddress.ip_address("127.0.0.1"), pinned=True)[0]


def _jailbox(*args: str) -> subprocess.CompletedProcess:
    cmd = [*JAILBOX, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.needs("curl")
def test_cli_network_and_publish_flags(web):
    plain, _ = web
    r = _jailbox("exec", "--network", "allow:pypi", "--", "curl", "-sS", f"http://other.test:{plain.port}/")
    assert "other.test is not in the allow list (pypi)" in r.stdout
    r = _jailbox("exec", "--network", "allow:pipy", "--", "true")
    assert r.returncode == 2 and "neither a preset" in r.stderr
    r = _jailbox("exec", "--publish", "8080:80", "--", "true")
    assert r.returncode == 2 and "need mode 'full'" in r.stderr
    assert "allow:RULES" in _jailbox("exec", "--help").stdout


def test_host_mode_uses_the_hosts_resolvers_not_the_rootfs_copy(mini_rootfs, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(mini_rootfs, root, symlinks=True)
    (root / "etc" / "resolv.conf").write_text("nameserver 192.0.2.1\n")  # what a build machine left behind
    with open("/etc/resolv.conf", "rb") as f:
        host = f.read()
    if os.getuid() == 0:
        own_for_jails(root)  # copytree made it host root's
    with Sandbox(rootfs=str(root), network="host") as sb:
        assert sb.read_file("/etc/resolv.conf") == host
    with Sandbox(rootfs=str(root)) as sb:
        assert sb.read_file("/etc/resolv.conf") == b"nameserver 192.0.2.1\n"
