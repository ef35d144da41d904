"""Stand-in "internet" for the network tests: a test CA made with the openssl CLI, HTTP and HTTPS
servers on a chosen host address, a PEP 503 package index with a wheel built here."""

from __future__ import annotations

import base64
import hashlib
import io
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil

NAMES = ("allowed.test", "pypi.test", "blocked.allowed.test", "other.test", "files.allowed.test")
JAIL_CA = "/etc/jailbox-test-ca/ca.pem"
CA_ENV = {"SSL_CERT_FILE": JAIL_CA, "REQUESTS_CA_BUNDLE": JAIL_CA, "PIP_CERT": JAIL_CA, "CURL_CA_BUNDLE": JAIL_CA}
WHEEL = "jbdemo-1.0-py3-none-any.whl"


def host_address() -> str | None:
    """A non-loopback IPv4 address of this host (the stand-ins for ``full`` bind there)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def make_ca(directory: Path, addresses: list[str]) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert, server key): the server cert names every test name and ``addresses``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = ["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=jailbox test CA"]
    subprocess.run([*run, "-addext", "basicConstraints=critical,CA:TRUE"], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=stand-in"], check=True, capture_output=True
    )
    sans = ",".join([f"DNS:{n}" for n in NAMES] + [f"IP:{a}" for a in addresses])
    ext = directory / "ext.cnf"
    ext.write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    sign = ["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert]
    subprocess.run([*sign, "-days", "2", "-extfile", ext], check=True, capture_output=True)
    for path in directory.iterdir():
        path.chmod(0o644)
    return ca, cert, key


def build_wheel() -> bytes:
    """A real, minimal wheel of a package ``jbdemo`` (``jbdemo.VALUE == 42``)."""
    files = {
        "jbdemo/__init__.py": b"VALUE = 42\n",
        "jbdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: jbdemo\nVersion: 1.0\n",
        "jbdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: jailbox-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("jbdemo-1.0.dist-info/RECORD,,")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("jbdemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buf.getvalue()


class _QuietServer(ThreadingHTTPServer):
    """A peer that hangs up mid-request (a proxy refusing it, a client cut off on purpose) is what
    these tests make happen, not an error: printed from the server's thread it lands in CI's log."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class StandIn:
    """An HTTP (or, with a certificate, HTTPS) server: ``/hello``, ``/big?n=BYTES``, a package index,
    and the files under ``static`` at ``/static/`` (a git repository over git's dumb HTTP protocol)."""

    def __init__(
        self, address: str = "127.0.0.1", cert: tuple[Path, Path] | None = None, static: Path | None = None
    ) -> None:
        self.hits: list[str] = []
        self.sent = 0
        self.wheel = build_wheel()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.hits.append(f"{self.headers.get('Host')}{self.path}")
                url = urlsplit(self.path)
                if url.path == "/hello":
                    self._send(f"hello from {self.headers.get('Host')}\n".encode())
                elif url.path == "/big":
                    self._big(int(parse_qs(url.query)["n"][0]))
                elif url.path == "/simple/jbdemo/":
                    digest = hashlib.sha256(owner.wheel).hexdigest()
                    link = f'<a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a>'
                    self._send(f"<html><body>{link}</body></html>".encode(), "text/html")
                elif url.path == f"/files/{WHEEL}":
                    self._send(owner.wheel, "application/octet-stream")
                elif static is not None and url.path.startswith("/static/") and ".." not in url.path:
                    path = static / url.path[len("/static/") :]
                    if path.is_file():
                        self._send(path.read_bytes(), "application/octet-stream")
                    else:
                        self.send_error(404)
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _big(self, n: int) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                block = b"x" * 65536
                left = n
                try:
                    while left:
                        chunk = block[: min(left, len(block))]
                        self.wfile.write(chunk)
                        owner.sent += len(chunk)
                        left -= len(chunk)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = _QuietServer((address, 0), Handler)
        self.server.daemon_threads = True
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.address = address
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
