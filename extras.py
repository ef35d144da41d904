"""The optional parts and the extras that install them: one table, one message.

``pip install jailbox`` carries what ``jailbox exec`` and ``jailbox run`` need. Each optional part is an
extra (``serve``, ``mcp``, ``math``, ``ray``, ``secrets``, ``openenv``; ``test`` brings them all), imported only
when that part is used, and its absence is one line naming the extra and the command that installs it.
"""

from __future__ import annotations

EXTRAS: dict[str, tuple[str, str]] = {
    # module whose import fails -> (the extra, the distribution it installs, as pip names it)
    "google.protobuf": ("serve", "protobuf"),  # jailbox serve: the envd messages are protoc-generated
    "mcp": ("mcp", "mcp"),  # jailbox mcp: the official Model Context Protocol SDK
    "sympy": ("math", "sympy"),  # scorer 'math': symbolic answer equivalence
    "ray": ("ray", "ray"),  # jailbox bench --executor ray; jailbox.rl.ray_backend
    "cryptography": ("secrets", "cryptography"),  # SandboxConfig.secrets: the sandbox's CA and its certificates
    "websockets": ("openenv", "websockets"),  # jailbox openenv: the WebSocket protocol OpenEnv's clients speak
}


def missing(part: str, exc: ImportError) -> str:
    """The line for ``part`` (``serve``, ``scorer 'math'``) when ``exc`` failed to import a module of an extra:
    ``serve needs the 'serve' extra (protobuf): pip install 'jailbox[serve]'``.

    Any other failed import is raised again as it was: a missing module of the core install or of
    jailbox itself is a broken install or a bug, which the extra's command would not fix.
    """
    name = exc.name or ""
    for module, (extra, distribution) in EXTRAS.items():
        # "google" alone is missing when no google package is installed, "google.protobuf" when another one is
        if name == module or name.startswith(module + ".") or module.startswith(name + "."):
            return f"{part} needs the {extra!r} extra ({distribution}): pip install 'jailbox[{extra}]'"
    raise exc
