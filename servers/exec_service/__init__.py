"""Long-lived sandboxes for the shell: a per-user service that holds them (``server.py``), the
``jailbox`` side that talks to it (``client.py``), the wire protocol between them (``protocol.py``),
and the console script's stdlib-only fast path for ``jailbox exec -- CMD`` through it (``quick.py``).

Only ``cli/`` (in the commands that use it) and the console script import this.
"""
