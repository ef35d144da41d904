"""Resource bounds: a module per bound, planned per sandbox, held by the kernel where it can and by
the host's watcher where it cannot.

``plan.py`` lists every bound and asks each module how it is held here (an ``Enforcement``,
``enforcement.py``); ``watch.py`` runs the checks of the bounds the watcher holds (``memory``,
``sockets``, ``disk``, ``hostfiles``, ``flight``), on what ``procs.py`` and ``proc.py`` share; the
kernel-held ones are ``rlimits``, ``pids``, ``cpus``, ``scratch`` (tmpfs and SysV IPC), ``uids`` (per
host uid counts), ``built`` (held by how the jail is built) and ``budget`` (what all sandboxes share);
``cgroups`` makes the groups (``cgroupfs``: the hierarchies and removal; ``reap``: what dead host
processes left).

The default bounds live here, not in ``config.py``: the CLI shows them in ``--help``, which may not load
pydantic (``tests/test_cli_imports.py``)."""

DEFAULT_MEMORY = 2 << 30  # what a laptop next to a few sandboxes survives
DEFAULT_DISK = 4 << 30
DEFAULT_INODES = 1_000_000
DEFAULT_PIDS = 512

# What a pulled or imported image may make the host hold (``sandbox/rootfs/``): a registry or an archive chose
# every size it declares, so each is judged against these before a byte is read or written.
IMAGE_BLOB_MAX = 16 << 30  # one blob as downloaded or copied out of an archive (a compressed layer)
IMAGE_BLOBS_MAX = 64 << 30  # all blobs of one image together
IMAGE_LAYERS_MAX = 500  # layers of one image: Docker's overlay2 driver stacks at most 128
IMAGE_ARCHIVE_MEMBERS_MAX = 20_000  # files of a docker-save or OCI archive (a few a layer) copied out to import it
IMAGE_JSON_MAX = 4 << 20  # a manifest, index, image config or token reply: what the OCI spec has registries take
IMAGE_JSON_DEPTH = 64  # nesting of those documents; real ones stay under 10
IMAGE_JSON_ITEMS = 100_000  # values in one (a config's history has one object a layer): what parsing may build
IMAGE_MEMBER_MAX = 64 << 30  # one file unpacked from a layer
IMAGE_TOTAL_MAX = 1 << 40  # everything unpacked from one image
IMAGE_ENTRIES_MAX = 4_000_000  # members unpacked from one image

# What the code interpreter's gateway (``sandbox/interpreter.py``), which shares the jail with the code it
# runs, may make the host hold or wait for.
INTERPRETER_LINE_MAX = 32 << 20  # one line it sends: a result carries its images base64-encoded
INTERPRETER_LINE_VALUES = 1_000_000  # JSON values in one line (a data frame's cells): what parsing it builds
INTERPRETER_EXECUTION_MAX = 64 << 20  # all lines of one execution; past it the kernel is interrupted
INTERPRETER_RESULTS_MAX = 1_000  # results (displays) of one execution, likewise
INTERPRETER_START = 60.0  # seconds from starting the gateway to its default kernel answering
INTERPRETER_WAIT = 60.0  # seconds for any other answer (a context made, restarted, removed, listed)

# What one network policy may list (``sandbox/net/policy.py``), however it arrives (a flag, the library, an
# E2B caller's ``allowOut``/``denyOut``): every rule is checked on each request the proxy decides, so the lists
# are bounded in length and each rule in size before any is parsed.
NETWORK_RULES_MAX = 256  # allow rules, and deny rules, of one policy
NETWORK_RULE_MAX = 512  # characters of one rule: a 253-character name, '*.' and a port list fit

# What a connection to a port on a jail's loopback (``sandbox/ports.py``, ``Sandbox.connect_port``) may make
# the host wait for: the init hands back a socket whose connection may still be under way.
PORT_CONNECT_WAIT = 10.0  # seconds for it to be connected (a listener whose backlog is full holds it)
