"""What the servers beside the library (``jailbox.servers``) use of the jail beyond its public face.

Imported by host processes only. Each name is a piece a server needs that a user of the library does
not: streaming a command's output as it comes (``ExecRun``, ``TtyCommand``, ``run_sync``), finding a
stored tree by the name a client sends (``Store``, ``stored``), checking a client's paths and
environment as ``SandboxConfig`` does (``jail_path``, ``check_env``), and telling a live process from
a reused pid in the per-user state directory (``state_dir``, ``start_ticks``), holding a client's
checkpoints by type and telling a snapshot's id from its name before asking the store
(``Checkpoint``, ``SNAPSHOT_ID``, ``SNAPSHOT_NAME``), and turning an E2B caller's network rules into a
policy within the operator's, bounded as every policy is (``Rules``, ``Ports``, ``IPNetwork``,
``normalize_host``, ``lan_networks``, ``first_error``, ``NETWORK_RULES_MAX``, ``NETWORK_RULE_MAX``).
The servers import
``jailbox.sandbox``, ``jailbox.sandbox.errors``, this module, and ``jailbox.sandbox.floor.wire`` (the
stdlib-only frame format of the console script's fast path) and nothing else of the jail
(``tests/test_layout.py`` pins that; ``tests/test_exported_members.py`` this list).
"""

from __future__ import annotations

from .config import SNAPSHOT_ID, SNAPSHOT_NAME, check_env, jail_path
from .execution import ExecRun, TtyCommand, run_sync
from .floor.procstat import start_ticks
from .layers import Checkpoint
from .limits import NETWORK_RULE_MAX, NETWORK_RULES_MAX
from .net.policy import IPNetwork, Ports, Rules, first_error, lan_networks, normalize_host
from .rootfs.resolve import stored
from .rootfs.store import Store
from .state import state_dir

__all__ = [
    "NETWORK_RULES_MAX",
    "NETWORK_RULE_MAX",
    "SNAPSHOT_ID",
    "SNAPSHOT_NAME",
    "Checkpoint",
    "ExecRun",
    "IPNetwork",
    "Ports",
    "Rules",
    "Store",
    "TtyCommand",
    "check_env",
    "first_error",
    "jail_path",
    "lan_networks",
    "normalize_host",
    "run_sync",
    "start_ticks",
    "state_dir",
    "stored",
]
