"""Host side: the counts the kernel keeps per host uid, and whose uid a jail's are.

Runs in the host process, as a jail is planned (``plan.py``). Descriptors in flight, pipe buffers past
the user's soft limit and epoll watches count against a host uid, not a namespace or a cgroup, so
whoever else holds the jail's root's uid shares those counts (``host_ids``). Epoll instances are made
by the init's maker as an id no other live jail's maker has (``child/epoll.py``), so the jail's
watches count against that id alone (``epoll``).
"""

from __future__ import annotations

import os

from .. import hostids
from ..floor.idmap import IdMap
from .enforcement import Enforcement, Verdict, held


def plan_host_ids(id_map: IdMap, own: bool, userns: bool, epoll_made: bool) -> Enforcement:
    """Whose host uid the jail's root is (``own``: ids of its own): what the kernel counts per host
    uid (descriptors in flight, pipe buffers past the user's soft limit, epoll watches unless
    ``epoll_made`` by the maker) is shared with whoever else it is."""
    uid = id_map.host_root()[0]
    counted = "descriptors in flight and pipe buffers are counted per host uid"
    if not epoll_made:
        counted = f"epoll watches, {counted}"
    if not userns:
        how = f"no user namespace: the jail's root is host root; {counted}, root's unbounded"
    elif own:
        how = f"its own: host uid {uid} and the ids after it, no other jail's; {counted}, so per jail"
    elif os.getuid() == 0:
        how = (
            f"shared: host uid {uid} and the ids after it, every root jail's that has no range of its own "
            f"(a filesystem without idmapped mounts, a kernel before 6.3, {hostids.RANGE_ENV} set, no "
            f"{hostids.SLOTS} for the locks, or all {hostids.POOL_SLOTS} ranges in use); {counted}, so with those jails"
        )
    else:
        how = f"yours: the jail's root is host uid {uid}; {counted}, so with your own processes"
    return held("host_ids", how)


def plan_epoll(
    id_map: IdMap, own: bool, userns: bool, seccomp: bool, claimed: hostids.Maker | None, made: bool
) -> Enforcement:
    """Whose count the jail's epoll watches take: the maker's (``claimed``, and ``made`` by the
    filter), else each id's own."""
    limit = _epoll_limit()
    if claimed is not None and made:
        if own:
            whose = "this jail's own"
        elif claimed.own:
            whose = f"no other live jail's maker's: a slot of {hostids.MAKER_DIR} in the state directory"
        else:
            whose = (
                f"shared with other jails: all {hostids.MAKER_SLOTS} slots in the state directory held, "
                "or no place there"
            )
        return held(
            "epoll",
            f"held: every epoll instance of the jail is made by the init's maker as jail id {claimed.id}, "
            f"host uid {claimed.host} ({whose}), so the jail's watches together stay within its "
            f"fs.epoll.max_user_watches ({limit}), and never count against its root's",
        )
    if not userns:
        why = "no user namespace"
    elif not seccomp:
        why = "seccomp is off, and with it the init's listener"
    elif claimed is None:
        why = (
            f"Linux {os.uname().release} is older than 5.14"
            if not hostids.kernel_at_least(hostids.EPOLL_KERNEL)
            else "the jail maps no id but its root (idmap='single', or rootless without a subordinate range)"
        )
    else:
        why = "the seccomp policy leaves the init no listener, or refuses what the maker calls"
    root = id_map.host_root()[0]
    return not_held_epoll(
        f"{why}; each id's watches count against its host uid (the root's: {root}), up to {limit} each"
    )


def not_held_epoll(why: str) -> Enforcement:
    return Enforcement("epoll", Verdict.NOT_HELD, why)


def _epoll_limit() -> str:
    """The host's ``fs.epoll.max_user_watches``, as read (or why not)."""
    try:
        with open("/proc/sys/fs/epoll/max_user_watches") as f:
            return f.read(64).strip() or "unknown"
    except OSError:
        return "unknown"
