"""Long-lived sandboxes for the shell: a per-user service that holds them (``server.py``), the
``jailbox`` side that talks to it (``client.py``) and the wire protocol between them (``protocol.py``).

Only ``cli.py`` imports this, and only in the commands that use it.
"""
