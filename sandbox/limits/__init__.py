"""Resource limits: rlimits planned per sandbox, and cgroups where the host lets us make them.

The default bounds live here, not in ``config.py``: the CLI shows them in ``--help``, which may not load
pydantic (``tests/test_cli_imports.py``)."""

DEFAULT_MEMORY = 2 << 30  # what a laptop next to a few sandboxes survives
DEFAULT_DISK = 4 << 30
DEFAULT_INODES = 1_000_000
DEFAULT_PIDS = 512
