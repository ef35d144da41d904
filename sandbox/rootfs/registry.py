"""A client of the OCI distribution API on httpx: manifests and blobs, nothing else.

Auth: on a 401 the ``WWW-Authenticate`` challenge says what to do. ``Bearer`` (Docker Hub, ghcr,
quay...): ask the realm for a pull token, anonymously or with the credentials found in
``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``, the ``auths`` entry of the
registry; credential helpers are not run). ``Basic``: send those credentials. Plain HTTP only for
loopback registries or with ``insecure=True``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from ..errors import DigestMismatch, DownloadInterrupted, RegistryError
from .reference import Reference

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[:2]
MAX_MANIFEST = 4 << 20
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
        self.client = httpx.Client(follow_redirects=True, timeout=httpx.Timeout(timeout, connect=15.0))
        self.auth: str | None = None
        self.credentials = docker_credentials(ref.registry)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            resp = self.client.get(realm, params=params, auth=self.credentials)
        except httpx.HTTPError as exc:
            raise RegistryError(f"token service {realm}: {exc}") from None
        if resp.status_code != 200:
            raise RegistryError(
                f"token service {realm} refused ({resp.status_code}) a pull of {self.ref.repository}; "
                f"the image may be private (docker login {self.ref.registry}) or not exist"
            )
        try:
            body = resp.json()
            bearer = body.get("token") or body.get("access_token")
        except ValueError:
            bearer = None
        if not isinstance(bearer, str):
            raise RegistryError(f"token service {realm} answered without a token")
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
            body = b""
            for chunk in resp.iter_bytes(1 << 16):
                body += chunk
                if len(body) > MAX_MANIFEST:
                    raise RegistryError(f"manifest {reference} is larger than {MAX_MANIFEST} bytes")
        except httpx.HTTPError as exc:
            raise RegistryError(f"manifest {reference}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.close()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise DigestMismatch(f"manifest {reference}: the registry sent one hashing to {digest}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise RegistryError(f"manifest {reference} is not JSON") from None
        if not isinstance(doc, dict):
            raise RegistryError(f"manifest {reference} is not a JSON object")
        media = doc.get("mediaType") or resp.headers.get("content-type", "").split(";")[0]
        if doc.get("schemaVersion") == 1:
            raise RegistryError(f"manifest {reference} is Docker schema 1, which is not supported (push it again)")
        return doc, media, digest

    def blob(self, digest: str, offset: int = 0) -> tuple[Iterator[bytes], int]:
        """Chunks of a blob from ``offset`` (a Range request), and the offset the server honoured."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        resp = self._send(f"{self.base}/blobs/{digest}", headers, stream=True)
        if resp.status_code == 416 and offset:
            resp.close()
            return self.blob(digest, 0)
        if resp.status_code not in (200, 206):
            resp.close()
            raise RegistryError(f"blob {digest}: HTTP {resp.status_code} from {self.ref.registry}")
        start = offset if resp.status_code == 206 else 0

        def chunks() -> Iterator[bytes]:
            try:
                yield from resp.iter_bytes(CHUNK)
            except httpx.HTTPError as exc:
                raise DownloadInterrupted(f"blob {digest}: the download broke off ({type(exc).__name__})") from None
            finally:
                resp.close()

        return chunks(), start
