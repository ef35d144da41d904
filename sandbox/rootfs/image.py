"""What an image says about how to run it (its config's Env, WorkingDir, User, Entrypoint, Cmd),
and which platform of a multi-platform index fits this host."""

from __future__ import annotations

import platform
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "ppc64le": "ppc64le", "s390x": "s390x"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
