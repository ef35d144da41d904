"""A client of the OCI distribution API on httpx: manifests and blobs, nothing else.

Auth: on a 401 the ``WWW-Authenticate`` challenge says what to do. ``Bearer`` (Docker Hub, ghcr,
quay...): ask the realm for a pull token, anonymously or with the credentials found in
``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``, the ``auths`` entry of the
registry; credential helpers are not run). ``Basic``: send those credentials. Plain HTTP only for
loopback registries or with ``insecure=True``. Runs in the caller's process.

Where requests go (``Registry.refusal``, checked before every request, redirects included): the
registry's own origin (scheme, host, port) always; anywhere else only over https, and only to a
host whose every address is public, or private when the registry itself is on a private address.
Loopback, link-local (cloud metadata), multicast and reserved addresses are never reached unless
they are the registry's own origin, so a registry cannot point the client at another service on
this machine or its network, by a blob redirect or by its token service's URL (the ``realm``). At
most ``MAX_REDIRECTS`` in a row; credentials go only to the registry's origin (or its https
upgrade). A name resolved once for the check and again to connect (DNS rebinding) is not held, and
behind a proxy from the environment a name this machine cannot resolve is left to the proxy.

What is read is bounded: manifests, indexes and token replies at ``IMAGE_JSON_MAX`` bytes, read no
further and parsed by ``image.parse_json`` (bounded nesting); a blob at the size its descriptor
declares (``blobs.py``), and a ``Content-Length`` promising more is refused before the body is read.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx

from ..errors import DigestMismatch, DownloadInterrupted, RegistryError
from ..limits import IMAGE_JSON_MAX
from .image import parse_json
from .reference import Reference

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[:2]
MAX_REDIRECTS = 5
RETRIES = 3
RETRY_PAUSE = 0.5
CHUNK = 1 << 20
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def docker_credentials(registry: str) -> tuple[str, str] | None:
    """(user, password) for ``registry`` from the Docker config file, if it has them inline."""
    base = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        auths = json.loads((Path(base) / "config.json").read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        return None
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == "docker.io":
        keys += ["https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io"]
    for key in keys:
        entry = auths.get(key) or auths.get(key.rstrip("/"))
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError:
                continue
            return user, password
    return None


class Registry:
    def __init__(self, ref: Reference, insecure: bool = False, timeout: float = 60.0) -> None:
        self.ref = ref
        scheme = "http" if (insecure or ref.is_local) else "https"
        self.base = f"{scheme}://{ref.api_host}/v2/{ref.repository}"
        self.origin = _origin(httpx.URL(self.base))
        self._registry_private: bool | None = None  # is the registry itself on a private address (lazily)
        self.client = httpx.Client(
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            timeout=httpx.Timeout(timeout, connect=15.0),
            event_hooks={"request": [self._check_redirect]},
        )
        self.auth: str | None = None
        self.credentials = docker_credentials(ref.registry)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- where requests may go ----------------------------------------------------------

    def refusal(self, url: httpx.URL) -> str | None:
        """Why a request to ``url`` is not made (see the module docstring), or None."""
        if _origin(url) == self.origin:
            return None
        if url.scheme != "https":
            return "not https and not the registry's own origin"
        try:
            infos = socket.getaddrinfo(url.host, url.port or 443, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            if _proxied(url):
                return None  # behind a proxy this machine may resolve nothing: the proxy resolves and judges
            return f"its host does not resolve ({exc})"
        for info in infos:
            kind = _address_kind(str(info[4][0]))
            if kind == "private" and self._private_registry():
                continue
            if kind != "public":
                return f"its host has a {kind} address ({info[4][0]})"
        return None

    def _private_registry(self) -> bool:
        if self._registry_private is None:
            host = httpx.URL(self.base).host
            try:
                kinds = {_address_kind(str(i[4][0])) for i in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
            except (OSError, UnicodeError):
                kinds = set()
            self._registry_private = kinds == {"private"}
        return self._registry_private

    def _check_redirect(self, request: httpx.Request) -> None:
        """Every request the client sends: the first of each is checked before it is built (a realm)
        or goes to the registry's origin; what is left to refuse here is a redirect."""
        why = self.refusal(request.url)
        if why is not None:
            raise RegistryError(f"{self.ref.registry}: refused to follow a redirect to {_shown(request.url)}: {why}")

    # --- requests -----------------------------------------------------------------------

    def _send(self, url: str, headers: dict[str, str], stream: bool) -> httpx.Response:
        for attempt in range(2):
            resp = self._get(url, headers, stream)
            if resp.status_code != 401 or attempt:
                return resp
            challenge = resp.headers.get("www-authenticate", "")
            resp.close()
            self._authenticate(challenge)
        raise AssertionError("unreachable")

    def _get(self, url: str, headers: dict[str, str], stream: bool) -> httpx.Response:
        """A GET, retried (it is idempotent) when the connection drops or a gateway says 502-504."""
        for attempt in range(RETRIES):
            h = dict(headers)
            if self.auth:
                h["Authorization"] = self.auth
            try:
                resp = self.client.send(self.client.build_request("GET", url, headers=h), stream=stream)
            except httpx.TransportError as exc:
                if attempt + 1 == RETRIES:
                    raise RegistryError(f"{self.ref.registry}: {type(exc).__name__}: {exc}") from None
            except httpx.HTTPError as exc:
                raise RegistryError(f"{self.ref.registry}: {type(exc).__name__}: {exc}") from None
            else:
                if resp.status_code not in (502, 503, 504) or attempt + 1 == RETRIES:
                    return resp
                resp.close()
            time.sleep(RETRY_PAUSE * 2**attempt)
        raise AssertionError("unreachable")

    def _authenticate(self, challenge: str) -> None:
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            if self.credentials is None:
                raise RegistryError(f"{self.ref.registry} wants a login: docker login {self.ref.registry}")
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            self.auth = f"Basic {token}"
            return
        if scheme != "bearer":
            raise RegistryError(f"{self.ref.registry}: unsupported auth challenge {challenge[:200]!r}")
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise RegistryError(f"{self.ref.registry}: bearer challenge without a realm")
        params.setdefault("scope", f"repository:{self.ref.repository}:pull")
        try:
            url = httpx.URL(realm)
        except httpx.InvalidURL:
            raise RegistryError(f"{self.ref.registry}: bearer challenge with a bad realm {realm[:200]!r}") from None
        why = self.refusal(url) if url.scheme in ("http", "https") else "not http(s)"
        if why is not None:
            raise RegistryError(f"{self.ref.registry}: refused its token service {_shown(url)}: {why}")
        try:
            with self.client.stream("GET", url, params=params, auth=self.credentials) as resp:
                status = resp.status_code
                reply = _read_bounded(resp, f"the reply of token service {_shown(url)}")
        except httpx.HTTPError as exc:
            raise RegistryError(f"token service {_shown(url)}: {type(exc).__name__}: {exc}") from None
        if status != 200:
            raise RegistryError(
                f"token service {_shown(url)} refused ({status}) a pull of {self.ref.repository}; "
                f"the image may be private (docker login {self.ref.registry}) or not exist"
            )
        body = parse_json(reply, f"the reply of token service {_shown(url)}", RegistryError)
        bearer = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not isinstance(bearer, str):
            raise RegistryError(f"token service {_shown(url)} answered without a token")
        self.auth = f"Bearer {bearer}"

    # --- API ----------------------------------------------------------------------------

    def manifest(self, reference: str) -> tuple[dict, str, str]:
        """(manifest, media type, digest) of a tag or digest; a pinned digest is verified."""
        resp = self._send(f"{self.base}/manifests/{reference}", {"Accept": ", ".join(MANIFEST_TYPES)}, stream=True)
        try:
            if resp.status_code == 404:
                raise RegistryError(f"{self.ref.registry}/{self.ref.repository}:{reference} not found")
            if resp.status_code != 200:
                raise RegistryError(f"manifest {reference}: HTTP {resp.status_code} from {self.ref.registry}")
            body = _read_bounded(resp, f"manifest {reference}")
        except httpx.HTTPError as exc:
            raise RegistryError(f"manifest {reference}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.close()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise DigestMismatch(f"manifest {reference}: the registry sent one hashing to {digest}")
        doc = parse_json(body, f"manifest {reference}", RegistryError)
        if not isinstance(doc, dict):
            raise RegistryError(f"manifest {reference} is not a JSON object")
        media = doc.get("mediaType") or resp.headers.get("content-type", "").split(";")[0]
        if doc.get("schemaVersion") == 1:
            raise RegistryError(f"manifest {reference} is Docker schema 1, which is not supported (push it again)")
        return doc, media, digest

    def blob(self, digest: str, size: int, offset: int = 0) -> tuple[Iterator[bytes], int]:
        """Chunks of a blob of ``size`` bytes from ``offset`` (a Range request), and the offset the
        server honoured; a ``Content-Length`` beyond ``size`` is refused before the body is read."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        resp = self._send(f"{self.base}/blobs/{digest}", headers, stream=True)
        if resp.status_code == 416 and offset:
            resp.close()
            return self.blob(digest, size, 0)
        if resp.status_code not in (200, 206):
            resp.close()
            raise RegistryError(f"blob {digest}: HTTP {resp.status_code} from {self.ref.registry}")
        start = offset if resp.status_code == 206 else 0
        announced = resp.headers.get("content-length", "")
        if announced.isdigit() and int(announced) > size - start:
            resp.close()
            raise DigestMismatch(
                f"blob {digest}: the registry announces {announced} bytes from offset {start}, "
                f"the manifest declares {size} in all; refused"
            )

        def chunks() -> Iterator[bytes]:
            try:
                yield from resp.iter_bytes(CHUNK)
            except httpx.HTTPError as exc:
                raise DownloadInterrupted(f"blob {digest}: the download broke off ({type(exc).__name__})") from None
            finally:
                resp.close()

        return chunks(), start


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host.lower(), url.port or {"http": 80, "https": 443}.get(url.scheme)


def _proxied(url: httpx.URL) -> bool:
    """Does httpx send a request for ``url`` through a proxy from the environment (``HTTPS_PROXY``...)?"""
    proxies = urllib.request.getproxies_environment()
    return bool(proxies.get(url.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(url.host)


def _address_kind(text: str) -> str:
    """public, private, or what else an address is (loopback, link-local...), IPv4 inside IPv6 as IPv4."""
    addr = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved"):
        if getattr(addr, f"is_{kind}"):
            return kind.replace("_", "-")
    if addr.is_global:
        return "public"
    return "private"


def _shown(url: httpx.URL) -> str:
    """A URL for an error line: without its query (a token service's may hold a scope, a redirect's a
    signature), cut short."""
    return str(url.copy_with(query=None, fragment=None))[:200]


def _read_bounded(resp: httpx.Response, what: str) -> bytes:
    """A streamed response's body, refused past ``IMAGE_JSON_MAX`` bytes (announced or read)."""
    announced = resp.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > IMAGE_JSON_MAX:
        raise RegistryError(f"{what} is larger than {IMAGE_JSON_MAX} bytes ({announced}); refused")
    body = bytearray()
    for chunk in resp.iter_bytes(1 << 16):
        body += chunk
        if len(body) > IMAGE_JSON_MAX:
            raise RegistryError(f"{what} is larger than {IMAGE_JSON_MAX} bytes; refused")
    return bytes(body)
