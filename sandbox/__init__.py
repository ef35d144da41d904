"""jailbox's jail: rootless Linux sandboxes with an init inside. Knows nothing of LLMs.

Public names are imported lazily so the launcher and the in-jail init, which import the child side
of this package (``child/`` and ``floor/``), never pay for pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "AsyncSandbox",
    "CodeContext",
    "ExecResult",
    "Execution",
    "Limits",
    "Mount",
    "NetworkLogEntry",
    "NetworkPolicy",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "SeccompPolicy",
    "Secret",
    "Snapshot",
    "errors",
    "hostfs",
    "printable",
    "snapshots",
]

_LAZY = {  # public name -> the module (relative to this package) that defines it
    "AsyncSandbox": ".aio",
    "CodeContext": ".interpreter",
    "ExecResult": ".results",
    "Execution": ".interpreter",
    "Limits": ".config",
    "Mount": ".config",
    "NetworkLogEntry": ".net.proxy",
    "NetworkPolicy": ".net.policy",
    "Sandbox": ".sandbox",
    "SandboxConfig": ".config",
    "SandboxPool": ".pool",
    "SeccompPolicy": ".seccomp.policy",
    "Secret": ".net.secrets",
    "Snapshot": ".snapshots",
    "printable": ".escapes",
}

if TYPE_CHECKING:
    from . import errors, hostfs, snapshots
    from .aio import AsyncSandbox
    from .config import Limits, Mount, SandboxConfig
    from .escapes import printable
    from .interpreter import CodeContext, Execution
    from .net.policy import NetworkPolicy
    from .net.proxy import NetworkLogEntry
    from .net.secrets import Secret
    from .pool import SandboxPool
    from .results import ExecResult
    from .sandbox import Sandbox
    from .seccomp.policy import SeccompPolicy
    from .snapshots import Snapshot


def __getattr__(name: str) -> Any:
    if name in ("errors", "hostfs", "snapshots"):
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
