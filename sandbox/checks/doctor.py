"""``jailbox doctor``: what this host allows, and the exact fix for what it refuses.

Each probe returns a ``Probe`` (ok / degraded / failing, what was seen, the fix). Probes that read
kernel settings take their paths from a ``Host`` so tests can simulate a failing host without
changing this one; probes that try a kernel feature do it in a forked child.
"""

from __future__ import annotations

import getpass
import os
import platform
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from .. import hostids
from .. import state as state_dirs
from ..child.spec import DEV_INODES, DEV_SIZE, PTYS
from ..errors import ConfigError
from ..floor import linux as L
from ..hostids import RANGE_ENV, ROOT_ENTRY, ROOT_RANGE, subordinate_range, subuid_fix
from ..limits import budget, cgroupfs, cgroups, flight, hostfiles, memory, sockets

Status = Literal["ok", "degraded", "failing"]


class Probe(BaseModel):
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Host:
    """Where the probes look; tests point these at a fake tree to simulate another host."""

    proc_sys: Path = Path("/proc/sys")
    subuid: Path = Path("/etc/subuid")
    subgid: Path = Path("/etc/subgid")
    path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    tun: Path = Path("/dev/net/tun")
    uid: int = field(default_factory=os.getuid)
    user: str = field(default_factory=getpass.getuser)

    def sysctl(self, name: str) -> str | None:
        try:
            return (self.proc_sys / name).read_text().strip()
        except OSError:
            return None


def userns_settings(host: Host) -> Probe:
    """The sysctls that decide whether an unprivileged user may create user namespaces."""
    if host.sysctl("kernel/unprivileged_userns_clone") == "0" and host.uid != 0:
        return Probe(
            name="user namespaces",
            status="failing",
            detail="kernel.unprivileged_userns_clone=0",
            fix="sudo sysctl -w kernel.unprivileged_userns_clone=1",
        )
    if host.sysctl("kernel/apparmor_restrict_unprivileged_userns") == "1" and host.uid != 0:
        return Probe(
            name="user namespaces",
            status="failing",
            detail="AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)",
            fix="sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (persist in /etc/sysctl.d/), "
            "or an AppArmor profile granting 'userns,' to this Python",
        )
    limit = host.sysctl("user/max_user_namespaces")
    if limit is not None and limit.isdigit() and int(limit) < 64:
        return Probe(
            name="user namespaces",
            status="failing",
            detail=f"user.max_user_namespaces={limit}",
            fix="sudo sysctl -w user.max_user_namespaces=28633",
        )
    return Probe(name="user namespaces", status="ok", detail=f"allowed (user.max_user_namespaces={limit})")


def _in_child(body: Callable[[], None]) -> str | None:
    """Run ``body`` in a forked child; None if it succeeded, else what it reported."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            body()
            os._exit(0)
        except BaseException as exc:
            os.write(w, str(exc).encode()[:500])
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else message or "failed"


def _enter_userns() -> None:
    uid, gid = os.getuid(), os.getgid()
    L.unshare(L.CLONE_NEWUSER | L.CLONE_NEWNS)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def userns_live() -> Probe:
    error = _in_child(_enter_userns)
    if error:
        return Probe(
            name="user namespace (live)",
            status="failing",
            detail=error,
            fix="see the 'user namespaces' line; inside a container, run it with --security-opt "
            "seccomp=unconfined or on the host",
        )
    return Probe(name="user namespace (live)", status="ok", detail="created one and mapped this user to root")


def overlay_in_userns(userns: Probe) -> Probe:
    def body() -> None:
        _enter_userns()
        L.mount("tmpfs", "/tmp", "tmpfs", 0)
        for d in ("l", "u", "w", "m"):
            os.mkdir(f"/tmp/{d}")
        L.mount("overlay", "/tmp/m", "overlay", 0, "lowerdir=/tmp/l,upperdir=/tmp/u,workdir=/tmp/w,userxattr")

    if userns.status != "ok":
        return Probe(
            name="overlayfs in a user namespace",
            status="failing",
            detail="not testable without a user namespace",
            fix="fix the user namespace line first",
        )
    error = _in_child(body)
    if error:
        return Probe(
            name="overlayfs in a user namespace",
            status="failing",
            detail=error,
            fix=f"needs Linux >= 5.11 (this is {platform.release()})",
        )
    return Probe(name="overlayfs in a user namespace", status="ok", detail="mounted one")


def _range_text(path: Path, host: Host) -> str | None:
    found = subordinate_range(path, host.uid, host.user)
    return None if found is None else f"{found[0]}+{found[1]}"


def id_ranges(host: Host) -> Probe:
    if host.uid == 0:
        return root_range(host)
    tool = shutil.which("newuidmap", path=host.path)
    fix = f"sudo apt-get install uidmap && {subuid_fix(host.user, (host.subuid, host.subgid))}"
    if tool is None or not os.stat(tool).st_mode & stat.S_ISUID:
        return Probe(
            name="id ranges",
            status="degraded",
            fix=fix,
            detail="newuidmap missing or not setuid: one id only, so apt and pip cannot switch users",
        )
    uids, gids = _range_text(host.subuid, host), _range_text(host.subgid, host)
    if not uids or not gids:
        return Probe(
            name="id ranges",
            status="degraded",
            fix=fix,
            detail=f"no range for {host.user} in {host.subuid} / {host.subgid}: one id only",
        )
    return Probe(name="id ranges", status="ok", detail=f"subuids {uids}, subgids {gids} via {tool}")


def root_range(host: Host) -> Probe:
    """Root's jails map the ``jailbox`` subordinate range (``sandbox/hostids.py``); it is allocated
    on the first jail, so here it is only looked up."""
    name = "id ranges"
    if os.environ.get(RANGE_ENV) is not None:
        try:
            uid, gid = hostids.root_range()
        except ConfigError as exc:
            return Probe(name=name, status="failing", detail=str(exc), fix=f"unset {RANGE_ENV} or correct it")
        return Probe(name=name, status="ok", detail=f"uids {uid}+{ROOT_RANGE}, gids {gid}+{ROOT_RANGE} ({RANGE_ENV})")
    uids = subordinate_range(host.subuid, -1, ROOT_ENTRY)
    gids = subordinate_range(host.subgid, -1, ROOT_ENTRY)
    if uids and gids:
        pool = [subordinate_range(path, -1, hostids.POOL_ENTRY) for path in (host.subuid, host.subgid)]
        try:  # as each jail checks: another entry with ids inside them would share the jails' files
            hostids.check_given(str(host.subuid), str(host.subgid), ROOT_ENTRY, ROOT_RANGE, (uids[0], gids[0]))
            if pool[0] and pool[1]:
                first = (pool[0][0], pool[1][0])
                hostids.check_given(str(host.subuid), str(host.subgid), hostids.POOL_ENTRY, pool[0][1], first)
        except ConfigError as exc:
            message = str(exc)
            return Probe(name=name, status="failing", detail=message.split("; fix: ")[0],
                         fix=message.split("; fix: ")[-1])  # fmt: skip
        return Probe(
            name=name,
            status="ok",
            detail=f"uids {uids[0]}+{uids[1]}, gids {gids[0]}+{gids[1]} ({ROOT_ENTRY!r} in {host.subuid}); "
            + _own_ids(host),
        )
    if all(os.access(p if p.exists() else p.parent, os.W_OK) for p in (host.subuid, host.subgid)):
        return Probe(
            name=name,
            status="ok",
            detail=f"no {ROOT_ENTRY!r} entry yet: the first jail adds one to {host.subuid} and {host.subgid}",
        )
    return Probe(
        name=name,
        status="failing",
        detail=f"no {ROOT_ENTRY!r} entry in {host.subuid} / {host.subgid}, and they cannot be written",
        fix=f"add '{ROOT_ENTRY}:1000000:{ROOT_RANGE}' (any free range) to both, or set "
        f"{RANGE_ENV}=1000000:{ROOT_RANGE}",
    )


def _own_ids(host: Host) -> str:
    """Whether each root jail gets host ids of its own over the store and state directories."""
    from ..rootfs.store import cache_dir

    refused = hostids.own_ids_refused([str(_existing(cache_dir())), str(_existing(state_dirs.state_dir()))])
    if refused is None:
        return f"each jail: host ids of its own, one of {hostids.POOL_SLOTS} ranges of {hostids.POOL_ENTRY!r}"
    return f"jails share that range ({refused}), and with it the counts the kernel keeps per host uid"


def _existing(path: Path) -> Path:
    """``path``, or its nearest existing parent (what it will be made on)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def seccomp_notify() -> Probe:
    from ..seccomp import bpf
    from ..seccomp.policy import SeccompPolicy

    program = bpf.compile_policy(SeccompPolicy(), notify=True)

    def body() -> None:
        L.prctl(L.PR_SET_NO_NEW_PRIVS, 1)
        L.install_seccomp(program, listener=True)

    error = _in_child(body)
    if error and "Device or resource busy" in error:
        return Probe(
            name="seccomp user notification",
            status="degraded",
            detail="this process already runs under a seccomp supervisor with a listener (a nested sandbox)",
            fix="run jailbox outside that sandbox to get refused syscalls named; they are refused either way",
        )
    if error:
        return Probe(
            name="seccomp user notification",
            status="degraded",
            detail=error,
            fix="needs Linux >= 5.0; refused syscalls are then refused but not named",
        )
    return Probe(name="seccomp user notification", status="ok", detail="filter and listener installed")


def cgroup(host: Host) -> Probe:
    if cgroupfs.v2_mounted():
        parent, how = cgroups.v2_parent()
        if parent is not None:
            return Probe(name="cgroups", status="ok", detail=f"v2, {how}")
        return Probe(
            name="cgroups",
            status="degraded",
            detail=f"v2, {how}",
            fix="systemd-run --user --scope -p Delegate=yes <your command>, or set JAILBOX_CGROUP_PARENT "
            "to a cgroup delegated to you",
        )
    if cgroups.v1_usable():
        return Probe(name="cgroups", status="ok", detail="v1 memory, pids and cpu hierarchies (root)")
    if host.uid == 0:
        return Probe(
            name="cgroups",
            status="degraded",
            detail="no usable memory, pids and cpu hierarchy: memory via the host watcher and RLIMIT_AS per "
            "process, pids via RLIMIT_NPROC of each jail's user namespace (userns=False: not enforced), cpus not "
            "enforced",
            fix="mount the cgroup v1 memory, pids and cpu hierarchies, or use a host with cgroup v2",
        )
    return Probe(
        name="cgroups",
        status="degraded",
        detail="v1 or hybrid and not root: memory via the host watcher and RLIMIT_AS per process, pids via "
        "RLIMIT_NPROC, cpus not enforced",
        fix="run as root, or use a host with cgroup v2 and systemd user delegation",
    )


def bounds(cgroup_probe: Probe) -> Probe:
    """Which memory and disk bounds hold on this host, and how (``Sandbox.enforcement`` per sandbox)."""
    disk = (
        "disk layer: host watcher (bytes, inodes); tmpfs: one per jail, sized and inode-capped; "
        f"/dev: {DEV_SIZE >> 10} KiB, {DEV_INODES} inodes; ptys: {PTYS} per jail (devpts max=)"
    )
    if cgroup_probe.status == "ok":
        kind = "v2" if cgroupfs.v2_mounted() else "v1"
        return Probe(
            name="memory and disk bounds",
            status="ok",
            detail=f"memory and socket buffers: cgroup {kind} (the total, kernel-held); {disk}",
        )
    return Probe(
        name="memory and disk bounds",
        status="degraded",
        detail="memory: host watcher over the total (reactive, sampled) and RLIMIT_AS per process; socket buffers: "
        f"in that total in a jail's own network namespace (TCP/UDP queues, UNIX sockets), else per socket; "
        f"descriptors: {_descriptor_charge()}; mappings: {memory.MAPPING_CHARGE} bytes each in that total; "
        f"memfd_create: ENOSYS; {disk}",
        fix=cgroup_probe.fix,
    )


def _descriptor_charge() -> str:
    """Whether this kernel gives the watcher a process's descriptor count in one call (Linux 6.2)."""
    if os.stat("/proc/self/fd").st_size > 0:
        return f"{memory.DESCRIPTOR_CHARGE >> 10} KiB each in that total (pipe buffers, files)"
    return "not charged (this kernel gives /proc/PID/fd no size: Linux 6.2 or later does)"


def _per_uid_counts(uid: int) -> str:
    """How the counts the kernel keeps per host uid are held: epoll watches (made by each jail's
    maker, ``child/epoll.py``) and descriptors in flight (by the jail's root's uid)."""
    if not hostids.kernel_at_least(hostids.EPOLL_KERNEL):
        epoll = f"epoll watches: not bounded (Linux {os.uname().release} is older than 5.14)"
    elif uid == 0 or hostids.full_range_available():
        epoll = "epoll watches: made by each jail's maker, as a uid no other live jail's maker has"
    else:
        epoll = "epoll watches: not bounded (no subordinate range: a jail maps no id but its root, which is you)"
    if not hostids.kernel_at_least(flight.FDINFO_KERNEL):
        in_flight = f"descriptors in flight: not bounded (Linux {os.uname().release} is older than 5.6)"
    else:
        own = " (per jail where root's jails have host ids of their own)" if uid == 0 else ""
        in_flight = (
            f"descriptors in flight: past {flight.MARK} for a jail root's host uid (a probe's), the jail showing "
            f"the most loses its commands{own}"
        )
    return f"{epoll}; {in_flight}"


def shared_bounds(host: Host) -> Probe:
    """The bounds all sandboxes share: the pids budget and the per-user kernel counters."""
    name = "pids budget and kernel counters"
    try:
        pids = budget.pids_budget()
    except ConfigError as exc:
        return Probe(name=name, status="failing", detail=str(exc), fix=f"unset {budget.BUDGET_ENV} or fix its value")
    missing = [c for c in ("max_inotify_instances", "max_user_namespaces") if host.sysctl(f"user/{c}") is None]
    if missing:
        return Probe(
            name=name,
            status="degraded",
            detail=f"no /proc/sys/user/{missing[0]}: a jail's inotify and namespace counts are not bounded",
            fix="Linux 4.11 or later",
        )
    detail = (
        f"pids: {budget.describe_share(pids, host.uid)}; that budget is out of the host's {budget.pid_max()} (the "
        f"lower of kernel.pid_max {host.sysctl('kernel/pid_max')} and kernel.threads-max "
        f"{host.sysctl('kernel/threads-max')}); "
        f"each takes at most 1/{budget.SANDBOX_SHARE} of the user's inotify and fanotify counts (all together "
        f"1/{budget.USER_SHARE}) and 1/{budget.COUNTER_SHARE} of its namespace counts; pending signals, message-queue "
        "bytes and locked shm: a share of the user's rlimits (user namespace caps, Linux 5.14 or later); "
        "SysV IPC: bounded in each jail's own namespace; "
        f"TCP and UDP buffers: {sockets.inet_bound(None)} bytes each (1/{sockets.INET_SHARE} of the host's low mark); "
        f"open files: the watcher acts past 1/{hostfiles.FILES_ALARM} of fs.file-max; AIO: io_setup ENOSYS; "
        + _per_uid_counts(host.uid)
    )
    if host.uid == 0 and not cgroups.v1_usable() and not (cgroupfs.v2_mounted() and cgroups.v2_parent()[0]):
        held = f"{detail}; no pids cgroup: the budget is not held"
        return Probe(name=name, status="degraded", detail=held, fix="mount the cgroup v1 pids hierarchy, or cgroup v2")
    if host.uid != 0 and str(host.uid) not in budget.accounts():
        return Probe(
            name=name,
            status="degraded",
            detail=f"{detail}; {host.user} has neither, so the other users do not count it: its sandboxes' part "
            "comes on top of the budget",
            fix=subuid_fix(host.user, (host.subuid, host.subgid)),
        )
    return Probe(name=name, status="ok", detail=detail)


def slirp4netns(host: Host) -> Probe:
    tool = shutil.which("slirp4netns", path=host.path)
    if tool is None:
        return Probe(
            name="slirp4netns",
            status="degraded",
            detail="not installed: no 'full' network mode",
            fix="sudo apt-get install slirp4netns",
        )
    if not os.access(host.tun, os.R_OK | os.W_OK):
        return Probe(
            name="slirp4netns",
            status="degraded",
            detail=f"{tool}, but this user cannot open {host.tun}: no 'full' network mode",
            fix=f"sudo chmod 0666 {host.tun}  (Debian's udev default)",
        )
    return Probe(name="slirp4netns", status="ok", detail=tool)


def rootfs_build(host: Host) -> Probe:
    """``jailbox rootfs build`` needs mmdebstrap, and rootless its ``--mode=unshare`` needs an id range."""
    tool = shutil.which("mmdebstrap", path=host.path)
    if tool is None:
        return Probe(
            name="rootfs build",
            status="degraded",
            detail="mmdebstrap not installed: no `jailbox rootfs build` (pull and import still work)",
            fix="sudo apt-get install mmdebstrap",
        )
    if host.uid != 0 and (_range_text(host.subuid, host) is None or _range_text(host.subgid, host) is None):
        return Probe(
            name="rootfs build",
            status="degraded",
            detail=f"{tool}, but its rootless mode needs a subordinate id range for {host.user}",
            fix=subuid_fix(host.user, (host.subuid, host.subgid)),
        )
    mode = "root" if host.uid == 0 else "unshare"
    return Probe(name="rootfs build", status="ok", detail=f"{tool} (--mode={mode})")


def state(base: Path) -> Probe:
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / ".doctor"
        probe.write_text("x")
        probe.unlink()
    except OSError as exc:
        return Probe(
            name="state directory",
            status="failing",
            detail=f"{base}: {exc.strerror}",
            fix="set JAILBOX_STATE_DIR to a writable directory on a local disk",
        )
    free = shutil.disk_usage(base).free
    skeletons = len(list(base.glob("skeleton-*")))
    return Probe(
        name="state directory",
        status="ok",
        detail=f"{base} ({free / 2**30:.1f} GiB free, {skeletons} host skeleton(s) cached)",
    )


def run(host: Host | None = None, base: Path | None = None) -> list[Probe]:
    from ..state import state_dir

    host = host or Host()
    live = userns_live()
    groups = cgroup(host)
    return [
        Probe(name="kernel", status="ok", detail=f"Linux {platform.release()} {platform.machine()}"),
        userns_settings(host),
        live,
        overlay_in_userns(live),
        id_ranges(host),
        seccomp_notify(),
        groups,
        bounds(groups),
        shared_bounds(host),
        slirp4netns(host),
        rootfs_build(host),
        state(base or state_dir()),
    ]
