"""One running jail as the host sees it: create it, hold its channel, tear it down.

``Sandbox`` wraps a ``Jail`` with the public API; ``reset()`` and ``SandboxPool`` swap jails under it.
"""

from __future__ import annotations

import base64
import functools
import os
import signal
import socket
import uuid
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from . import hostroot, idmap, state
from .channel import Channel
from .checks.diagnose import explain
from .config import Limits, SandboxConfig, SeccompPolicy
from .errors import ConfigError, ProtocolError, SandboxSetupError, SecurityWarning
from .floor import wire
from .launcher import LAUNCHER
from .limits import cgroups, rlimits
from .limits.cgroups import Cgroup, CgroupV1, CgroupV2
from .messages import Ready
from .net import modes
from .seccomp import bpf

if TYPE_CHECKING:
    from .rootfs.users import User

EXIT_WAIT = 2.0


class Jail:
    def __init__(self, config: SandboxConfig) -> None:
        from .rootfs.resolve import apply_stored_rootfs

        # a stored image's Env, WorkingDir and User, under the config's own; and its tree
        self.config, self._lower = apply_stored_rootfs(config)
        self.id = uuid.uuid4().hex[:12]
        self.cgroup = _make_cgroup(self.id, config.limits)
        kind = None if self.cgroup is None else self.cgroup.kind
        planned, self.enforcement = rlimits.plan(config.limits, config.upper, kind)
        try:
            self._spec, self.dir = self._prepare(planned)
        except BaseException:
            _teardown(None, -1, None, {}, self.cgroup)
            raise
        channel_sock, self._pidfd, self.init_pid, net_fds = self._launch()
        try:
            self.network = modes.Network(self.id, config.network, net_fds, config.setup_timeout)
        except BaseException:
            _teardown(channel_sock, self._pidfd, self.dir, self._spec, self.cgroup)
            raise
        self.env = modes.env(config.network)
        self._finalizer = weakref.finalize(
            self, _teardown, channel_sock, self._pidfd, self.dir, self._spec, self.cgroup, self.network
        )
        self.channel = Channel(channel_sock)

    @property
    def user_env(self) -> dict[str, str]:
        """HOME of the user commands run as (from the root filesystem's /etc/passwd)."""
        return {} if self.user is None else {"HOME": self.user.home}

    def close(self) -> None:
        """Kill every process of the jail and remove its mounts, writable layer and state."""
        self._finalizer()

    def _prepare(self, planned: dict[str, int]) -> tuple[dict, Path | None]:
        cfg = self.config
        base = state.state_dir(cfg.state_dir)
        host = self._lower is None
        if self._lower is None:
            lower, system_binds = hostroot.layout(base)
        else:
            lower, system_binds = str(self._lower), []
        generated = modes.files(cfg.network, hostroot.generated_files(cfg.hostname, host))
        self.user: User | None = None if cfg.user is None else _user(cfg, lower, generated)
        if not cfg.userns and os.getuid() != 0:
            raise ConfigError("userns=False needs root; unprivileged jails always use a user namespace")
        user_binds = [
            {"src": str(m.src), "dst": m.dst, "is_dir": m.src.is_dir(), "readonly": m.readonly}
            for m in sorted(cfg.mounts, key=lambda m: m.dst.count("/"))
        ]
        sandbox_dir = None
        if cfg.upper == "disk":  # a tmpfs writable layer leaves nothing on disk
            sandbox_dir = base / "sandboxes" / self.id
            sandbox_dir.mkdir(mode=0o700)
        spec = {
            "id": self.id,
            "dir": None if sandbox_dir is None else str(sandbox_dir),
            "stage": str(base / "stage"),
            "lower": lower,
            "trusted_lower": host,
            "system_binds": system_binds,
            "user_binds": user_binds,
            "generated": generated,
            "upper": cfg.upper,
            "tmpfs_size": min(cfg.tmpfs_size, cfg.limits.disk or cfg.tmpfs_size),
            "rlimits": planned,
            "hostname": cfg.hostname,
            "network": cfg.network.mode,
            "net": modes.child_spec(cfg.network, cfg.userns, cfg.keep_caps),
            "workdir": cfg.workdir,
            "keep_caps": cfg.keep_caps,
            "seccomp": _seccomp_spec(cfg.seccomp),
            "userns": cfg.userns,
            "idmap": idmap.plan(cfg.idmap),
        }
        return spec, sandbox_dir

    def _launch(self) -> tuple[socket.socket, int, int, list[int]]:
        try:
            reply, fds = LAUNCHER.request({"op": "create", "spec": self._spec})
            if not reply.get("ok"):
                raise explain(str(reply.get("error", "jail setup failed"))[:2000], int(reply.get("errno") or 0))
            if len(fds) != 2:
                raise SandboxSetupError("the launcher answered without the jail's descriptors")
        except BaseException:
            _teardown(None, -1, self.dir, self._spec, self.cgroup)
            raise
        sock, pidfd = socket.socket(fileno=fds[0]), fds[1]
        net_fds: list[int] = []
        try:
            ready, net_fds = self._await_ready(sock)
            if ready.error is not None:
                raise explain(ready.error, ready.errno)
            if len(net_fds) != modes.expected_fds(self.config.network, self.config.userns):
                raise ProtocolError(f"the jail's init handed over {len(net_fds)} network descriptors")
        except BaseException:
            for fd in net_fds:
                os.close(fd)
            _teardown(sock, pidfd, self.dir, self._spec, self.cgroup)
            raise
        init_pid = int(reply["init_pid"])
        if self.cgroup is not None:
            try:
                self.cgroup.attach(init_pid)
            except BaseException:
                for fd in net_fds:
                    os.close(fd)
                _teardown(sock, pidfd, self.dir, self._spec, self.cgroup)
                raise
        if self.dir is not None:
            state.write_meta(
                self.dir,
                host_pid=os.getpid(),
                host_start=state.own_start(),
                init_pid=init_pid,
                init_start=state.process_start(init_pid),
                idmap=self._spec["idmap"],
                lower=self._spec["lower"],  # `jailbox rootfs rm` will not pull a tree from under a live jail
            )
        return sock, pidfd, init_pid, net_fds

    def _await_ready(self, sock: socket.socket) -> tuple[Ready, list[int]]:
        if not wire.wait_readable(sock, self.config.setup_timeout):
            raise SandboxSetupError(f"the jail was not ready within {self.config.setup_timeout}s")
        try:
            msg = wire.recv(sock, max_fds=2)
        except wire.WireError as exc:
            raise ProtocolError(f"bad message from the jail during setup: {exc}") from exc
        if msg is None:
            raise SandboxSetupError("the jail's init exited during setup")
        return Ready.model_validate(msg[0]), msg[1]


def _user(cfg: SandboxConfig, lower: str, generated: dict[str, str]) -> User | None:
    """The ids to switch commands to; None for root (what the init is already)."""
    from .rootfs import unpack, users

    assert cfg.user is not None
    user = users.lookup(cfg.user, lower, generated, unpack.max_id(idmap.plan(cfg.idmap)))
    return None if (user.uid, user.gid) == (0, 0) else user


def _seccomp_spec(policy: SeccompPolicy | None) -> dict | None:
    if policy is None:
        warnings.warn(
            "seccomp is OFF for this sandbox: every syscall the kernel allows an unprivileged user is open to it",
            SecurityWarning,
            stacklevel=4,
        )
        return None
    return _compiled(policy)


@functools.lru_cache(maxsize=32)
def _compiled(policy: SeccompPolicy) -> dict:
    return {
        "notify": base64.b64encode(bpf.compile_policy(policy, notify=True)).decode(),
        "errno": base64.b64encode(bpf.compile_policy(policy, notify=False)).decode(),
        "errno_value": policy.errno,
        "in_child": not bpf.init_can_live_under(policy),
        "audit_arch": bpf.AUDIT_ARCH[bpf.arch()],
    }


def _make_cgroup(sandbox_id: str, wanted: Limits) -> Cgroup | None:
    """Per-sandbox cgroups where this host lets us make them, else None (rlimits then)."""
    try:
        if cgroups.v2_mounted():
            parent = _v2_parent()
            return None if parent is None else CgroupV2(parent, sandbox_id, wanted)
        needed = wanted.memory is not None or wanted.pids is not None or wanted.cpus is not None
        return CgroupV1(sandbox_id, wanted) if needed and cgroups.v1_usable() else None
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _v2_parent() -> Path | None:
    return cgroups.v2_parent()[0]


def _teardown(
    sock: socket.socket | None,
    pidfd: int,
    sandbox_dir: Path | None,
    spec: dict,
    cgroup: Cgroup | None,
    net: modes.Network | None = None,
) -> None:
    """Close the control socket (the init exits on EOF), make sure it died, remove the state."""
    if net is not None:
        net.close()
    if sock is not None:
        sock.close()
    if pidfd >= 0:
        if not wire.wait_readable(pidfd, EXIT_WAIT):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wire.wait_readable(pidfd, EXIT_WAIT)
        os.close(pidfd)
    if cgroup is not None:
        cgroup.destroy()
    if sandbox_dir is not None:
        remove_sandbox_dir(sandbox_dir, spec.get("idmap"))


def remove_sandbox_dir(sandbox_dir: Path, id_map: dict | None) -> None:
    try:
        state.force_rmtree(sandbox_dir)
    except OSError:
        if not id_map or not id_map.get("helper"):
            raise
        reply, _ = LAUNCHER.request({"op": "rmtree", "spec": {"idmap": id_map}, "path": str(sandbox_dir)}, max_fds=0)
        if not reply.get("ok"):
            raise SandboxSetupError(f"could not remove {sandbox_dir}: {reply.get('error')}") from None
