"""Real OCI images for the rootfs tests: layers built with tarfile, an OCI layout written by hand,
pushed with skopeo to Debian's docker-registry on 127.0.0.1, optionally through a proxy that counts,
cuts or corrupts blob downloads."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import http.server
import io
import json
import os
import socket
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY_BIN = "/usr/bin/docker-registry"


@dataclass
class E:
    """One tar member: kind is file, dir, symlink, hardlink, fifo, chr."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int | None = None
    uid: int = 0
    gid: int = 0
    link: str = ""
    size: int | None = None  # a lie in the header, for malicious layers

    def info(self) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(self.name)
        ti.type = {
            "file": tarfile.REGTYPE,
            "dir": tarfile.DIRTYPE,
            "symlink": tarfile.SYMTYPE,
            "hardlink": tarfile.LNKTYPE,
            "fifo": tarfile.FIFOTYPE,
            "chr": tarfile.CHRTYPE,
        }[self.kind]
        ti.mode = self.mode if self.mode is not None else (0o755 if self.kind == "dir" else 0o644)
        ti.uid, ti.gid = self.uid, self.gid
        ti.linkname = self.link
        ti.mtime = 1700000000
        if self.kind == "file":
            ti.size = len(self.data)
        if self.kind == "chr":
            ti.devmajor, ti.devminor = 1, 3
        return ti


def tar_bytes(entries: list[E]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = e.info()
            tf.addfile(ti, io.BytesIO(e.data) if e.kind == "file" else None)
    raw = buf.getvalue()
    for e in entries:
        if e.size is not None:  # rewrite the size field of that header (octal, 12 bytes at 124)
            raw = _patch_size(raw, e.name, e.size)
    return raw


def _patch_size(raw: bytes, name: str, size: int) -> bytes:
    data = bytearray(raw)
    pos = 0
    while pos < len(data):
        header = data[pos : pos + 512]
        if header[:100].rstrip(b"\0").decode(errors="replace") == name:
            header[124:136] = b"\x80" + size.to_bytes(11, "big")  # base-256: any size
            header[148:156] = b"        "
            chk = sum(header)
            header[148:156] = b"%06o\0 " % chk
            data[pos : pos + 512] = header
            return bytes(data)
        pos += 512
    raise AssertionError(f"{name} not found")


def raw_header(name: str, kind: bytes, size: int, patch: dict[int, bytes] | None = None) -> bytes:
    """One raw 512-byte tar header, ``patch`` written over it at byte offsets, checksum redone."""
    ti = tarfile.TarInfo(name)
    ti.type, ti.size, ti.mtime = kind, size, 1700000000
    raw = bytearray(ti.tobuf(format=tarfile.GNU_FORMAT))
    for offset, value in (patch or {}).items():
        raw[offset : offset + len(value)] = value
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw)
    return bytes(raw)


def raw_tar_gz(path: Path, *parts: bytes | tuple[bytes, int]) -> Path:
    """A gzip'd tar of raw ``parts``: bytes, or (chunk, count) streamed ``count`` times; each part
    padded to the 512-byte block. A few MiB of gzip stand for hundreds of MiB of tar."""
    with gzip.open(path, "wb", compresslevel=1) as out:
        for part in parts:
            chunk, count = (part, 1) if isinstance(part, bytes) else part
            for _ in range(count):
                out.write(chunk)
            out.write(bytes(-(len(chunk) * count) % 512))
        out.write(bytes(1024))
    return path


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layout:
    """An OCI image layout directory written by hand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.index: list[dict] = []

    def blob(self, data: bytes, media: str) -> dict:
        digest = sha(data)
        (self.path / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return {"mediaType": media, "digest": digest, "size": len(data)}

    def image(self, layers: list[bytes], config: dict | None = None, arch: str = "amd64", zstd: bool = False) -> dict:
        """A manifest over gzipped (or zstd-compressed) layers; returns its descriptor."""
        if zstd:
            compress = [
                subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True) for raw in layers
            ]
            descs = [self.blob(c.stdout, "application/vnd.oci.image.layer.v1.tar+zstd") for c in compress]
        else:
            gz = "application/vnd.oci.image.layer.v1.tar+gzip"
            descs = [self.blob(gzip.compress(raw, mtime=0), gz) for raw in layers]
        cfg = {
            "architecture": arch,
            "os": "linux",
            "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": [sha(raw) for raw in layers]},
        }
        cdesc = self.blob(json.dumps(cfg).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": cdesc,
            "layers": descs,
        }
        desc = self.blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        desc["platform"] = {"architecture": arch, "os": "linux"}
        return desc

    def tag(self, tag: str, desc: dict) -> None:
        self.index.append({**desc, "annotations": {"org.opencontainers.image.ref.name": tag}})
        (self.path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": self.index}))

    def multi(self, tag: str, descs: list[dict]) -> None:
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": descs}
        desc = self.blob(json.dumps(index).encode(), "application/vnd.oci.image.index.v1+json")
        self.tag(tag, desc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRegistry:
    """docker-registry serving from a temp directory on 127.0.0.1."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.storage = base / "storage"
        self.port = free_port()
        self.log = base / "registry.log"
        config = base / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
        )
        self.proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(config)], stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        for _ in range(200):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/v2/")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError(f"docker-registry did not start: {self.log.read_text()[-2000:]}")

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, layout: Path, tag: str, repo: str, dest_tag: str | None = None) -> None:
        subprocess.run(
            [
                "skopeo",
                "copy",
                "--all",
                "--dest-tls-verify=false",
                "--preserve-digests",
                f"oci:{layout}:{tag}",
                f"docker://{self.host}/{repo}:{dest_tag or tag}",
            ],
            check=True,
            capture_output=True,
            # its own credentials file: by default skopeo reads /run/containers/UID/auth.json, and fails
            # where root's podman has made /run/containers 0700 (a rootless pass after a root one)
            env={**os.environ, "HOME": str(self.base), "REGISTRY_AUTH_FILE": str(self.base / "auth.json")},
        )

    def blob_file(self, digest: str) -> Path:
        hexd = digest[7:]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


@dataclass
class ProxyLog:
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    blob_bytes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Proxy:
    """A real HTTP proxy in front of the registry: counts requests, can cut the first download of a
    blob after ``cut_after`` bytes, or flip a byte of a blob (``tamper``)."""

    def __init__(self, upstream_port: int) -> None:
        self.log = ProxyLog()
        self.cut_after: int | None = None
        self.tamper: str | None = None
        self.token: str | None = None  # require "Bearer <token>", handed out by /token
        self.login: str | None = None  # the /token endpoint wants this Basic credential
        self.token_queries: list[str] = []
        self.stall_after: int | None = None  # send this much of a blob, then hang until released
        self.release = threading.Event()
        self._cut_done: set[str] = set()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _plain(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                proxy.log.requests.append((self.path, rng))
                if self.path.startswith("/token"):
                    proxy.token_queries.append(self.path)
                    if proxy.login and self.headers.get("Authorization") != "Basic " + proxy.login:
                        self._plain(401, b"{}", {})
                        return
                    self._plain(200, json.dumps({"token": proxy.token}).encode(), {})
                    return
                if proxy.token and self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    realm = f"http://127.0.0.1:{proxy.port}/token"
                    challenge = f'Bearer realm="{realm}",service="test-registry",scope="repository:test/img:pull"'
                    self._plain(401, b"{}", {"WWW-Authenticate": challenge})
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                try:
                    conn.request("GET", self.path, headers=headers)
                    resp = conn.getresponse()
                    body = resp.read()
                except OSError as exc:  # say what went wrong upstream instead of dropping the line
                    proxy.log.errors.append(f"{self.path}: {exc!r}")
                    self._plain(502, repr(exc).encode(), {})
                    return
                digest = self.path.rsplit("/", 1)[-1] if "/blobs/" in self.path else None
                if digest and proxy.tamper == digest and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if digest and proxy.cut_after is not None and digest not in proxy._cut_done and resp.status == 200:
                    proxy._cut_done.add(digest)
                    self.wfile.write(body[: proxy.cut_after])
                    self.wfile.flush()
                    proxy.log.blob_bytes[digest] = proxy.log.blob_bytes.get(digest, 0) + proxy.cut_after
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if digest and proxy.stall_after is not None and len(body) > proxy.stall_after:
                    self.wfile.write(body[: proxy.stall_after])
                    self.wfile.flush()
                    proxy.release.wait(120)
                    body = body[proxy.stall_after :]
                if digest:
                    proxy.log.blob_bytes[digest] = proxy.log.blob_bytes.get(digest, 0) + len(body)
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blob_gets(self, digest: str) -> int:
        return sum(1 for path, _ in self.log.requests if path.endswith(f"/blobs/{digest}"))

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


TREE_SCRIPT = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
out = {}
for top, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(top, name)
        rel = os.path.relpath(path, root)
        st = os.lstat(path)
        mode = oct(st.st_mode & 0o7777)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ["l", os.readlink(path), st.st_uid, st.st_gid]
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ["d", mode, st.st_uid, st.st_gid]
        elif stat.S_ISFIFO(st.st_mode):
            out[rel] = ["p", mode, st.st_uid, st.st_gid]
        else:
            with open(path, "rb") as f:
                out[rel] = ["f", mode, st.st_uid, st.st_gid, hashlib.sha256(f.read()).hexdigest()]
print(json.dumps(out))
"""


def tree_of(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` as a jail sees it (the owners through the jail's id map):
    (type, mode, uid, gid, sha256 of the content or the link target)."""
    from jailbox.sandbox import Mount, Sandbox

    with Sandbox(mounts=[Mount(root, "/mnt/tree")], cap_add=["ALL"]) as sb:  # reads 0700 dirs of any owner
        r = sb.exec(["python3", "-c", TREE_SCRIPT, "/mnt/tree"], timeout=120)
    assert r.exit_code == 0, r.stderr
    return {k: tuple(v) for k, v in json.loads(r.stdout).items()}


def content(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
