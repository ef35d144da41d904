"""What an image says about how to run it (its config's Env, WorkingDir, User, Entrypoint, Cmd),
which platform of a multi-platform index fits this host, and how its JSON documents are read
(``parse_json``: bounded in size and nesting before the parser sees them). Runs in the caller's
process (``pull``, ``import``)."""

from __future__ import annotations

import json
import platform
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import RootfsError
from ..limits import IMAGE_JSON_DEPTH, IMAGE_JSON_ITEMS, IMAGE_JSON_MAX

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "ppc64le": "ppc64le", "s390x": "s390x"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def json_values(body: bytes, strings_blanked: bool = True) -> int:
    """About how many values a JSON text holds (what parsing it builds), counted without parsing: its
    commas and containers outside strings. ``strings_blanked=False`` blanks them first."""
    bare = body if strings_blanked else _STRING.sub(b"", body)
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def parse_json(body: bytes, what: str, error: type[RootfsError] = RootfsError) -> Any:
    """``body`` parsed, if at most ``IMAGE_JSON_MAX`` bytes of at most ``IMAGE_JSON_ITEMS`` values nested
    at most ``IMAGE_JSON_DEPTH`` deep; else ``error`` in one line naming ``what``. Both are measured
    before parsing, without recursion, on the text with its strings blanked: values by their commas
    and containers, depth by peeling the innermost ``[]``/``{}`` pairs one level a round. (A 4 MiB
    list of empty lists made the parser hold 338 MB; within these bounds a parse costs tens.)"""
    if len(body) > IMAGE_JSON_MAX:
        raise error(f"{what} is larger than {IMAGE_JSON_MAX} bytes ({len(body)}); refused")
    bare = _STRING.sub(b"", body)
    items = json_values(bare)
    if items > IMAGE_JSON_ITEMS:
        raise error(f"{what} holds more than {IMAGE_JSON_ITEMS} values ({items}); refused")
    brackets = _NOT_BRACKET.sub(b"", bare)
    for _ in range(IMAGE_JSON_DEPTH):
        peeled = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if peeled == brackets:  # balanced (empty), or malformed: the parser says how
            break
        brackets = peeled
    else:
        if brackets:
            raise error(f"{what} nests deeper than {IMAGE_JSON_DEPTH} levels; refused")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} is not JSON ({str(exc)[:200]})") from None


class ImageConfig(BaseModel):
    """Kept with every stored root filesystem; sandboxes on it start from these."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = Field(default_factory=dict, description="added under the sandbox's own env")
    workdir: str | None = Field(None, description="default working directory when the sandbox sets none")
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    @classmethod
    def from_oci(cls, blob: dict) -> ImageConfig:
        """From an OCI / Docker image config JSON (its ``config`` object)."""
        cfg = blob.get("config") or {}
        if not isinstance(cfg, dict):
            cfg = {}
        env: dict[str, str] = {}
        for item in cfg.get("Env") or []:
            if isinstance(item, str) and "=" in item:
                key, _, value = item.partition("=")
                if _ENV_NAME.match(key) and "\0" not in value:
                    env[key] = value
        workdir = cfg.get("WorkingDir")
        return cls(
            env=env,
            workdir=workdir if isinstance(workdir, str) and workdir.startswith("/") else None,
            user=cfg.get("User") or None,
            entrypoint=_strings(cfg.get("Entrypoint")),
            cmd=_strings(cfg.get("Cmd")),
        )


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def host_platform() -> str:
    """``linux/amd64``, ``linux/arm64``... as OCI indexes spell it."""
    machine = platform.machine()
    return f"linux/{_ARCH.get(machine, machine)}"


def matches(entry_platform: dict, wanted: str) -> bool:
    """Does an index entry's ``platform`` object match ``os/arch[/variant]``?"""
    parts = wanted.split("/")
    if entry_platform.get("os") != parts[0] or entry_platform.get("architecture") != parts[1]:
        return False
    if len(parts) > 2:
        return entry_platform.get("variant") == parts[2]
    return True
