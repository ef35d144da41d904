"""Host side: every bound of one jail, planned before it is built; the one place bounds are listed.

Runs in the host process, called by ``jail.py``. Each bound's module says how it holds its bound on
this host (an ``Enforcement``) and what the jail needs for it (an rlimit the init sets, a tmpfs's
size, what the watcher keeps); ``plan`` gathers them, in the order ``Sandbox.enforcement`` shows them,
and ``watched`` hands the watcher the bounds no cgroup holds. A new bound is a module beside these
and a line in ``plan``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import hostids
from ..config import SandboxConfig
from ..floor.idmap import IdMap
from . import budget, built, cpus, disk, enforcement, flight, hostfiles, memory, pids, rlimits, scratch, sockets, uids
from .disk import DiskBound
from .enforcement import Enforcement
from .memory import MemoryBound
from .procs import Procs
from .sockdiag import Sockets
from .sockets import NETLINK_ONLY, PROC_QUEUE_TABLES, SocketBound
from .watch import Watched


@dataclass(frozen=True)
class Jail:
    """What the bounds of one jail depend on, as the jail was set up so far."""

    config: SandboxConfig
    cgroup: str | None  # the kind of its cgroup ("cgroup v1", "cgroup v2"), None without one
    pids_budget: int  # processes and threads this user's sandboxes may hold: its part of the host's budget
    counters: dict[str, int]  # its share of the per-user kernel counters (``budget.claim_counters``)
    id_map: IdMap
    own_ids: bool  # host ids of its own (as root, a slot of the jails' range)
    maker: hostids.Maker | None  # the id its epoll instances are made as, if one was claimed
    made: bool  # whether its filter sends epoll_create to the init's maker
    own_netns: bool  # a network namespace of its own
    proxied: bool  # an ``allow`` jail, served by the proxy


@dataclass(frozen=True)
class Plan:
    rlimits: dict[str, int]  # what the init sets on itself at boot
    tmpfs_size: int
    tmpfs_inodes: int
    ipc: dict[str, str]  # sysctls of the jail's IPC namespace
    nproc_budget: int | None  # the RLIMIT_NPROC the launcher sets before it makes the user namespace
    enforcement: dict[str, Enforcement]  # bound -> how it is held, in the order they are shown


def plan(jail: Jail) -> Plan:
    """Every bound of ``jail``; a bound asked for that this host cannot hold is warned about."""
    cfg, limits = jail.config, jail.config.limits
    planned, records = rlimits.plan(limits)
    for_memory, by_memory = memory.plan(limits.memory, jail.cgroup)
    for_pids, by_pids = pids.plan(limits.pids, jail.cgroup, cfg.userns)
    size, inodes = scratch.tmpfs(cfg)
    ipc = scratch.ipc(size)
    records += [
        by_memory,
        sockets.plan_buffers(limits.memory, jail.cgroup),
        by_pids,
        pids.plan_budget(jail.pids_budget, jail.cgroup, cfg.userns),
        budget.plan_counters(jail.counters, cfg.userns),
        *cpus.plan(limits.cpus, jail.cgroup),
        *disk.plan(limits.disk, limits.inodes, cfg.upper),
        hostfiles.plan(),
        uids.plan_host_ids(jail.id_map, jail.own_ids, cfg.userns, jail.made),
        flight.plan(jail.id_map, jail.own_ids, cfg.userns),
        uids.plan_epoll(jail.id_map, jail.own_ids, cfg.userns, cfg.seccomp is not None, jail.maker, jail.made),
        sockets.plan_queues(limits.memory, jail.own_netns),
        *built.plan(cfg.output_limit, jail.proxied, cfg.seccomp),
        *scratch.plan(cfg, size, inodes, ipc),
    ]
    enforcement.warn_not_enforced(records)
    return Plan(
        rlimits={**planned, **for_memory, **for_pids},
        tmpfs_size=size,
        tmpfs_inodes=inodes,
        ipc=ipc,
        nproc_budget=pids.nproc_budget(jail.pids_budget, cfg.userns),
        enforcement={record.bound: record for record in records},
    )


def watched(jail: Jail, init_pid: int, upper: Path | None, diag: int) -> Watched:
    """What the watcher holds of ``jail`` (``watch.py``): every jail is watched, as the host's
    open-file table is held for all of them. ``upper`` is a disk writable layer; ``diag`` the jail's
    sock_diag socket (-1: none), which this takes, closing it if nothing needs it."""
    limits = jail.config.limits
    held_memory = limits.memory if jail.cgroup is None else None
    # netlink, packet and raw sockets' queues: no cgroup counts them, so they are watched either way
    queues = limits.memory if jail.own_netns else None
    # TCP and UDP buffers: a share of the host's one count, held by cgroup v1's kmem.tcp where there is one
    v1 = jail.cgroup == "cgroup v1" and limits.memory is not None
    inet = sockets.inet_bound(limits.memory) if jail.own_netns and not v1 else None
    if held_memory is None and inet is None and diag >= 0:  # cgroup v1 counts UNIX, TCP and UDP socket memory
        os.close(diag)
        diag = -1
    disk_bound = limits.disk is not None or limits.inodes is not None
    return Watched(
        Procs(init_pid),
        memory=None if held_memory is None else MemoryBound(held_memory),
        disk=DiskBound(upper, limits.disk, limits.inodes) if upper is not None and disk_bound else None,
        sockets=None
        if diag < 0 and queues is None and inet is None
        else SocketBound(
            None if diag < 0 else Sockets(diag),
            held_memory,
            queues=queues,
            inet=inet,
            tables=PROC_QUEUE_TABLES if "NET_RAW" in jail.config.capabilities() else NETLINK_ONLY,
        ),
        flight=flight.probed_ids(jail.id_map, jail.own_ids, jail.config.userns),
    )
