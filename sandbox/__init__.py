"""jailbox's jail: rootless Linux sandboxes with an init inside.

Public names are imported lazily so the launcher and the in-jail init, which import child-side
modules of this package, never pay for pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "AsyncSandbox",
    "ExecResult",
    "Mount",
    "NetworkLogEntry",
    "NetworkPolicy",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "errors",
]

_LAZY = {
    "AsyncSandbox": "sandbox.aio",
    "ExecResult": "sandbox.results",
    "Mount": "sandbox.config",
    "NetworkLogEntry": "sandbox.proxy",
    "NetworkPolicy": "sandbox.netpolicy",
    "Sandbox": "sandbox.sandbox",
    "SandboxConfig": "sandbox.config",
    "SandboxPool": "sandbox.pool",
}

if TYPE_CHECKING:
    from sandbox.aio import AsyncSandbox
    from sandbox.config import Mount, SandboxConfig
    from sandbox.netpolicy import NetworkPolicy
    from sandbox.pool import SandboxPool
    from sandbox.proxy import NetworkLogEntry
    from sandbox.results import ExecResult
    from sandbox.sandbox import Sandbox


def __getattr__(name: str) -> Any:
    import importlib

    if name == "errors":
        return importlib.import_module("sandbox.errors")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
