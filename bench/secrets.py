"""Secrets at the proxy (``docs/secrets.md``): an HTTPS request from a jail to a host a secret is bound
to (TLS ended and made again at the proxy, the header rewritten) against the same request to a host
no secret is bound to (the plain allow-list proxy's tunnel), in one jail, interleaved, timed inside
the jail by one Python client. The stand-in server, its CA and the jail's root filesystem (its own
/etc over the host's /usr) are made here, in a scratch directory."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary
from jailbox.sandbox import Mount, Sandbox, SandboxConfig, Secret, hostids

BOUND, PLAIN = "bound.bench.test", "plain.bench.test"
HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
USR = ("bin", "sbin", "lib", "lib64", "share")
# in the jail: GETs to each name in turn, interleaved; "new": each on a connection of its own (the
# proxy's second TLS handshake every time), "kept": on one connection per name held open (http.client
# through the proxy's tunnel), the first of each not counted; times in milliseconds as JSON
CLIENT = r"""
import http.client, json, os, ssl, sys, time, urllib.request
port, reps = int(sys.argv[1]), int(sys.argv[2])
names = {"bound": sys.argv[3], "plain": sys.argv[4]}
auth = {"Authorization": "Bearer " + os.environ["TOKEN"]}
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": os.environ["https_proxy"]}))
kept = {}
for key, host in names.items():
    kept[key] = http.client.HTTPSConnection("127.0.0.1", 3128, context=ssl.create_default_context())
    kept[key].set_tunnel(host, port)
times = {f"{way}-{key}": [] for way in ("new", "kept") for key in names}
for i in range(reps):
    for key in list(names)[:: 1 if i % 2 else -1]:
        start = time.perf_counter()
        with opener.open(urllib.request.Request(f"https://{names[key]}:{port}/", headers=auth), timeout=30) as r:
            r.read()
        times[f"new-{key}"].append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        kept[key].request("GET", "/", headers=auth)
        kept[key].getresponse().read()
        times[f"kept-{key}"].append((time.perf_counter() - start) * 1000)
print(json.dumps(times))
"""


def secrets(settings: Settings) -> CaseResult:
    reps = settings.secret_reps
    with _world() as (config, port):
        with Sandbox(config) as sb:
            sb.write_file("/tmp/client.py", CLIENT)
            r = sb.exec(["python3", "/tmp/client.py", str(port), str(reps + 2), BOUND, PLAIN], timeout=600)
            if r.exit_code != 0:
                raise RuntimeError(f"the jail's client failed: {r.stderr[-500:]}")
    # the first two of each open the kept connections and warm the proxy's caches
    times = {k: Summary.of(v[2:]) for k, v in json.loads(r.stdout).items()}
    added = times["kept-bound"].median - times["kept-plain"].median
    rows = [
        Row("HTTPS request on a kept connection, a secret added at the proxy", "ms", times["kept-bound"],
            "same request, no secret (tunnel)", times["kept-plain"], Target.check("<= 1 ms added", added <= 1.0)),
        Row("HTTPS request on a new connection, a secret added at the proxy", "ms", times["new-bound"],
            "same request, no secret (tunnel)", times["new-plain"]),
    ]  # fmt: skip
    return CaseResult(rows)


@contextmanager
def _world() -> Iterator[tuple[SandboxConfig, int]]:
    """A stand-in HTTPS server for both names, a CA the proxy and the jail trust, a root filesystem."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-secrets-"))
    before = os.environ.get("SSL_CERT_FILE")
    server: ThreadingHTTPServer | None = None
    try:
        ca_pem, cert, key = _pki(scratch)
        (scratch / "host.pem").write_text(HOST_BUNDLE.read_text() + ca_pem)
        os.environ["SSL_CERT_FILE"] = str(scratch / "host.pem")  # the proxy verifies the stand-in
        server = _server(scratch, cert, key)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        root = _tree(scratch)
        mounts = [Mount(f"/usr/{d}", f"/usr/{d}") for d in USR if Path(f"/usr/{d}").is_dir()]
        config = SandboxConfig(
            rootfs=str(root),
            mounts=mounts,
            ca_certs=[scratch / "ca.pem"],
            network={
                "mode": "allow",
                "allow": [f"{BOUND}:*", f"{PLAIN}:*"],
                "hosts": {BOUND: "127.0.0.1", PLAIN: "127.0.0.1"},
            },
            secrets=[Secret(name="TOKEN", value="bench-token-value", hosts=[BOUND])],
        )
        yield config, server.server_address[1]
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before
        shutil.rmtree(scratch, ignore_errors=True)


def _pki(scratch: Path) -> tuple[str, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jailbox bench CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BOUND)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(BOUND), x509.DNSName(PLAIN)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem).decode()
    (scratch / "ca.pem").write_text(ca_pem)
    (scratch / "srv.pem").write_bytes(leaf.public_bytes(pem))
    (scratch / "srv.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_pem, scratch / "srv.pem", scratch / "srv.key"


def _server(scratch: Path, cert: Path, key: Path) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return server


def _tree(scratch: Path) -> Path:
    """Its own /etc (the host's CA bundle copied in, to be extended) over the host's /usr."""
    root = scratch / "tree"
    for rel in ("etc/ssl/certs", "root", "tmp", "usr/lib"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        (root / name).symlink_to(f"usr/{name}")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    shutil.copyfile(HOST_BUNDLE, root / "etc/ssl/certs/ca-certificates.crt")
    scratch.chmod(0o755)
    if os.getuid() == 0:  # root's jails run as a subordinate id: the tree is their root's, as an image is
        uid, gid = hostids.plan("auto").host_root()
        for top, dirs, files, fd in os.fwalk(root):
            os.chown(top, uid, gid, follow_symlinks=False)
            for name in dirs + files:
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    return root
