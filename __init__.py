"""jailbox: rootless Linux sandboxes for LLM agents and untrusted code, without Docker.

The installed package: this file is ``jailbox/__init__.py``, ``sandbox/`` is ``jailbox.sandbox`` (the
jail), ``agent/`` is ``jailbox.agent`` (the agent loop, over the jail's public API) and ``cli/`` is
``jailbox.cli``. The names below are the public face, pinned by ``tests/test_exported_members.py``.

They are imported lazily: the launcher and the jail's init import ``jailbox.sandbox.child`` with
``python -I -S`` and must not pay for pydantic. Nothing else public lives here (no
``from __future__`` or ``typing`` names), so ``dir(jailbox)`` shows exactly the public face.
"""

import typing as _typing

__version__ = "0.1.0"

__all__ = [
    "AsyncSandbox",
    "ExecResult",
    "Limits",
    "Mount",
    "NetworkPolicy",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "SeccompPolicy",
    "Secret",
    "Snapshot",
]

if _typing.TYPE_CHECKING:
    from .sandbox import (
        AsyncSandbox,
        ExecResult,
        Limits,
        Mount,
        NetworkPolicy,
        Sandbox,
        SandboxConfig,
        SandboxPool,
        SeccompPolicy,
        Secret,
        Snapshot,
    )
    from .sandbox import snapshots as snapshots


def __getattr__(name: str) -> _typing.Any:
    if name in __all__ or name == "snapshots":  # the classes; the module listing and removing snapshots
        from . import sandbox

        return getattr(sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "snapshots"})
