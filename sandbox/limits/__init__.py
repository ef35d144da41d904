"""Resource bounds: a module per bound, planned per sandbox, held by the kernel where it can and by
the host's watcher where it cannot.

``plan.py`` lists every bound and asks each module how it is held here (an ``Enforcement``,
``enforcement.py``); ``watch.py`` runs the checks of the bounds the watcher holds (``memory``,
``sockets``, ``disk``, ``hostfiles``, ``flight``), on what ``procs.py`` and ``proc.py`` share; the
kernel-held ones are ``rlimits``, ``pids``, ``cpus``, ``scratch`` (tmpfs and SysV IPC), ``uids`` (per
host uid counts), ``built`` (held by how the jail is built) and ``budget`` (what all sandboxes share);
``cgroups`` makes the groups.

The default bounds live here, not in ``config.py``: the CLI shows them in ``--help``, which may not load
pydantic (``tests/test_cli_imports.py``)."""

DEFAULT_MEMORY = 2 << 30  # what a laptop next to a few sandboxes survives
DEFAULT_DISK = 4 << 30
DEFAULT_INODES = 1_000_000
DEFAULT_PIDS = 512
