"""One running jail as the host sees it: create it, hold its channel, tear it down.

``Sandbox`` wraps a ``Jail`` with the public API; ``reset()`` and ``SandboxPool`` swap jails under it.
Everything the host decides about the jail is one ``JailSpec`` (``child/spec.py``), built here once
and sent to the launcher; what comes back from the jail's init is validated (``messages.Ready``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import os
import signal
import socket
import uuid
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from . import cacerts, hostids, hostroot, removal, snapshots, state
from .channel import Channel
from .child.protocol import Created, CreateRequest, Failed, Step, decode, fresh_name
from .child.spec import Bind, JailSpec, SeccompSpec
from .config import Limits, SandboxConfig
from .errors import ConfigError, ProtocolError, SandboxSetupError, SecurityWarning
from .floor import linux as L
from .floor import procstat, wire
from .floor.idmap import IdMap
from .launcher import LAUNCHER
from .limits import budget, cgroupfs, cgroups, plan, sockets, uids
from .limits.cgroups import Cgroup, CgroupV1, CgroupV2
from .limits.enforcement import Enforcement
from .limits.watch import WATCHER, Watched
from .messages import Ready
from .net import modes
from .net.policy import NetworkPolicy
from .net.secrets import Vault
from .pause import Pause
from .seccomp import bpf, syscalls
from .seccomp.policy import SeccompPolicy

if TYPE_CHECKING:
    from .layers import Layer
    from .limits import usage
    from .rootfs.users import User

EXIT_WAIT = 2.0


class Jail:
    def __init__(self, config: SandboxConfig, layers: tuple[Layer, ...] = (), vault: Vault | None = None) -> None:
        """``layers``: read-only layers over the root filesystem, topmost first (a checkpoint's);
        without them, a ``config.snapshot``'s. ``vault``: the secrets' placeholders and CA of the
        sandbox's earlier jail, which its files may hold (a rollback, a fork); else made here."""
        self._snapshot: Layer | None = None
        self.vault = vault
        try:
            self._build(config, layers)
        finally:
            if self._snapshot is not None:
                self._snapshot.release()  # the jail holds it now, if it was made

    def _build(self, config: SandboxConfig, layers: tuple[Layer, ...]) -> None:
        from .rootfs.resolve import apply_stored_rootfs

        self._idmap = self._disk_ids = hostids.plan(config.idmap)
        # a checkpoint's layers hold the generated /etc files as the sandbox left them; a
        # snapshot's and the image's get this configuration's
        self._fresh_etc = not layers
        if config.snapshot is not None and not layers:
            image, self._snapshot = snapshots.open_layer(
                config.snapshot,
                config.rootfs,
                "rootfs" in config.model_fields_set,
                self._disk_ids if config.userns else None,
            )
            config = config.model_copy(update={"rootfs": image})
            layers = (self._snapshot,)
        # a stored image's Env, WorkingDir and User, under the config's own; and its tree
        self.config, self._lower = apply_stored_rootfs(config)
        self.id = uuid.uuid4().hex[:12]
        if self.config.secrets and self.vault is None:
            self.vault = Vault(self.config.secrets, self.id)
        self.mode = modes.for_policy(self.config.network, self.vault)
        self.env = {**self.mode.env(), **(self.vault.env() if self.vault is not None else {})}
        self._shown_as: IdMap | None = None
        self._ids_lock: int | None = None  # the lock of this jail's own host ids, while it holds them
        self.usage_mark: tuple[float, float] | None = None  # (boot-time seconds, CPU seconds) at the last usage()
        base = state.state_dir(self.config.state_dir)
        self._pids_budget = budget.pids_share(budget.pids_budget(), budget.caller())  # this user's part of it
        lower, system_binds, generated = self._layout(base)
        # each step that leaves something behind registers its undo; closing runs them in reverse
        with contextlib.ExitStack() as undo:
            self.layers = layers
            for layer in layers:
                layer.hold()
                undo.callback(layer.release)  # after the jail is gone: its overlay held the layer
            self._claim_own_ids(lower, undo)
            self.dir = self._make_dir(base, undo)
            self.cgroup = self._make_cgroup(undo)
            self._counters = self._claim_counters(base, undo)
            self._maker = self._claim_maker(base, undo)
            self.spec = self._spec(base, lower, system_binds, generated)
            sock, self.init_pid = self._create(undo)
            self._attach_cgroup(sock, undo)
            net_fds, self.upper = self._await_ready(sock, undo)
            undo.callback(os.close, self.upper)
            self.watched = self._watch(net_fds, undo)
            self._write_meta()
            self.network = self._attach_network(net_fds, undo)
            self.channel = Channel(sock)
            self.pausing = Pause(self.cgroup, self.init_pid)
            self._finalizer = weakref.finalize(self, undo.pop_all().close)

    @property
    def id_map(self) -> IdMap:
        """The jail's user namespace map (its own host ids, where it has some)."""
        return self._idmap

    @property
    def disk_ids(self) -> IdMap:
        """The map its lower's owners are stored under on disk (and its layers')."""
        return self._disk_ids

    def run_as(self, spec: str) -> User:
        """The ids of ``spec`` (``NAME``, ``UID``, ``NAME:GROUP``, ``UID:GID``) in this jail's tree, as
        ``SandboxConfig.user`` is looked up: the tree's own files, read beneath the lower layer
        (what commands wrote since is not consulted), ids within the jail's map."""
        from .rootfs import users

        lower, generated = self._users_from
        return users.lookup(spec, lower, generated, self._idmap.max_id())

    @property
    def user_env(self) -> dict[str, str]:
        """HOME of the user commands run as (from the root filesystem's /etc/passwd)."""
        return {} if self.user is None else {"HOME": self.user.home}

    def counters(self) -> dict[str, int]:
        """Monotonic counts of limit events: the cgroup's (``oom_kill``, ``pids_max``), else the
        watcher's (``oom_kill``, ``disk_max``)."""
        found = dict(self.watched.counters)
        if self.cgroup is not None:  # the watcher may kill too (socket queues no cgroup counts): both count
            for name, count in self.cgroup.counters().items():
                found[name] = found.get(name, 0) + count
        return found

    def set_network(self, policy: NetworkPolicy) -> None:
        """Decide the jail's requests by ``policy`` from now on. Only an ``allow`` jail's rules (and
        pinned names) can change while it runs: the other modes are built into its namespace."""
        current = self.config.network
        if policy.mode != current.mode:
            raise ConfigError(
                f"set_network: this sandbox was made with network {current.mode!r}, which cannot become "
                f"{policy.mode!r} while it runs (make a new Sandbox(network=...))"
            )
        if policy.mode != "allow" and policy != current:
            raise ConfigError(
                f"set_network: a {current.mode!r} network is fixed when the jail is made; only 'allow' rules "
                "change while it runs"
            )
        if self.network.tenant is not None:
            from .net.proxy import PROXY

            PROXY.update(self.network.tenant, policy)
        self.config = self.config.model_copy(update={"network": policy})
        self.mode.policy = policy

    def usage(self) -> usage.Reading:
        """What the jail uses now: CPU time and memory from its cgroup where that counts them, else
        from its processes in ``/proc``; its writable layer from the tmpfs or the watcher's last walk."""
        from .limits import usage  # here: a command line that makes a jail never asks what it uses

        counted = self.cgroup.usage() if self.cgroup is not None else {}
        if "cpu_ns" not in counted or "memory" not in counted:
            cpu, memory = usage.from_proc(self.init_pid)
            counted = {"cpu_ns": int(cpu * 1e9), "memory": memory, "cache": 0} | counted
        if self.watched.disk is not None:
            disk: int | None = self.watched.disk.last_usage[0]
        else:
            disk = usage.layer_bytes(self.upper) if self.config.upper == "tmpfs" else None
        return usage.Reading(counted["cpu_ns"] / 1e9, counted["memory"], counted.get("cache", 0), disk)

    def close(self) -> None:
        """Kill every process of the jail and remove its mounts, writable layer and state. A paused
        jail is resumed first: its init ends the jail's processes when its socket closes."""
        try:
            if self._finalizer.alive:
                self.pausing.resume()
        finally:
            self._finalizer()

    # --- the steps, in order ------------------------------------------------------------------

    def _layout(self, base: Path) -> tuple[str, tuple[Bind, ...], dict[str, str]]:
        """The lower layer, the host-root binds, the generated /etc files; the user to run as."""
        cfg = self.config
        if self._lower is None:
            lower, binds = hostroot.layout(base)
        else:
            lower, binds = str(self._lower), []
        generated = self.mode.files(hostroot.generated_files(cfg.hostname, self._lower is None))
        self.user: User | None = None if cfg.user is None else _user(cfg, lower, generated, self._idmap)
        self._users_from = (lower, generated)  # where a command's own ``user=`` is looked up
        if not cfg.userns and os.getuid() != 0:
            raise ConfigError("userns=False needs root; unprivileged jails always use a user namespace")
        return lower, tuple(Bind(**b) for b in binds), generated

    def _claim_own_ids(self, lower: str, undo: contextlib.ExitStack) -> None:
        """As host root: host ids of this jail's own where it can have them (``hostids.claim_own_ids``),
        held until everything else is undone; its lower and binds are then mounted idmapped."""
        if not self.config.userns:
            return
        own = hostids.claim_own_ids(self.config.idmap, [lower, *(str(m.src) for m in self.config.mounts)])
        if own is None:
            return
        undo.callback(hostids.release_slot, own.lock)
        self._idmap, self._shown_as, self._ids_lock = own.idmap, own.shown_as, own.lock

    def _make_dir(self, base: Path, undo: contextlib.ExitStack) -> Path | None:
        """The sandbox's state directory, for a disk writable layer (a tmpfs one leaves nothing on disk)."""
        if self.config.upper != "disk":
            return None
        sandbox_dir = base / "sandboxes" / self.id
        # made in trash/ under a name that says whose it is, and moved to sandboxes/ once it names its
        # owner: a host killed at any step leaves a directory its launcher removes (by that name, or
        # its meta), and `cleanup` can tell is dead at once, not one that waits out the grace
        fresh = state.trash_dir(base) / fresh_name(os.getpid(), self.id)
        fresh.mkdir(mode=0o700)
        try:
            state.write_meta(fresh, host_pid=os.getpid(), host_start=state.own_start(), idmap=self._idmap.to_wire())
            if os.getuid() == 0 and self.config.userns:  # the jail's root (a subordinate id) makes its layer here
                os.chown(fresh, *self._idmap.host_root())
            os.rename(fresh, sandbox_dir)
        except BaseException:
            state.remove_sandbox_dir(fresh, None)  # nothing but the meta in it yet
            raise
        undo.callback(removal.retire, sandbox_dir, self._idmap)  # removed after close() returns
        return sandbox_dir

    def _make_cgroup(self, undo: contextlib.ExitStack) -> Cgroup | None:
        cgroup = _make_cgroup(self.id, self.config.limits, self._pids_budget)
        if cgroup is not None:
            undo.callback(cgroup.destroy)
        return cgroup

    def _claim_counters(self, base: Path, undo: contextlib.ExitStack) -> dict[str, int]:
        """This jail's per-user counter limits, out of the budget all this user's sandboxes share
        (``budget.py``); given back once the jail is gone (the undo runs after the init's)."""
        if not self.config.userns:
            return {}
        counters = budget.claim_counters(base, self.id)
        undo.callback(budget.release_counters, base, self.id)
        return counters

    def _claim_maker(self, base: Path, undo: contextlib.ExitStack) -> hostids.Maker | None:
        """The id this jail's epoll instances are made as (``hostids.claim_maker``); a slot's lock is
        held until everything else is undone. None without a filter: nothing would send it calls."""
        if not self.config.userns or self.config.seccomp is None:
            return None
        maker = hostids.claim_maker(self._idmap, self._shown_as is not None, base)
        if maker is not None and maker.lock is not None:
            undo.callback(hostids.release_slot, maker.lock)
        return maker

    def _spec(self, base: Path, lower: str, system_binds: tuple[Bind, ...], generated: dict[str, str]) -> JailSpec:
        cfg = self.config
        if os.getuid() == 0 and cfg.userns:
            _give_binds(cfg, self._disk_ids)  # on disk, binds keep root's range (shown idmapped if ids are own)
        caps = cfg.capabilities()
        seccomp = _seccomp_spec(
            cfg.seccomp,
            any(not m.readonly for m in cfg.mounts),
            "SYS_CHROOT" in caps,
            no_memfd=cfg.limits.memory is not None and self.cgroup is None,  # the watcher holds memory
            epoll_maker=-1 if self._maker is None else self._maker.id,
        )
        net = self.mode.child_spec(cfg.userns)
        self._bounds = plan.Jail(
            config=cfg,
            cgroup=None if self.cgroup is None else self.cgroup.kind,
            pids_budget=self._pids_budget,
            counters=self._counters,
            id_map=self._idmap,
            own_ids=self._shown_as is not None,
            maker=self._maker,
            made=seccomp is not None and seccomp.epoll_maker >= 0,
            own_netns=net.new_netns,
            proxied=net.proxy_port != 0,
        )
        planned = plan.plan(self._bounds)
        self.enforcement: dict[str, Enforcement] = planned.enforcement
        return JailSpec(
            id=self.id,
            dir=None if self.dir is None else str(self.dir),
            stage=str(base / "stage"),
            lower=lower,
            layers=tuple(str(layer.tree) for layer in self.layers),
            trusted_lower=self._lower is None,
            system_binds=system_binds,
            user_binds=tuple(
                Bind(src=str(m.src), dst=m.dst, is_dir=m.src.is_dir(), readonly=m.readonly)
                for m in sorted(cfg.mounts, key=lambda m: m.dst.count("/"))
            ),
            # a checkpoint's layers already hold them, as the sandbox left them (edited, or removed)
            generated=generated if self._fresh_etc else {},
            ca_certs=self._ca_certs() if self._fresh_etc else "",
            upper=cfg.upper,
            tmpfs_size=planned.tmpfs_size,
            tmpfs_inodes=planned.tmpfs_inodes,
            rlimits=planned.rlimits,
            hostname=cfg.hostname,
            net=net,
            workdir=cfg.workdir,
            caps=L.cap_mask(caps),
            seccomp=seccomp,
            userns=cfg.userns,
            idmap=self._idmap,
            shown_as=self._shown_as,
            pids_budget=planned.nproc_budget,
            creator=hostids.namespace_creator() if cfg.userns else None,
            counters=self._counters,
            counter_budget=budget.rlimit_budget(),
            ipc=planned.ipc,
        )

    def _ca_certs(self) -> str:
        """The config's CA files, read again now (they may have changed since it was validated)."""
        secrets_ca = self.vault.ca_pem if self.vault is not None else ""
        if not self.config.ca_certs:
            return secrets_ca
        if self._lower is None:
            raise ConfigError("ca_certs needs a root filesystem: the host rootfs's /etc is the host's, read-only")
        try:
            return cacerts.bundle(self.config.ca_certs) + secrets_ca
        except ValueError as exc:
            raise ConfigError(f"ca_certs: {exc}") from None

    def _create(self, undo: contextlib.ExitStack) -> tuple[socket.socket, int]:
        """Ask the launcher for the jail: its control socket and init pid (a pidfd of it is kept)."""
        reply, fds = LAUNCHER.request(CreateRequest(self.spec).to_wire())
        try:
            created = decode(reply, Created)
        except wire.WireError as exc:
            _close_all(fds)
            raise SandboxSetupError(f"bad reply from the jailbox launcher: {exc}") from None
        if isinstance(created, Failed):
            _close_all(fds)
            from .checks.diagnose import explain  # only on failure: it loads the doctor's probes

            raise explain(created)
        if not isinstance(created, Created) or len(fds) != 2:
            _close_all(fds)
            raise SandboxSetupError("the launcher answered without the jail's descriptors")
        sock, pidfd = socket.socket(fileno=fds[0]), fds[1]
        undo.callback(_stop_init, pidfd)
        undo.callback(sock.close)  # first: the init exits on EOF
        return sock, created.init_pid

    def _await_ready(self, sock: socket.socket, undo: contextlib.ExitStack) -> tuple[list[int], int]:
        """The init's ready message; the network side's descriptors, in ``NetSpec``'s order, and an
        ``O_PATH`` descriptor of the writable layer's directory (``layers.cut`` copies it)."""
        if not wire.wait_readable(sock, self.config.setup_timeout):
            raise SandboxSetupError(f"the jail was not ready within {self.config.setup_timeout}s")
        try:
            # the diag socket, a proxy listener, two namespaces (full with secrets), the writable layer
            msg = wire.recv(sock, max_fds=5)
        except wire.WireError as exc:
            raise ProtocolError(f"bad message from the jail during setup: {exc}") from exc
        if msg is None:
            raise SandboxSetupError("the jail's init exited during setup")
        fds = msg[1]
        undo.callback(_close_all, fds)  # until the network side takes them
        try:
            ready = Ready.model_validate(msg[0])
        except ValidationError as exc:
            raise ProtocolError(f"bad message from the jail during setup: {exc}") from None
        if ready.kind == "failed":
            from .checks.diagnose import explain

            raise explain(Failed(ready.step or Step.PROTOCOL, ready.errno, ready.error or "jail setup failed"))
        if len(fds) != self.spec.net.handed + 1:
            raise ProtocolError(f"the jail's init handed over {len(fds)} descriptors, not {self.spec.net.handed + 1}")
        upper = fds.pop()
        if not ready.seccomp_notify and self.enforcement["epoll"].held:
            # the kernel refused the init a listener (a supervisor above already holds one): the
            # filter without one lets epoll_create through, made by the caller
            why = "the init got no seccomp listener (a supervisor above holds one)"
            self.enforcement["epoll"] = uids.not_held_epoll(why)
        return fds, upper

    def _attach_cgroup(self, sock: socket.socket, undo: contextlib.ExitStack) -> None:
        """Move the init into its cgroup while it builds the jail's filesystem (the two overlap: on
        cgroup v1 a move costs milliseconds of kernel time). Nothing untrusted runs before it is
        in: the init takes no request until it has reported ready."""
        if self.cgroup is None:
            return
        try:
            self.cgroup.attach(self.init_pid)
        except OSError:
            self._await_ready(sock, undo)  # an init that failed its setup (and so left) says why
            raise

    def _write_meta(self) -> None:
        if self.dir is not None:
            state.write_meta(
                self.dir,
                host_pid=os.getpid(),
                host_start=state.own_start(),
                init_pid=self.init_pid,
                init_start=procstat.start_ticks(self.init_pid),
                idmap=self._idmap.to_wire(),
                lower=self.spec.lower,  # `jailbox rootfs rm` will not pull a tree from under a live jail
            )

    def _watch(self, net_fds: list[int], undo: contextlib.ExitStack) -> Watched:
        """Hand the bounds no cgroup holds to the host's watcher (``limits/watch.py``), with the
        jail's sock_diag socket (the first of ``net_fds`` when the jail has its own namespace)."""
        diag = net_fds.pop(0) if self.spec.net.new_netns else -1
        upper = self.dir / "upper" if self.dir is not None else None
        watched = plan.watched(self._bounds, self.init_pid, upper, diag)
        WATCHER.add(watched)
        undo.callback(WATCHER.remove, watched)
        return watched

    def _attach_network(self, fds: list[int], undo: contextlib.ExitStack) -> modes.Network:
        handed = fds[:]
        fds.clear()  # the mode's host side owns them now, failing or not
        network = self.mode.attach(self.id, handed, self.config.setup_timeout)
        undo.callback(network.close)
        return network


def _user(cfg: SandboxConfig, lower: str, generated: dict[str, str], id_map: IdMap) -> User | None:
    """The ids to switch commands to; None for root (what the init is already)."""
    from .rootfs import users

    assert cfg.user is not None
    user = users.lookup(cfg.user, lower, generated, id_map.max_id())
    return None if (user.uid, user.gid) == (0, 0) else user


def _give_binds(cfg: SandboxConfig, id_map: IdMap) -> None:
    """As host root: read-write binds the jail's root (a subordinate id) is to write. ``give``
    ones are chowned to it; of any other it cannot write, a warning names the fix."""
    uid, gid = id_map.host_root()
    for m in cfg.mounts:
        if m.give:
            hostids.give_tree(m.src, uid, gid)
        elif not m.readonly and not hostids.writable_by(m.src, uid, gid):
            warnings.warn(
                f"mount {m.dst}: the jail's root (host uid {uid}) cannot write {m.src}; give it the tree with "
                f"Mount(src, dst, readonly=False, give=True) (CLI: SRC:DST:give), or chown -R {uid}:{gid} {m.src}",
                UserWarning,
                stacklevel=5,
            )


def _seccomp_spec(
    policy: SeccompPolicy | None, rw_binds: bool, chroot: bool, no_memfd: bool, epoll_maker: int
) -> SeccompSpec | None:
    """The compiled filter; with a read-write bind, one that keeps set-id files and device nodes
    off it (``bpf._mode_rules``); ``chroot`` where commands hold CAP_SYS_CHROOT (as Docker's profile);
    ``no_memfd`` where no cgroup counts memory (``bpf.compile_policy``); the jail's epoll instances
    made by the init's maker as jail id ``epoll_maker`` where the policy allows it (-1: never)."""
    if policy is None:
        warnings.warn(
            "seccomp is OFF for this sandbox: every syscall the kernel allows an unprivileged user is open to it",
            SecurityWarning,
            stacklevel=4,
        )
        return None
    compiled = _compiled(policy, rw_binds, chroot, no_memfd, epoll_maker >= 0)
    return dataclasses.replace(compiled, epoll_maker=epoll_maker) if compiled.epoll_create1 >= 0 else compiled


@functools.lru_cache(maxsize=32)
def _compiled(policy: SeccompPolicy, guard_modes: bool, chroot: bool, no_memfd: bool, maker: bool) -> SeccompSpec:
    """The filters, and the epoll calls they send to the init if ``maker`` (the maker's id comes after)."""
    create1, create = bpf.epoll_calls(policy) if maker else (-1, -1)
    made = create1 >= 0
    return SeccompSpec(
        notify=base64.b64encode(bpf.compile_policy(policy, True, guard_modes, chroot, no_memfd, made)).decode(),
        errno=base64.b64encode(bpf.compile_policy(policy, False, guard_modes, chroot, no_memfd)).decode(),
        errno_value=policy.errno,
        in_child=not bpf.init_can_live_under(policy),
        audit_arch=syscalls.AUDIT_ARCH[syscalls.arch()],
        epoll_create1=create1,
        epoll_create=create if made else -1,
        epoll_maker=-1,
    )


def _make_cgroup(sandbox_id: str, wanted: Limits, pids_budget: int) -> Cgroup | None:
    """Per-sandbox cgroups where this host lets us make them, else None (rlimits then)."""
    try:
        if cgroupfs.v2_mounted():
            parent = _v2_parent()
            return None if parent is None else CgroupV2(parent, sandbox_id, wanted, pids_budget)
        needed = wanted.memory is not None or wanted.pids is not None or wanted.cpus is not None
        inet = (sockets.inet_bound(wanted.memory), sockets.inet_budget())
        return CgroupV1(sandbox_id, wanted, pids_budget, inet) if needed and cgroups.v1_usable() else None
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _v2_parent() -> Path | None:
    return cgroups.v2_parent()[0]


def _stop_init(pidfd: int) -> None:
    """The init exits once its control socket is closed; past EXIT_WAIT it is killed."""
    if not wire.wait_readable(pidfd, EXIT_WAIT):
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wire.wait_readable(pidfd, EXIT_WAIT)
    os.close(pidfd)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
