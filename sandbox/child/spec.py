"""The jail spec: everything the host decided about one jail, in one typed contract.

Built once on the host (``sandbox/jail.py``), sent to the launcher with the create request, and
read by the launcher's child A (``child/zygote.py``) and the jail's init (``child/init.py``,
``child/mounts.py``, ``child/netns.py``). This is the trusted direction: it decides every mount, so
decoding is strict (an unknown or missing key is an error, every field is type-checked).
Stdlib only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..floor import wire
from ..floor.idmap import IdMap

Upper = Literal["tmpfs", "disk"]
UPPERS: tuple[Upper, ...] = ("tmpfs", "disk")
# Fixed for every jail, and stated in its enforcement report by the host:
PTYS = 128  # ptys of one jail (its devpts max=): 24 sandboxes hold the shared 3072 before any is refused
DEV_SIZE = 64 << 10  # bytes of the jail's /dev tmpfs: device nodes are binds, what is written there is a few links
DEV_INODES = 256  # its inodes: a byte bound alone would leave empty files free, each an inode of host memory


@dataclass(frozen=True)
class Bind:
    """A host path bound into the jail."""

    src: str  # host path; from a config Mount (jail.py) or the host-root layout (hostroot.py)
    dst: str  # absolute path inside the jail
    is_dir: bool  # whether the mount point to create is a directory (else an empty file)
    readonly: bool  # remounted read-only after binding

    @classmethod
    def from_wire(cls, obj: object) -> Bind:
        f = wire.fields_of(cls, obj)
        return cls(
            src=wire.typed(f, "src", str),
            dst=wire.typed(f, "dst", str),
            is_dir=wire.typed(f, "is_dir", bool),
            readonly=wire.typed(f, "readonly", bool),
        )


@dataclass(frozen=True)
class NetSpec:
    """What the init does to the jail's network namespace; set by the mode object (``net/modes.py``).

    Descriptors handed to the host after setup, in this order: a sock_diag netlink socket of the
    namespace (if ``new_netns``; for the host's watcher), the proxy listener (if ``proxy_port``),
    then one per entry of ``namespaces``."""

    new_netns: bool  # the jail gets its own network namespace (loopback is brought up in it)
    proxy_port: int  # >0: listen on the jail's 127.0.0.1:PORT and hand the socket to the host proxy
    namespaces: tuple[str, ...]  # /proc/self/ns entries handed to the host (slirp4netns joins them)
    unreachable: tuple[str, ...]  # IPv4 prefixes routed as unreachable (the host's LAN, full mode)

    @property
    def fd_count(self) -> int:
        """How many descriptors the network mode's host side takes."""
        return (1 if self.proxy_port else 0) + len(self.namespaces)

    @property
    def handed(self) -> int:
        """How many descriptors the init hands over with its ready message: the mode's, after the
        sock_diag socket of a namespace of its own."""
        return (1 if self.new_netns else 0) + self.fd_count

    @classmethod
    def from_wire(cls, obj: object) -> NetSpec:
        f = wire.fields_of(cls, obj)
        port = wire.typed(f, "proxy_port", int)
        if not 0 <= port < 65536:
            raise wire.WireError(f"proxy_port out of range: {port}")
        return cls(
            new_netns=wire.typed(f, "new_netns", bool),
            proxy_port=port,
            namespaces=_strings(f, "namespaces"),
            unreachable=_strings(f, "unreachable"),
        )


@dataclass(frozen=True)
class SeccompSpec:
    """The jail's syscall filters, compiled on the host (``seccomp/bpf.py`` via jail.py)."""

    notify: str  # base64 BPF program: refusals go to the init's user-notify listener (which counts them)
    errno: str  # base64 BPF program: refusals return ``errno_value`` directly (no listener)
    errno_value: int  # the errno a refused syscall gets
    in_child: bool  # the init could not live under the policy: each command's child installs ``errno``
    audit_arch: int  # AUDIT_ARCH of this host, to name refusals from other ABIs
    # epoll instances made for the jail by the init's maker under one id (child/epoll.py): the
    # numbers of epoll_create1 and epoll_create the notify program sends to the init (-1: not sent;
    # epoll_create is sent only with epoll_create1), and the jail uid and gid the maker runs as (-1: no maker)
    epoll_create1: int
    epoll_create: int
    epoll_maker: int

    @classmethod
    def from_wire(cls, obj: object) -> SeccompSpec:
        f = wire.fields_of(cls, obj)
        return cls(
            notify=wire.typed(f, "notify", str),
            errno=wire.typed(f, "errno", str),
            errno_value=wire.typed(f, "errno_value", int),
            in_child=wire.typed(f, "in_child", bool),
            audit_arch=wire.typed(f, "audit_arch", int),
            epoll_create1=wire.typed(f, "epoll_create1", int),
            epoll_create=wire.typed(f, "epoll_create", int),
            epoll_maker=wire.typed(f, "epoll_maker", int),
        )


@dataclass(frozen=True)
class JailSpec:
    """One jail, as decided by the host (``Jail`` in jail.py builds it from the SandboxConfig)."""

    id: str  # the sandbox id (also its state directory's name)
    dir: str | None  # the sandbox's state directory (holds a disk writable layer); None for upper="tmpfs"
    stage: str  # the shared staging directory each jail mounts its private tmpfs over
    lower: str  # host path of the read-only lower layer: a stored tree, or the host-root skeleton
    # host paths of read-only layers over it, topmost first: checkpoints' trees (sandbox/layers.py)
    layers: tuple[str, ...]
    trusted_lower: bool  # the lower is the host's own tree (hostroot), not a possibly hostile image
    system_binds: tuple[Bind, ...]  # host directories the host-root layout binds in (/usr, /etc...)
    user_binds: tuple[Bind, ...]  # the config's mounts, shallowest first
    generated: dict[str, str]  # files written into the writable layer: jail-relative path -> content
    ca_certs: str  # PEM certificates appended to the tree's CA bundles in the writable layer ("" for none)
    upper: Upper  # where the writable layer lives: a tmpfs, or ``dir`` on disk
    tmpfs_size: int  # bytes of the one tmpfs: /tmp, /dev/shm, a tmpfs writable layer (limits/scratch.tmpfs)
    tmpfs_inodes: int  # its inode count (0: the kernel's default)
    rlimits: dict[str, int]  # RLIMIT_* name -> soft and hard value, planned by limits/rlimits.py
    hostname: str  # the jail's UTS hostname
    net: NetSpec  # the network mode's child side (net/modes.py)
    workdir: str  # the default working directory, created mode 0755 if missing
    caps: int  # bit mask of the user namespace's capabilities a command executed as uid 0 holds
    seccomp: SeccompSpec | None  # None: no filter (the host warned)
    userns: bool  # a new user namespace (False only as root, on request)
    idmap: IdMap  # the user namespace's map, written by the launcher (sandbox/hostids.py plans it)
    # ids of its own (root's jails): the lower's and user binds' ids on disk (the shared range, as
    # "on-disk host count" triples) shown as this jail's, through idmapped mounts; None: as they are
    shown_as: IdMap | None
    pids_budget: int | None  # RLIMIT_NPROC of the user namespace's creator: the user's processes, jails included
    # host root's jails: the host uid their outer user namespace is created as, one for all root's
    # jails, so the kernel holds pids_budget (it never caps a namespace global root creates); None: as is
    creator: int | None
    counters: dict[str, int]  # /proc/sys/user/NAME or RLIMIT_NAME -> the jail's share (limits/budget.py)
    counter_budget: dict[str, int]  # RLIMIT_NAME -> soft limit of the user namespace's creator: all jails' share
    ipc: dict[str, str]  # /proc/sys/kernel/NAME -> value in the jail's own IPC namespace (limits/scratch.ipc)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: object) -> JailSpec:
        f = wire.fields_of(cls, obj)
        upper = wire.typed(f, "upper", str)
        if upper not in UPPERS:
            raise wire.WireError(f"upper: unknown kind {upper!r}")
        if upper == "disk" and f["dir"] is None:
            raise wire.WireError("upper: a disk writable layer needs the sandbox directory")
        return cls(
            id=wire.typed(f, "id", str),
            dir=None if f["dir"] is None else wire.typed(f, "dir", str),
            stage=wire.typed(f, "stage", str),
            lower=wire.typed(f, "lower", str),
            layers=_strings(f, "layers"),
            trusted_lower=wire.typed(f, "trusted_lower", bool),
            system_binds=tuple(Bind.from_wire(b) for b in wire.typed(f, "system_binds", list)),
            user_binds=tuple(Bind.from_wire(b) for b in wire.typed(f, "user_binds", list)),
            generated=_string_map(f, "generated", str),
            ca_certs=wire.typed(f, "ca_certs", str),
            upper="tmpfs" if upper == "tmpfs" else "disk",
            tmpfs_size=wire.typed(f, "tmpfs_size", int),
            tmpfs_inodes=wire.typed(f, "tmpfs_inodes", int),
            rlimits=_string_map(f, "rlimits", int),
            hostname=wire.typed(f, "hostname", str),
            net=NetSpec.from_wire(f["net"]),
            workdir=wire.typed(f, "workdir", str),
            caps=wire.typed(f, "caps", int),
            seccomp=None if f["seccomp"] is None else SeccompSpec.from_wire(f["seccomp"]),
            userns=wire.typed(f, "userns", bool),
            idmap=IdMap.from_wire(f["idmap"]),
            shown_as=None if f["shown_as"] is None else IdMap.from_wire(f["shown_as"]),
            pids_budget=None if f["pids_budget"] is None else wire.typed(f, "pids_budget", int),
            creator=None if f["creator"] is None else wire.typed(f, "creator", int),
            counters=_string_map(f, "counters", int),
            counter_budget=_string_map(f, "counter_budget", int),
            ipc=_string_map(f, "ipc", str),
        )


def _strings(fields: dict[str, Any], name: str) -> tuple[str, ...]:
    items = wire.typed(fields, name, list)
    if not all(isinstance(item, str) for item in items):
        raise wire.WireError(f"{name}: expected a list of strings")
    return tuple(items)


def _string_map(fields: dict[str, Any], name: str, kind: type) -> dict[str, Any]:
    items = wire.typed(fields, name, dict)
    for key, value in items.items():
        if not isinstance(key, str) or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise wire.WireError(f"{name}: expected a map of str to {kind.__name__}")
    return dict(items)
