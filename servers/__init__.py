"""The servers beside the jail library: each a host process that holds sandboxes for its clients.

- ``e2b/``: ``jailbox serve``, the E2B API (control plane and envd), so the E2B SDKs drive jailbox.
- ``mcp.py``: ``jailbox mcp``, the Model Context Protocol server (stdio or HTTP).
- ``openenv.py``: ``jailbox openenv``, an OpenEnv environment (WebSocket episodes over ``jailbox.rl``).
- ``exec_service/``: the per-user service that keeps warm sandboxes for ``jailbox exec`` and
  ``jailbox create``; ``exec_service/quick.py`` is the console script's stdlib-only fast path.
- ``httpd.py``: the bounded HTTP/1.1 front door ``jailbox serve`` runs on; ``keys.py`` (API key
  files), ``listen.py`` (which addresses a server may listen on), ``jsonshape.py`` (JSON sized up before
  it is parsed) and ``shield.py`` (work run to its end through a cancellation) are shared by the servers.

They use the library's public face (``jailbox.sandbox``) and the small internal surface named in
``jailbox.sandbox.serving`` (``tests/test_layout.py`` and ``tests/test_exported_members.py`` pin
both). Nothing is imported here: the fast path must not pay for pydantic.
"""
