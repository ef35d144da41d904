"""A hostile registry, and what is left of hostile images: a real HTTP server on 127.0.0.1 that is not a
registry serves crafted manifests, configs, blobs, redirects and token challenges to a real ``pull``
(and ``jailbox rootfs pull``); docker-save archives built to fill the disk go through ``rootfs import``;
the unpack worker is killed with its caller. Each refusal is one line naming what was refused, and
what it cost (bytes sent, written, memory) is measured and bounded."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.oci_images import E, raw_header, tar_bytes

from jailbox.sandbox.errors import DigestMismatch, RegistryError, RootfsError
from jailbox.sandbox.limits import IMAGE_BLOB_MAX, IMAGE_JSON_MAX, IMAGE_LAYERS_MAX
from jailbox.sandbox.rootfs.pull import pull
from jailbox.sandbox.rootfs.reference import Reference
from jailbox.sandbox.rootfs.registry import Registry
from jailbox.sandbox.rootfs.store import Store

ROOT = Path(__file__).resolve().parent.parent
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
TIB = 1 << 40
CONFIG = b'{"config": {}}'
Route = Callable[[http.server.BaseHTTPRequestHandler], None]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def reply(
    h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


class Hostile:
    """Answers each path with the route a test gives it; counts what it was asked and what it sent."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.paths: list[str] = []
        self.sent = 0
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                route = outer.routes.get(self.path.split("?", 1)[0])
                try:
                    if route is None:
                        reply(self, 404, b"{}")
                    else:
                        route(self)
                except OSError:
                    self.close_connection = True  # the client hung up: what a refusal does

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ref(self, tag: str = "t") -> str:
        return f"127.0.0.1:{self.port}/evil/img:{tag}"

    @staticmethod
    def path(kind: str, name: str) -> str:
        return f"/v2/evil/img/{kind}/{name}"

    def blob(self, data: bytes) -> str:
        digest = sha(data)
        self.routes[self.path("blobs", digest)] = lambda h: reply(h, 200, data)
        return digest

    def manifest(self, doc: dict | bytes, tag: str = "t", headers: dict[str, str] | None = None) -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        media = {"Content-Type": OCI_MANIFEST, **(headers or {})}
        self.routes[self.path("manifests", tag)] = lambda h: reply(h, 200, body, media)

    def image(self, layers: list[dict], config: bytes = CONFIG, tag: str = "t") -> None:
        """A manifest of these layer descriptors and ``config`` (served)."""
        cfg = {"mediaType": OCI_CONFIG, "digest": self.blob(config), "size": len(config)}
        self.manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg, "layers": layers}, tag)

    def stream(self, h: http.server.BaseHTTPRequestHandler, limit: int, length: int | None = None) -> None:
        """Zeros up to ``limit`` bytes, announced as ``length`` (none: the body ends when the line does)."""
        h.send_response(200)
        if length is None:
            h.send_header("Connection", "close")
        else:
            h.send_header("Content-Length", str(length))
        h.end_headers()
        h.close_connection = True
        chunk = bytes(1 << 16)
        while self.sent < limit:
            h.wfile.write(chunk)
            self.sent += len(chunk)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class Victim:
    """Another service on this machine's loopback: counts every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    yield h
    h.close()


@pytest.fixture
def victim() -> Iterator[Victim]:
    v = Victim()
    yield v
    v.close()


def layer_gz(entries: list[E]) -> bytes:
    return gzip.compress(tar_bytes(entries), mtime=0)


def desc(data: bytes, size: int | None = None, digest: str | None = None) -> dict:
    return {"mediaType": LAYER_GZ, "digest": digest or sha(data), "size": len(data) if size is None else size}


def partials(store: Store) -> list[Path]:
    base = store.root / "blobs" / "partial"
    return sorted(base.iterdir()) if base.is_dir() else []


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# --- sizes: what the manifest declares, the caps, and no byte past the declared size ------------------


def test_a_layer_that_claims_a_terabyte_is_refused_before_it_is_fetched(hostile: Hostile, store: Store) -> None:
    """Before: the 1 TiB layer was fetched and its partial file grew as long as zeros came (4.4 GB in 20 s);
    now what the manifest declares is judged against the caps first, and nothing is asked for."""
    zeros = "sha256:" + "0" * 64
    hostile.routes[hostile.path("blobs", zeros)] = lambda h: hostile.stream(h, 64 << 20)
    cases = {
        "tib": ([{"mediaType": LAYER_GZ, "digest": zeros, "size": TIB}], rf"layer {zeros} declares {TIB} bytes, more"),
        "sum": (
            [{"mediaType": LAYER_GZ, "digest": zeros, "size": 15 << 30}] * 5,
            rf"its blobs declare {(75 << 30) + len(CONFIG)} bytes, more than {64 << 30} \(64 GiB\) in all",
        ),
        "negative": (  # five of 15 GiB, hidden from the total by a sixth below zero
            [{"mediaType": LAYER_GZ, "digest": zeros, "size": 15 << 30}] * 5
            + [{"mediaType": LAYER_GZ, "digest": zeros, "size": -(64 << 30)}],
            rf"layer {zeros} declares no size in bytes \('-68719476736'\)",
        ),
        "text": ([{"mediaType": LAYER_GZ, "digest": zeros, "size": "1e12"}], r"declares no size in bytes \('1e12'\)"),
    }
    for tag, (layers, message) in cases.items():
        hostile.image(layers, tag=tag)
        with pytest.raises(RegistryError, match=message) as info:
            pull(hostile.ref(tag), store=store)
        one_line(info)
    big_config = {"mediaType": OCI_CONFIG, "digest": zeros, "size": 8 << 20}
    hostile.manifest({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": big_config, "layers": []}, "cfg")
    with pytest.raises(RegistryError, match=rf"image config without a size or larger than {IMAGE_JSON_MAX} bytes"):
        pull(hostile.ref("cfg"), store=store)
    assert not [p for p in hostile.paths if "/blobs/" + zeros in p] and hostile.sent == 0
    assert partials(store) == [] and store.list() == []


def test_a_blob_is_read_no_further_than_its_declared_size(hostile: Hostile, store: Store) -> None:
    """Endless zeros, a Content-Length of 1 TiB, and the declared size of wrong bytes followed by a stall:
    each refused as soon as the declared size says so, its partial file removed, the bytes sent bounded
    by the declared size and what the sockets buffer (measured: 3.7 and 7 MiB sent for a 1 MiB blob)."""
    declared = 1 << 20
    digest = "sha256:" + "1" * 64
    path = hostile.path("blobs", digest)
    hostile.image([{"mediaType": LAYER_GZ, "digest": digest, "size": declared}])
    slack = 32 << 20  # socket buffers on both sides, and the chunk in flight

    hostile.routes[path] = lambda h: hostile.stream(h, TIB)
    with pytest.raises(DigestMismatch, match=rf"{digest}: the downloaded bytes hash to sha256:\w+; the blob was"):
        pull(hostile.ref(), store=store)
    assert hostile.sent < declared + slack and partials(store) == []

    hostile.sent = 0
    hostile.routes[path] = lambda h: hostile.stream(h, TIB, length=TIB)
    with pytest.raises(DigestMismatch, match=rf"registry announces {TIB} bytes from offset 0, the manifest declares"):
        pull(hostile.ref(), store=store)
    assert hostile.sent < slack and partials(store) == []

    def declared_then_stall(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(declared))
        h.end_headers()
        h.wfile.write(bytes(declared - 1))
        h.wfile.write(b"\1")  # the declared size, not the declared digest
        h.wfile.flush()
        hostile.release.wait(20)  # and the line stays open (the client's read timeout is 60 s)

    hostile.routes[path] = declared_then_stall
    started = time.monotonic()
    with pytest.raises(
        DigestMismatch, match=rf"{digest}: the downloaded bytes hash to sha256:\w+; the blob was discarded"
    ):
        pull(hostile.ref(), store=store)
    assert time.monotonic() - started < 10, "judged when the declared size had arrived, not when the line closed"
    assert partials(store) == [] and store.list() == []


def test_an_honest_image_from_the_same_server_is_pulled(hostile: Hostile, store: Store) -> None:
    """The bounds leave a well-formed image alone, through a redirect to the registry's own origin too."""
    data = layer_gz([E("hello", data=b"hi\n")])
    digest = sha(data)
    hostile.routes[hostile.path("blobs", digest)] = lambda h: reply(h, 307, b"", {"Location": "/storage/x"})
    hostile.routes["/storage/x"] = lambda h: reply(h, 200, data)
    hostile.image([desc(data)], config=json.dumps({"config": {"Env": ["A=b"]}}).encode())
    entry = pull(hostile.ref(), store=store)
    assert (entry.tree / "hello").read_bytes() == b"hi\n" and entry.config.env == {"A": "b"}
    assert "/storage/x" in hostile.paths and partials(store) == []


# --- documents: nesting, size, count ------------------------------------------------------------------

MEASURE = r"""
import resource, sys
import httpx
from jailbox.sandbox.errors import SandboxError
from jailbox.sandbox.rootfs import pull, unpack
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    pull.pull(sys.argv[1])
    said = "pulled"
except SandboxError as exc:
    said = f"{type(exc).__name__}: {exc}"
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(said)
"""


def pull_measured(ref: str, store: Store) -> tuple[str, int]:
    """``pull(ref)`` in a fresh process: its one-line outcome and how much its peak RSS grew (KiB)."""
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root)}
    r = subprocess.run([sys.executable, "-c", MEASURE, ref], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    sizes, said = r.stdout.split("\n", 1)
    base, peak = map(int, sizes.split())
    return said.rstrip("\n"), peak - base


@pytest.mark.slow
def test_deep_wide_and_huge_documents_are_refused_in_one_line_with_bounded_memory(
    hostile: Hostile, store: Store
) -> None:
    """Before: a deeply nested config raised an uncaught RecursionError, and a config of 4 MiB of empty
    lists took the parser to 338 MB. Now nesting, values and size are judged before parsing: each
    refusal costs the pulling process under 24 MiB (measured: under 1 MiB), and a config near the
    bounds (49,000 history entries, 1.9 MB) is pulled for 13 MiB, held under 48."""
    deep = b"[" * 20_000 + b"]" * 20_000
    wide = b"[" + b"[]," * ((IMAGE_JSON_MAX - 8) // 3) + b"[]]"
    for tag, config, message in [
        ("deep", deep, "image config nests deeper than 64 levels; refused"),
        ("wide", wide, "image config holds more than 100000 values"),
    ]:
        hostile.image([], config=config, tag=tag)
        said, grew = pull_measured(hostile.ref(tag), store)
        assert said.startswith("RegistryError: ") and message in said, said
        assert grew < 24 << 10, f"{tag}: the pull grew by {grew} KiB"
    most = json.dumps({"config": {}, "history": [{"created_by": "x" * 30}] * 49_000}).encode()
    hostile.image([], config=most, tag="most")
    said, grew = pull_measured(hostile.ref("most"), store)
    assert said == "pulled" and grew < 48 << 10, (said, grew)
    hostile.manifest(b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "deep-manifest")
    said, grew = pull_measured(hostile.ref("deep-manifest"), store)
    assert said == "RegistryError: manifest deep-manifest nests deeper than 64 levels; refused", said
    assert grew < 24 << 10
    hostile.routes[hostile.path("manifests", "endless")] = lambda h: hostile.stream(h, 64 << 20)
    hostile.routes[hostile.path("manifests", "announced")] = lambda h: hostile.stream(h, 8 << 20, length=8 << 20)
    for tag in ("endless", "announced"):
        said, grew = pull_measured(hostile.ref(tag), store)
        assert said.startswith(f"RegistryError: manifest {tag} is larger than {IMAGE_JSON_MAX} bytes"), said
        assert grew < 24 << 10
    assert [e.name for e in store.list()] == [hostile.ref("most")]


def test_too_many_layers_are_refused_in_one_line_and_the_allowed_count_unpacks(
    hostile: Hostile, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 20,000 layers reached the unpack worker's argv and failed with an uncaught "Argument list
    too long". The count is bounded, and the request no longer travels in an argv: the most layers an
    image may have unpack from a store whose path is long (500 x 1.5 KB of paths, where one argv string
    may hold 128 KiB)."""
    data = layer_gz([E("same", data=b"layer\n")])
    hostile.blob(data)
    hostile.image([desc(data)] * 20_000, tag="many")
    with pytest.raises(RegistryError, match=r"20000 layers, more than the 500 an image may have") as info:
        pull(hostile.ref("many"), store=store)
    one_line(info)
    deep = tmp_path.joinpath(*["d" * 200] * 7)
    deep.mkdir(parents=True, mode=0o700)
    long_store = Store(deep / "cache")
    hostile.image([desc(data)] * IMAGE_LAYERS_MAX, tag="most")
    entry = pull(hostile.ref("most"), store=long_store)
    assert (entry.tree / "same").read_bytes() == b"layer\n"
    long_store.remove(entry.name)


# --- where requests go: redirects and token services --------------------------------------------------


def test_redirects_reach_only_where_a_registry_client_should(hostile: Hostile, victim: Victim, store: Store) -> None:
    """Before: a blob or manifest redirect was followed to any host, loopback included. The registry's own
    origin is followed; another port of the same loopback, plain http elsewhere, loopback, link-local and
    private addresses are refused in one line, and the other service sees no connection."""
    data = layer_gz([E("f", data=b"x")])
    digest = sha(data)
    hostile.image([desc(data)])
    blob = hostile.path("blobs", digest)
    targets = {
        f"http://127.0.0.1:{victim.port}/x": "not https and not the registry's own origin",
        f"https://127.0.0.1:{victim.port}/x": "its host has a loopback address (127.0.0.1)",
        f"https://localhost:{victim.port}/x": "its host has a loopback address",
        f"http://[::ffff:127.0.0.1]:{victim.port}/x": "not https and not the registry's own origin",
        f"https://[::ffff:127.0.0.1]:{victim.port}/x": "its host has a loopback address",
        "https://169.254.169.254/latest/meta-data/": "its host has a link-local address (169.254.169.254)",
        "https://10.1.2.3/x": "its host has a private address (10.1.2.3)",
        f"http://127.0.0.1:{hostile.port}.evil/x": "",  # a bad URL: refused one way or another
    }
    for target, why in targets.items():
        hostile.routes[blob] = lambda h, t=target: reply(h, 302, b"", {"Location": t})
        with pytest.raises(RegistryError) as info:
            pull(hostile.ref(), store=store)
        assert why in one_line(info), (target, str(info.value))
    hostile.routes[hostile.path("manifests", "redirected")] = lambda h: reply(
        h, 307, b"", {"Location": f"http://127.0.0.1:{victim.port}/v2/evil/img/manifests/t"}
    )
    with pytest.raises(RegistryError, match=rf"refused to follow a redirect to http://127.0.0.1:{victim.port}/v2/"):
        pull(hostile.ref("redirected"), store=store)
    hostile.routes[blob] = lambda h: reply(h, 302, b"", {"Location": blob})  # a loop on its own origin
    with pytest.raises(RegistryError, match="TooManyRedirects"):
        pull(hostile.ref(), store=store)
    assert victim.connections == 0 and store.list() == [] and partials(store) == []


def test_the_token_service_is_reached_only_where_a_registry_client_should(
    hostile: Hostile, victim: Victim, store: Store
) -> None:
    """Before: the realm of a bearer challenge was asked wherever it pointed. Now as a redirect is: the
    registry's own origin, or https to a public address; its reply is read to 4 MiB at most."""
    data = layer_gz([E("f", data=b"x")])
    hostile.image([desc(data)])
    hostile.blob(data)
    realm = {"url": ""}

    def guarded(route: Route) -> Route:
        def check(h: http.server.BaseHTTPRequestHandler) -> None:
            if h.headers.get("Authorization") != "Bearer good":
                challenge = f'Bearer realm="{realm["url"]}",service="evil"'
                reply(h, 401, b"{}", {"WWW-Authenticate": challenge})
                return
            route(h)

        return check

    hostile.routes = {p: guarded(r) for p, r in hostile.routes.items()}
    hostile.routes["/token"] = lambda h: reply(h, 200, b'{"token": "good"}')
    hostile.routes["/huge-token"] = lambda h: hostile.stream(h, 64 << 20)
    refused = {
        f"http://127.0.0.1:{victim.port}/token": "not https and not the registry's own origin",
        f"https://127.0.0.1:{victim.port}/token": "its host has a loopback address",
        f"https://[::1]:{victim.port}/token": "its host has a loopback address",
        "https://169.254.169.254/token": "its host has a link-local address",
        "file:///etc/passwd": "not http(s)",
    }
    for url, why in refused.items():
        realm["url"] = url
        with pytest.raises(RegistryError, match="refused its token service") as info:
            pull(hostile.ref(), store=store)
        assert why in one_line(info), (url, str(info.value))
    realm["url"] = f"http://127.0.0.1:{hostile.port}/huge-token"
    with pytest.raises(RegistryError, match=f"is larger than {IMAGE_JSON_MAX} bytes; refused"):
        pull(hostile.ref(), store=store)
    assert victim.connections == 0 and store.list() == []
    realm["url"] = f"http://127.0.0.1:{hostile.port}/token"  # its own origin: asked, and the pull works
    assert (pull(hostile.ref(), store=store).tree / "f").read_bytes() == b"x"


def test_where_a_registry_on_a_private_address_may_send_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule, by address (literal addresses: nothing is resolved or connected): https to a public
    address from anywhere; private addresses only from a registry that is itself on one; loopback and
    link-local never but for the registry's own origin; never a step down to plain http. A name that
    does not resolve is refused, unless a proxy from the environment would be asked for it."""
    lan = Registry(Reference.parse("10.1.2.3:5000/a/b"), insecure=True)
    local = Registry(Reference.parse("127.0.0.1:5000/a/b"))
    try:
        import httpx

        for reg, url, allowed in [
            (lan, "http://10.1.2.3:5000/v2/other", True),
            (lan, "https://10.9.9.9/blob", True),
            (lan, "https://8.8.8.8/blob", True),
            (lan, "http://10.9.9.9/blob", False),
            (lan, "https://127.0.0.1/blob", False),
            (lan, "https://169.254.169.254/", False),
            (lan, "https://[fe80::1]/", False),
            (local, "http://127.0.0.1:5000/elsewhere", True),
            (local, "http://127.0.0.1:5001/elsewhere", False),
            (local, "https://127.0.0.1:5000/elsewhere", False),
            (local, "https://10.9.9.9/blob", False),
            (local, "https://8.8.8.8/blob", True),
            (local, "https://[::ffff:10.0.0.1]/blob", False),
        ]:
            assert (reg.refusal(httpx.URL(url)) is None) == allowed, (reg.base, url)
        nowhere = httpx.URL("https://no-such-host.invalid/blob")
        for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        assert "its host does not resolve" in str(local.refusal(nowhere))
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
        assert local.refusal(nowhere) is None
        assert "loopback" in str(local.refusal(httpx.URL("https://127.0.0.1:5001/x")))  # judged all the same
        monkeypatch.setenv("NO_PROXY", ".invalid")
        assert "its host does not resolve" in str(local.refusal(nowhere))
    finally:
        lan.close()
        local.close()


# --- partial files: refused ones go at once, stale ones with `jailbox cleanup`, SIGTERM as Ctrl-C ------


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else os.O_CREAT), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_cleanup_removes_stale_partial_downloads_and_unfinished_trees(tmp_path: Path, store: Store) -> None:
    """Before: nothing removed a partial download (a hostile registry's 4.4 GB stayed). `jailbox cleanup`
    removes those no live pull holds and not grown for a day (any age with --force), staging trees of
    names nobody is making, and import directories of imports that are gone."""
    store.ensure()
    blobs = store.root / "blobs"
    for sub in ("partial", "locks", "sha256"):
        (blobs / sub).mkdir(exist_ok=True, mode=0o700)
    old = time.time() - 2 * 86400
    stale, held, fresh = (blobs / "partial" / (c * 64) for c in "abc")
    for p in (stale, held, fresh):
        p.write_bytes(bytes(1 << 20))
    os.utime(stale, (old, old))
    os.utime(held, (old, old))
    tmp = store.root / "tmp"
    dead_staging = tmp / "mine.0badc0de"
    live_staging = tmp / "busy.0badc0de"
    dead_import, live_import = tmp / "import-dead", tmp / "import-live"
    for d in (dead_staging, live_staging, dead_import, live_import):
        (d / "tree" / "etc").mkdir(parents=True)
        (d / "tree" / "etc" / "f").write_bytes(b"x")
    young = tmp / "import-young"  # made this instant: its import may not have locked it yet
    young.mkdir()
    for d in (dead_import, live_import):
        os.utime(d, (old, old))
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root), "JAILBOX_STATE_DIR": str(tmp_path / "state")}

    def cleanup(*flags: str) -> list[str]:
        r = subprocess.run([*JAILBOX, "cleanup", *flags], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        mine = f"removed {store.root}/"  # not the stale cgroups it may also find
        return [line[len("removed ") :] for line in r.stdout.splitlines() if line.startswith(mine)]

    with (
        flocked(blobs / "locks" / (held.name + ".lock")),
        flocked(store.root / "locks" / "busy.lock"),
        flocked(live_import),
    ):
        assert sorted(cleanup()) == sorted(map(str, [stale, dead_staging, dead_import]))
        assert fresh.exists() and held.exists() and live_staging.exists() and live_import.exists()
        assert cleanup("--force") == [str(fresh)]
        assert held.exists() and live_staging.exists() and live_import.exists()
    assert sorted(cleanup()) == sorted(map(str, [held, live_staging, live_import]))
    assert young.exists()


def test_sigterm_during_a_cli_pull_is_handled_as_ctrl_c(hostile: Hostile, store: Store) -> None:
    """Before: SIGTERM ended `jailbox rootfs pull` on the spot (status -15, no word, and an unpack worker
    left writing). Now it is Ctrl-C: one line, status 130, nothing half-made in the store; what arrived is
    kept to resume, and a refused blob's bytes are never kept (above)."""
    data = os.urandom(3 << 20)
    digest = sha(data)

    def stall(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: 1 << 20])
        h.wfile.flush()
        hostile.release.wait(60)

    hostile.routes[hostile.path("blobs", digest)] = stall
    hostile.image([desc(data)])
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root)}
    cli = subprocess.Popen(
        [*JAILBOX, "rootfs", "pull", hostile.ref()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    partial = store.root / "blobs" / "partial" / digest[7:]
    for _ in range(1200):  # bounded wait until the first MiB is on disk
        if partial.exists() and partial.stat().st_size >= 1 << 20:
            break
        time.sleep(0.05)
    cli.send_signal(signal.SIGTERM)
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 130, err.decode()[-2000:]
    assert err.decode().splitlines()[-1].startswith("jailbox: interrupted; nothing stored")
    assert store.list() == [] and not list(store.root.glob("tmp/*"))


# --- the unpack worker dies with its caller ----------------------------------------------------------

CALLER = r"""
import json, sys, threading
from jailbox.sandbox.rootfs import unpack

def run():
    print(json.dumps(unpack.extract_tar(sys.stdin.buffer, sys.argv[1])), flush=True)

if sys.argv[2] == "thread":  # the worker's parent-death signal belongs to this thread: it waits for it
    t = threading.Thread(target=run)
    t.start()
    t.join()
else:
    run()
"""


def workers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"sandbox.rootfs.worker" in cmdline:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("spawner", ["main", "thread"])
def test_the_unpack_worker_dies_with_its_caller(tmp_path: Path, spawner: str) -> None:
    """Before: a caller killed mid-extraction left its worker running, reading and writing on. Now the
    worker has a parent-death signal (set again once it is the namespace's root, which clears it): killed
    with the caller, from its main thread or another, within a bounded wait; an unkilled one finishes."""
    whole = tar_bytes([E("big", data=bytes(8 << 20))])
    head = whole[: 512 * 4]  # a member that is still arriving
    for kill in (True, False):
        dest = tmp_path / f"tree-{kill}"
        dest.mkdir()
        caller = subprocess.Popen(
            [sys.executable, "-c", CALLER, str(dest), spawner],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert caller.stdin is not None
        try:
            caller.stdin.write(head)
            caller.stdin.flush()
            workers: list[int] = []
            for _ in range(600):  # bounded wait until the worker writes the member
                workers = workers_of(caller.pid)
                if workers and os.path.lexists(dest / "big"):
                    break
                time.sleep(0.05)
            assert len(workers) == 1 and os.path.lexists(dest / "big")
            if kill:
                caller.kill()
                caller.wait(timeout=30)
                for _ in range(200):
                    if not alive(workers[0]):
                        break
                    time.sleep(0.05)
                assert not alive(workers[0]), "the worker outlived its caller"
            else:
                out, err = caller.communicate(whole[512 * 4 :], timeout=120)
                assert caller.returncode == 0, err.decode()[-2000:]
                assert json.loads(out)["entries"] == 1
        finally:
            if caller.poll() is None:
                caller.kill()
            caller.wait()
            with contextlib.suppress(OSError):
                caller.stdin.close()


# --- rootfs import: what an archive may make the host copy ---------------------------------------------


def docker_save(path: Path, *members: bytes | tuple[bytes, int], gz: bool = True) -> Path:
    """A docker-save-shaped archive whose manifest.json comes first, then raw ``members``."""
    manifest = json.dumps([{"Config": "c.json", "RepoTags": ["x:y"], "Layers": ["l/layer.tar"]}]).encode()
    head = raw_header("manifest.json", tarfile.REGTYPE, len(manifest)) + manifest
    head += bytes(-len(head) % 512)
    with gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb") as out:
        out.write(head)
        for part in members:
            chunk, count = (part, 1) if isinstance(part, bytes) else part
            for _ in range(count):
                out.write(chunk)
            out.write(bytes(-(len(chunk) * count) % 512))
        out.write(bytes(1024))
    return path


def written_by_this_process() -> int:
    return int(Path("/proc/self/io").read_text().split("wchar: ", 1)[1].split()[0])


@pytest.mark.slow
def test_an_image_archive_cannot_make_import_copy_without_bound(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `rootfs import` copied every member of a docker-save archive to a temporary directory
    unbounded (a few MB of gzip claiming a huge layer), and copied a linked layer once per link. Now a
    member is judged by its header before a byte is copied, all members share a cap, so does their
    count (a few MB of gzip made an inode for every 512 bytes of tar), a link is a link, and more layers
    than an image may have are refused in one line."""
    from jailbox.sandbox.rootfs import importer
    from jailbox.sandbox.rootfs.importer import import_rootfs

    huge = IMAGE_BLOB_MAX + 1
    src = docker_save(tmp_path / "huge.tar.gz", raw_header("l/layer.tar", tarfile.REGTYPE, huge), (bytes(1 << 20), 64))
    before = written_by_this_process()
    with pytest.raises(RootfsError, match=rf"l/layer.tar: {huge} bytes, more than the {IMAGE_BLOB_MAX} a file") as info:
        import_rootfs(src, "evil", store=store)
    one_line(info)
    assert written_by_this_process() - before < 1 << 20  # nothing of the 64 MiB that followed
    monkeypatch.setattr(importer, "IMAGE_BLOBS_MAX", 8 << 20)  # the shared cap, at a size a test can reach
    parts = [raw_header(f"l{i}/layer.tar", tarfile.REGTYPE, 3 << 20) + bytes(3 << 20) for i in range(4)]
    with pytest.raises(RootfsError, match=r"l2/layer.tar: the archive's files pass 8388608 bytes in all"):
        import_rootfs(docker_save(tmp_path / "sum.tar", *parts, gz=False), "evil", store=store)
    monkeypatch.undo()
    layer = tar_bytes([E("f", data=b"x")])
    links = [raw_header(f"k{i}/layer.tar", tarfile.LNKTYPE, 0, {157: b"l/layer.tar"}) for i in range(256)]
    src = docker_save(
        tmp_path / "links.tar",
        raw_header("l/layer.tar", tarfile.REGTYPE, 4 << 20) + layer + bytes((4 << 20) - len(layer)),
        raw_header("c.json", tarfile.REGTYPE, 2) + b"{}",
        *links,
        gz=False,
    )
    before = written_by_this_process()
    entry = import_rootfs(src, "linked", store=store)
    assert (entry.tree / "f").read_bytes() == b"x"
    assert written_by_this_process() - before < 64 << 20  # a copy a link was 1 GiB
    empties = [raw_header(f"e/{i}", tarfile.REGTYPE, 0) for i in range(30_000)]  # 15 MB of tar, 0.1 MB gzip'd
    with pytest.raises(RootfsError, match=r"e/19999: more than 20000 members in an image archive; refused") as info:
        import_rootfs(docker_save(tmp_path / "inodes.tar.gz", *empties), "evil", store=store)
    one_line(info)
    many = json.dumps([{"Config": "c.json", "Layers": ["l/layer.tar"] * 20_000}]).encode()
    src = tmp_path / "many.tar"
    src.write_bytes(tar_bytes([E("manifest.json", data=many), E("c.json", data=b"{}"), E("l/layer.tar", data=layer)]))
    with pytest.raises(RootfsError, match=r"20000 layers, more than the 500 an image may have") as info:
        import_rootfs(src, "many", store=store)
    one_line(info)
    assert [e.name for e in store.list()] == ["linked"] and not list(store.root.glob("tmp/*"))
