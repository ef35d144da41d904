"""Host side of the bounds shared by every sandbox: the pids budget and the per-user kernel counters.

Runs in the host process, before each jail is built; the launcher applies what it decides
(``child/zygote.py``), the kernel holds it.

Pids: every sandbox has its own cap (``Limits.pids``), but a host has one ``kernel.pid_max`` for
everyone, so all sandboxes together get at most a share of it: ``$JAILBOX_PIDS_BUDGET``, a count
(``8000``) or a share of pid_max (``25%``), by default half. With cgroups it is ``pids.max`` of the
``jailbox`` group every sandbox's group is created in. Rootless, it is the ``RLIMIT_NPROC`` the
launcher sets before it creates the jail's user namespace: the kernel then refuses a fork inside
the jail while the calling user has that many processes, jails and host together (ucounts charge
every process of a user namespace to its creator, up the chain).

Kernel counters: inotify, fanotify and namespaces are counted per user (``/proc/sys/user/*``).
A jail's processes are charged to the host user that created its user namespace (root too), so
without a bound one jail could take them all and the host's own ``inotify_init()`` would fail.
Each jail gets a fraction of the caller's limits, set in a user namespace its own is nested in
(``child/zygote.py``): every process of the jail, whatever its uid, counts against them there, and
nothing in the jail can reach that namespace to raise them.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

BUDGET_ENV = "JAILBOX_PIDS_BUDGET"
BUDGET_DEFAULT = "50%"
USER_SYSCTLS = Path("/proc/sys/user")
COUNTER_SHARE = 8  # each sandbox may take 1/COUNTER_SHARE of the caller's limit for each counter
NAMESPACES_MAX = 128  # nested namespaces of one kind in one sandbox (the host's limits are in the tens of thousands)
COUNTERS = (
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
    "max_user_namespaces",
    "max_mnt_namespaces",
    "max_pid_namespaces",
    "max_net_namespaces",
    "max_ipc_namespaces",
    "max_uts_namespaces",
    "max_cgroup_namespaces",
    "max_time_namespaces",
)


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768  # the kernel's default


def pids_budget() -> int:
    """Processes and threads all sandboxes of this host may hold at once (``$JAILBOX_PIDS_BUDGET``)."""
    text = os.environ.get(BUDGET_ENV, "").strip() or BUDGET_DEFAULT
    total = pid_max()
    try:
        value = int(float(text[:-1]) * total / 100) if text.endswith("%") else int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= total:
        raise ConfigError(
            f"{BUDGET_ENV}={text!r}: a count of processes up to kernel.pid_max ({total}) or a share of it; "
            f"e.g. {BUDGET_ENV}=8000 or {BUDGET_ENV}=25%"
        )
    return value


def counter_limits() -> dict[str, int]:
    """name -> the limit each jail's user namespace gets: a share of what this process may use."""
    limits: dict[str, int] = {}
    for name in COUNTERS:
        try:
            own = int((USER_SYSCTLS / name).read_text())
        except (OSError, ValueError):
            continue  # an older kernel without this counter
        share = max(1, own // COUNTER_SHARE)
        limits[name] = min(share, NAMESPACES_MAX) if name.endswith("_namespaces") else share
    return limits


def describe_counters(limits: dict[str, int], userns: bool) -> str:
    """How ``Sandbox.enforcement`` states the counters' bound."""
    if not userns:
        return "not bounded: userns=False, the jail's processes count as host root's"
    inotify = f"{limits.get('max_inotify_instances', '-')}/{limits.get('max_inotify_watches', '-')}"
    return (
        f"limits of the user namespace the jail's is nested in, for all its uids together: inotify {inotify} "
        f"instances/watches, namespaces <= {NAMESPACES_MAX} each (1/{COUNTER_SHARE} of the caller's); "
        "nothing in the jail can change them"
    )
