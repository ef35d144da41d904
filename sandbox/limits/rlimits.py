"""Host side: decide how each resource limit is enforced on this host, before the jail is built.

cgroups where usable (v2 delegated, or v1 as root), else an rlimit where one fits (memory as per-process
address space, pids as per-uid process count, which a user namespace makes per-sandbox) and the host's
watcher (``watch.py``: the total memory of the jail's processes, a disk writable layer's bytes and
inodes), else nothing, said plainly. The jail's tmpfs (/tmp, /dev/shm, a tmpfs writable layer) is one
mount with a size and an inode count (``scratch``). Core dumps are always off. The bounds all
sandboxes share (the pids budget, the per-user kernel counters) are stated here too; ``budget.py``
decides them.
"""

from __future__ import annotations

import resource
import warnings
from pathlib import Path

from .. import idmap
from ..child.requests import MAX_REQUEST, MAX_WALK_ENTRIES
from ..child.spec import DEV_INODES, DEV_SIZE, PTYS
from ..config import Limits, SandboxConfig
from ..errors import LimitNotEnforced
from ..files import READ_LIMIT
from ..seccomp.policy import SeccompPolicy
from . import budget, hostfiles
from .memory import DESCRIPTOR_CHARGE, MAPPING_CHARGE, MAPPINGS_HOG
from .proc import PAGE
from .watch import QUICK_TICK, TICK

Enforcement = dict[str, str]
# TCP and UDP buffers are one count for the whole host (net.ipv4.tcp_mem, udp_mem: low, pressure,
# high, in pages, about 4.5/6/9% of memory): past the low mark the kernel shrinks every socket's
# buffers, past the high one every TCP send waits and every UDP datagram is dropped, root's too
# (DNS). A cgroup counts them against its memory limit, which can be above the high mark (750 MB
# with 8 GiB). One sandbox gets 1/INET_SHARE of the low mark, all of a cgroup v1 group 1/INET_ALL.
INET_SHARE = 8
INET_ALL = 2
IPC_MESSAGE_QUEUES = 256  # SysV message queues of a jail (at the default 16 KiB each: 4 MiB)
IPC_SEMAPHORES = "250 32000 32 128"  # kernel.sem: per set, in all, per semop call, sets (the pre-5.x defaults)


def plan(
    limits: Limits, upper: str, cgroup: str | None, pids_budget: int, counters: dict[str, int], userns: bool
) -> tuple[dict[str, int], Enforcement]:
    """(rlimits the init sets on itself at boot, limit -> how it is enforced); ``pids_budget`` and
    ``counters`` are the bounds all sandboxes share (``budget.py``)."""
    rlimits = {"RLIMIT_CORE": 0, "RLIMIT_NOFILE": min(limits.open_files, _hard(resource.RLIMIT_NOFILE))}
    how: Enforcement = {"open_files": f"rlimit RLIMIT_NOFILE={rlimits['RLIMIT_NOFILE']}", "core_dumps": "off"}
    if limits.file_size is not None:
        rlimits["RLIMIT_FSIZE"] = limits.file_size
        how["file_size"] = "rlimit RLIMIT_FSIZE"
    if limits.memory is not None:
        if cgroup:
            how["memory"] = f"{cgroup} memory (no swap beyond Limits.swap)"
        else:
            rlimits["RLIMIT_AS"] = limits.memory
            how["memory"] = (
                f"host watcher: total proportional memory of the jail's processes, sampled every {TICK * 1000:.0f} ms "
                f"(every {QUICK_TICK * 1000:.0f} ms past half the limit), "
                f"each open descriptor charged {DESCRIPTOR_CHARGE >> 10} KiB (pipe buffers, files) and each mapping "
                f"{MAPPING_CHARGE} bytes (a process with {MAPPINGS_HOG} or more: as many as its address space could "
                "hold), biggest process killed past it; rlimit RLIMIT_AS per process; memfd_create ENOSYS (no cgroup)"
            )
    else:
        how["memory"] = "unbounded: Limits.memory=None"
    inet = inet_bound(limits.memory)
    if cgroup == "cgroup v1" and limits.memory is not None:
        how["socket_buffers"] = (
            f"cgroup v1 memory.kmem.tcp.limit_in_bytes={inet} (TCP and UDP: 1/{INET_SHARE} of the host's low mark "
            f"of tcp_mem/udp_mem, at most the memory limit; all sandboxes of the group {inet_budget()}); UNIX in "
            "memory.limit_in_bytes"
        )
    else:
        counted = {
            "cgroup v2": "UNIX, TCP and UDP counted in memory.current; ",
            None: "UNIX, TCP and UDP in the watcher's memory total; " if limits.memory is not None else "",
        }.get(cgroup, "")
        how["socket_buffers"] = (
            f"{counted}host watcher: the TCP and UDP buffers of the jail's own network namespace held to {inet} "
            f"bytes (1/{INET_SHARE} of the host's low mark of tcp_mem/udp_mem, at most the memory limit), the "
            "process holding the most sockets killed past it (on the host's network: per socket only)"
        )
    if limits.pids is not None:
        if cgroup:
            how["pids"] = f"{cgroup} pids"
        elif not userns:
            how["pids"] = "not enforced: no cgroup, and without a user namespace the jail's processes are host root's"
        else:
            rlimits["RLIMIT_NPROC"] = limits.pids
            how["pids"] = "rlimit RLIMIT_NPROC: all processes of this sandbox's user namespace, every uid (no cgroup)"
    how["pids_budget"] = _budget_enforcement(pids_budget, cgroup, userns)
    how["kernel_counters"] = budget.describe_counters(counters, userns)
    if limits.cpus is not None:
        how["cpus"] = f"{cgroup} cpu quota" if cgroup else "not enforced: no usable cgroup"
    if limits.disk is not None:
        if upper == "tmpfs":
            how["disk"] = "tmpfs size of the writable layer"
        else:
            how["disk"] = (
                "host watcher: a bounded walk of the writable layer, the jail's processes killed when it grows "
                "past the limit (no RLIMIT_FSIZE: a sparse file costs only what it holds)"
            )
    else:
        how["disk"] = "unbounded: Limits.disk=None"
    if limits.inodes is not None:
        how["inodes"] = "tmpfs nr_inodes" if upper == "tmpfs" else "host watcher (with disk)"
    else:
        how["inodes"] = "unbounded: Limits.inodes=None"
    missing = {k: v for k, v in how.items() if v.startswith("not enforced")}
    if missing:
        details = "; ".join(f"{k}: {v}" for k, v in missing.items())
        warnings.warn(f"limits not enforced on this host: {details}", LimitNotEnforced, stacklevel=5)
    return rlimits, how


def scratch(config: SandboxConfig) -> tuple[int, int]:
    """(bytes, inodes) of the one tmpfs that holds the jail's /tmp, /dev/shm and a tmpfs writable
    layer. tmpfs is memory that no process holds, so it gets at most half the memory limit: the
    other half is left to commands and to the init, which a tmpfs at the whole limit would leave
    the OOM killer nothing else to take. Never more than the disk limit either."""
    limits = config.limits
    bounds = [b for b in (None if limits.memory is None else limits.memory // 2, limits.disk) if b is not None]
    if config.upper == "tmpfs":
        bounds.append(config.tmpfs_size)
    size = min(bounds) if bounds else config.tmpfs_size
    return size, limits.inodes or 0  # 0: the kernel's default count (half the host's pages)


def ipc(tmpfs_size: int) -> dict[str, str]:
    """``kernel.*`` sysctls of the jail's own IPC namespace, which its init sets before any command
    runs (``/proc/sys`` is read-only to commands after that). SysV IPC objects outlive the processes
    that made them, so their memory is one no process's pages show (and no rlimit holds), and the
    kernel's defaults allow about 16 EiB of shared memory, 32,000 message queues of 16 KiB and a
    billion semaphores. Shared memory gets what /dev/shm gets, the one tmpfs's size; message queues
    and semaphores the small counts programs use."""
    return {
        "shmmax": str(tmpfs_size),
        "shmall": str(max(1, tmpfs_size // PAGE)),
        "msgmni": str(IPC_MESSAGE_QUEUES),
        "sem": IPC_SEMAPHORES,
    }


def describe_ipc(values: dict[str, str]) -> str:
    queues, (_, semaphores, _, sets) = values["msgmni"], values["sem"].split()
    return (
        f"SysV IPC of the jail's own namespace: shared memory {values['shmmax']} bytes in all (kernel.shmall), "
        f"{queues} message queues (kernel.msgmni), {semaphores} semaphores in {sets} sets (kernel.sem); "
        "set by the init before any command runs, /proc/sys read-only"
    )


def describe_queues(memory: int | None, own_netns: bool) -> str:
    """How the queues of netlink, packet and raw sockets are held (``sockets.py``): no cgroup counts them."""
    if memory is None:
        return "unbounded: Limits.memory=None"
    if not own_netns:
        return "per socket only (its receive buffer): the jail is on the host's network"
    return (
        f"host watcher: the queues of the netlink, packet and raw sockets of the jail's own network namespace "
        f"(/proc/INIT/net), held to the memory limit ({memory} bytes; in the total without a cgroup, on their own "
        "with one, which does not count them); past it the process holding the most sockets is killed"
    )


def inet_low_mark() -> int:
    """Bytes of TCP and UDP buffers the host holds before the kernel presses them: the lower of
    tcp_mem's and udp_mem's low mark."""
    marks = []
    for name in ("tcp_mem", "udp_mem"):
        try:
            marks.append(int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[0]) * PAGE)
        except (OSError, ValueError, IndexError):
            continue
    return min(marks, default=1 << 30)


def inet_bound(memory: int | None) -> int:
    """Bytes of TCP and UDP buffers one sandbox may hold: its share of the host's low mark, and no
    more than its memory limit."""
    share = inet_low_mark() // INET_SHARE
    return share if memory is None else min(memory, share)


def inet_budget() -> int:
    """Bytes of TCP and UDP buffers all sandboxes of a cgroup v1 ``jailbox`` group may hold."""
    return inet_low_mark() // INET_ALL


def describe_host_files() -> str:
    """How ``Sandbox.enforcement`` states the bound on the host's open-file table (``hostfiles.py``)."""
    table = hostfiles.host_files()[1]
    return (
        f"host watcher: past 1/{hostfiles.FILES_ALARM} of the host's open-file table (fs.file-max={table}, one count "
        f"for all its processes but root's), a jail holding {table // hostfiles.FILES_CULPRIT} files (descriptors, and "
        "files held only by a mapping) loses every process but its init, reported as oom_killed"
    )


def describe_aio(policy: SeccompPolicy | None) -> str:
    """How ``Sandbox.enforcement`` states the bound on the host's AIO events (``seccomp/bpf.py``)."""
    if policy is not None and "io_setup" not in policy.allow:
        return (
            "io_setup is ENOSYS (seccomp): the host's AIO events (fs.aio-max-nr) are one count for every process "
            "of the host, which no namespace, cgroup or rlimit divides; SeccompPolicy(allow=('io_setup',)) gives it"
        )
    why = "seccomp=None" if policy is None else "the seccomp policy allows io_setup"
    return f"not bounded: {why}, and the host's AIO events (fs.aio-max-nr) are one count for all its processes"


def describe_jail_own(output_limit: int, proxied: bool) -> Enforcement:
    """How ``Sandbox.enforcement`` states the bounds held by how a jail is built and served: its
    devices, its init, what the host reads for it, and the ``allow`` proxy it shares."""
    described = {
        "ptys": (
            f"a devpts of its own with max={PTYS}: every devpts instance but the host's first draws on "
            "kernel.pty.max less its reserve, one count for all sandboxes and containers"
        ),
        "dev": f"/dev: a tmpfs of {DEV_SIZE} bytes, {DEV_INODES} inodes (device nodes are binds of the host's)",
        "init": (
            f"requests over {MAX_REQUEST} bytes refused by the host (ExecError) and dropped by the init, which "
            "survives; the init at the lowest oom_score_adj its namespace allows, every command at 1000"
        ),
        "output": f"{output_limit} bytes kept of each stream of an exec (its head and tail), the rest dropped as read",
        "transfers": (
            f"get() and put() keep holes (a sparse file costs what it holds); read_file() refuses a file over "
            f"{READ_LIMIT} bytes unless max_bytes says more; a listing is at most {MAX_WALK_ENTRIES} entries; the "
            "init's replies are read with a bound per message"
        ),
        "teardown": (
            "close() removes the jail's tree in the closing thread, what the jail's other ids own in a child of "
            "the launcher: no new sandbox waits for a removal"
        ),
    }
    if proxied:
        from ..net import proxy  # loaded with the first allow jail only (its import costs the fast path)

        described["proxy"] = (
            f"the allow proxy: at most {proxy.MAX_CONNECTIONS} connections for all sandboxes, "
            f"{proxy.MAX_PER_SANDBOX} for one, {proxy.RESERVED} kept for each; a tunnel idle for "
            f"{proxy.IDLE_TIMEOUT:g} s is cut, a request head must come within {proxy.HEAD_TIMEOUT:g} s"
        )
    return described


def nproc_budget(pids_budget: int, userns: bool) -> int | None:
    """The RLIMIT_NPROC the launcher sets before it creates the jail's user namespace, if it binds.
    It binds every process of the jail, whose host uids are never 0 (root's jails run as subordinate
    ids), against the count of the namespace's creator: root's too, so as root it holds all of root's
    sandboxes on the host together, whichever cgroup each caller runs in. Without a user namespace the
    jail's processes are host root's, which the kernel exempts; the pids cgroup bounds them instead."""
    return pids_budget if userns else None


def _budget_enforcement(pids_budget: int, cgroup: str | None, userns: bool) -> str:
    held = []
    if cgroup:
        held.append(f"{cgroup} pids.max={pids_budget} on the jailbox group all sandboxes are created in")
    if nproc_budget(pids_budget, userns) is not None:
        held.append(
            f"RLIMIT_NPROC={pids_budget} of the user namespace's creator: forks fail while this user has that many"
            if idmap.namespace_creator() is None
            else f"RLIMIT_NPROC={pids_budget} of the host uid every root jail's user namespace is created as: forks "
            "fail while all root's sandboxes on this host together have that many, whichever process or cgroup made "
            "them"
        )
    return "; ".join(held) or "not enforced: no pids cgroup, and without a user namespace its processes are root's"


def _hard(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20
