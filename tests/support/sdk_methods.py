"""The public methods of the e2b and e2b-code-interpreter SDKs this interpreter imports, as the rows of
``docs/e2b-compat.md`` name them (``Sandbox.create``, ``Filesystem.read``, ...). Run as a script, it
prints them as a JSON list: ``tests/test_serve_compat.py`` runs it with the previous release first on
``PYTHONPATH``. Imports only the SDKs, so it runs from any directory."""

from __future__ import annotations

import inspect
import json


def public_methods() -> set[str]:
    from e2b import Sandbox
    from e2b.sandbox_sync.commands.command import Commands
    from e2b.sandbox_sync.commands.pty import Pty
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem
    from e2b_code_interpreter import Sandbox as CodeSandbox

    def public(cls: type) -> set[str]:
        return {
            n for n, v in inspect.getmembers(cls) if not n.startswith("_") and (callable(v) or isinstance(v, property))
        }

    names = {f"Sandbox.{n}" for n in public(Sandbox)} - {
        "Sandbox.commands", "Sandbox.files", "Sandbox.pty",  # the objects below, not calls
        "Sandbox.connection_config", "Sandbox.envd_api_url", "Sandbox.envd_direct_url", "Sandbox.sandbox_domain",
        "Sandbox.sandbox_id",  # plain attributes the SDK sets from its own configuration
    }  # fmt: skip
    names |= {f"Filesystem.{n}" for n in public(Filesystem)}
    names |= {f"Commands.{n}" for n in public(Commands)} | {f"Pty.{n}" for n in public(Pty)}
    names |= {f"CodeSandbox.{n}" for n in public(CodeSandbox) - public(Sandbox)}
    return names


if __name__ == "__main__":
    print(json.dumps(sorted(public_methods())))
