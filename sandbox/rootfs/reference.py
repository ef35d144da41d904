"""Image references as users write them: ``python:3.11-slim``, ``docker.io/cdx123/llm-in-sandbox:v0.1``,
``ghcr.io/org/img@sha256:...``, ``localhost:5000/x:y``; normalised as Docker does."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import RootfsError

DOCKER_HUB = "docker.io"
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(?::[0-9]+)?$|^\[[0-9a-fA-F:]+\](?::[0-9]+)?$")


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        ref = text.strip()
        if not ref or ref != text or "://" in ref:
            raise RootfsError(f"{text!r} is not an image reference (like python:3.11-slim or ghcr.io/org/img:tag)")
        rest, digest = ref, None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST.match(digest):
                raise RootfsError(f"{text!r}: digest must be sha256: and 64 hex digits")
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost") and _HOST.match(first):
            registry, path = first, remainder
        else:
            registry, path = DOCKER_HUB, rest
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG.match(tag):
                raise RootfsError(f"{text!r}: invalid tag {tag!r}")
        if registry in ("index.docker.io", "registry-1.docker.io"):
            registry = DOCKER_HUB
        if registry == DOCKER_HUB and "/" not in path:
            path = "library/" + path
        if not _REPO.match(path):
            raise RootfsError(f"{text!r}: invalid repository name {path!r} (lowercase letters, digits, . _ - /)")
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry, path, tag, digest)

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    @property
    def api_host(self) -> str:
        return "registry-1.docker.io" if self.registry == DOCKER_HUB else self.registry

    @property
    def is_local(self) -> bool:
        """Loopback registries may speak plain HTTP without ``--insecure``."""
        if self.registry.startswith("[::1]"):
            return True
        host = self.registry.rsplit(":", 1)[0]
        return host == "localhost" or host.startswith("127.")

    @property
    def object(self) -> str:
        """What to ask the manifests endpoint for: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"
