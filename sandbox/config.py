"""Sandbox configuration: pydantic models, validated before any process is forked."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from . import cacerts
from .floor.linux import CAPABILITIES
from .limits import DEFAULT_DISK, DEFAULT_INODES, DEFAULT_MEMORY, DEFAULT_PIDS
from .net.policy import NetworkPolicy, Rules, fields_of
from .net.secrets import Secret
from .net.secrets import check_all as check_secrets
from .seccomp.policy import SeccompPolicy

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Docker's default set: what uid 0 of a root-filesystem sandbox holds, in its own user namespace
DOCKER_CAPS = frozenset(
    ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
     "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP")
)  # fmt: skip
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$")


def parse_size(value: int | str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5g"``, ``"64KiB"`` or an int of bytes."""
    if isinstance(value, bool):
        raise ValueError("size must be a number of bytes or a string like '512M'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("size must be positive")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(value).lower())
    if not m:
        raise ValueError(f"cannot read size {value!r}: use bytes or a number with K, M, G or T")
    size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size <= 0:
        raise ValueError("size must be positive")
    return size


def capability_names(values: Iterable[str]) -> tuple[str, ...]:
    """Capability names as ``cap_add``/``cap_drop`` take them (``CAP_NET_ADMIN``, ``net_admin``, ``ALL``),
    normalised to ``NET_ADMIN``, each once."""
    out = []
    for value in values:
        name = str(value).strip().upper().removeprefix("CAP_")
        if name != "ALL" and name not in CAPABILITIES:
            raise ValueError(
                f"unknown capability {value!r}: name one of capabilities(7), with or without CAP_, or ALL "
                "(e.g. NET_ADMIN)"
            )
        out.append(name)
    return tuple(dict.fromkeys(out))


def jail_path(value: str) -> str:
    """An absolute, normalised path inside the jail."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path inside the jail")
    if "\0" in value:
        raise ValueError("path contains a NUL byte")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} must not contain '..'")
    return posixpath.normpath(value)


class Mount(BaseModel):
    """Bind a host path into the jail: ``Mount("./data", "/testbed/input")`` (read-only by default).

    A read-write bind is mounted nosuid,nodev and its jail gets seccomp's mode rules (no set-id
    file, device node or FIFO can be made there). As host root the jail's root is a subordinate
    id, which cannot write a directory host root owns: ``give=True`` first gives the source tree
    to the jail's root (every entry, symlinks not followed, other filesystems not entered; CLI
    ``SRC:DST:give``). Rootless it changes nothing: the jail's root is you already.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    src: Path
    dst: str
    readonly: bool = True
    give: bool = Field(False, description="as root: chown the source tree to the jail's root first (read-write)")

    def __init__(self, src: Any = None, dst: Any = None, readonly: bool = True, **kw: Any) -> None:
        if src is not None:
            kw["src"] = src
        if dst is not None:
            kw["dst"] = dst
        kw.setdefault("readonly", readonly)
        super().__init__(**kw)

    @model_validator(mode="after")
    def _give_is_rw(self) -> Mount:
        if self.give and self.readonly:
            raise ValueError(
                f"mount {self.dst}: give=True is for a read-write bind; e.g. Mount(src, dst, readonly=False, give=True)"
            )
        return self

    @field_validator("src")
    @classmethod
    def _src_exists(cls, v: Path) -> Path:
        v = v.expanduser().absolute()
        if not v.exists():
            raise ValueError(f"mount source {v} does not exist")
        return v

    @field_validator("dst")
    @classmethod
    def _dst_path(cls, v: str) -> str:
        v = jail_path(v)
        if v == "/":
            raise ValueError("cannot mount over the jail's root")
        return v

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """The CLI form ``SRC:DST[:ro|rw|give]`` (``give``: read-write, given to the jail's root)."""
        parts = spec.split(":")
        mode = "ro"
        if len(parts) == 3:
            mode = parts.pop()
        if len(parts) != 2 or mode not in ("ro", "rw", "give"):
            raise ValueError(f"bind {spec!r}: expected SRC:DST[:ro|rw|give], e.g. ./out:/testbed/out:rw")
        return cls(parts[0], parts[1], readonly=mode == "ro", give=mode == "give")


class Limits(BaseModel):
    """Resource caps for a whole sandbox; sizes take units (``Limits(memory="2G", pids=512, cpus=1.5)``).

    Enforced with cgroups where the host allows them, else with rlimits and the host's watcher
    (``limits/watch.py``); ``Sandbox.enforcement`` says how each limit is enforced, or that it is not.
    Memory, disk and inodes are bounded by default (``DEFAULT_*``); ``None`` opts out of one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory: int | None = Field(
        DEFAULT_MEMORY, description="bytes of memory for all processes together (None: unbounded)"
    )
    swap: int | None = Field(None, description="swap on top of memory (default none)")
    pids: int | None = Field(DEFAULT_PIDS, ge=1, description="processes and threads at once")
    cpus: float | None = Field(None, gt=0, description="CPU time per wall second, e.g. 1.5")
    disk: int | None = Field(DEFAULT_DISK, description="bytes the writable layer holds (None: unbounded)")
    inodes: int | None = Field(
        DEFAULT_INODES, ge=64, description="files, directories and links the writable layer and tmpfs may hold"
    )
    file_size: int | None = Field(None, description="largest file a command may write (RLIMIT_FSIZE)")
    open_files: int = Field(65536, ge=16, description="descriptors per process (RLIMIT_NOFILE)")

    @field_validator("memory", "swap", "disk", "file_size", mode="before")
    @classmethod
    def _sizes(cls, v: int | str | None) -> int | None:
        return None if v is None else parse_size(v)


SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+@-]{0,127}")  # a durable snapshot's name (snapshots.py)
SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{12}")  # and the id it is given


class SandboxConfig(BaseModel):
    """Everything that shapes a jail. Unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rootfs: str = Field(
        "host", description='"host" (host /usr etc. read-only), a stored root filesystem\'s name, or a directory'
    )
    snapshot: str | None = Field(
        None,
        description="a durable snapshot's id or name (Sandbox.snapshot()) to start from, over the root "
        "filesystem it was made over",
    )
    mounts: list[Mount] = Field(default_factory=list)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    hostname: str = "sandbox"
    workdir: str = "/testbed"
    user: str | None = Field(
        None, description="run commands as NAME, UID, NAME:GROUP or UID:GID of the root filesystem (default root)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="added to every command's clean environment")
    upper: Literal["disk", "tmpfs"] = Field("disk", description="where the writable layer lives")
    tmpfs_size: int = Field(1 << 30, description="size cap of a tmpfs writable layer")
    userns: bool = Field(True, description="False (root only) runs without a user namespace")
    idmap: Literal["auto", "single", "full"] = Field("auto", description="full: all subordinate ids (apt, pip)")
    cap_add: tuple[str, ...] = Field(
        (), description="capabilities uid 0 gets on top of the default (names from capabilities(7), or ALL)"
    )
    cap_drop: tuple[str, ...] = Field((), description="capabilities uid 0 loses from the default (or ALL)")
    ca_certs: list[Path] = Field(
        default_factory=list,
        description="PEM files of CA certificates the jail's TLS clients trust on top of the root filesystem's "
        "(appended to its system bundle and pip's, in the writable layer)",
    )
    secrets: list[Secret] = Field(
        default_factory=list,
        description="credentials commands see only as placeholders; the allow proxy adds each to HTTPS requests "
        "to its hosts (network allow, a root filesystem)",
    )
    seccomp: SeccompPolicy | None = Field(default_factory=SeccompPolicy, description="None turns it off (warns)")
    limits: Limits = Field(default_factory=Limits)
    output_limit: int = Field(1 << 20, description="bytes kept per stream per exec (head and tail)")
    setup_timeout: float = Field(30.0, gt=0)
    state_dir: Path | None = Field(None, description="default $JAILBOX_STATE_DIR or ~/.local/state/jailbox")

    @field_validator("network", mode="before")
    @classmethod
    def _network(cls, v: Any) -> Any:
        return fields_of(v) if isinstance(v, str) else v

    @field_validator("cap_add", "cap_drop", mode="before")
    @classmethod
    def _caps(cls, v: Any) -> tuple[str, ...]:
        return capability_names((v,) if isinstance(v, str) else v)

    @field_validator("cap_drop")
    @classmethod
    def _caps_disagree_nowhere(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        both = [name for name in v if name in info.data.get("cap_add", ())]
        if both:
            raise ValueError(
                f"{both[0]} is in cap_add too: a capability is added or dropped (e.g. cap_drop ALL, cap_add CHOWN)"
            )
        return v

    @field_validator("ca_certs")
    @classmethod
    def _ca_certs(cls, v: list[Path], info: ValidationInfo) -> list[Path]:
        if v and info.data.get("rootfs") == "host":
            raise ValueError(
                "the host rootfs trusts the host's own CAs (its /etc is the host's, read-only); extra CA "
                "certificates need a root filesystem, e.g. rootfs='default'"
            )
        v = [p.expanduser().absolute() for p in v]
        cacerts.bundle(v)
        return v

    @model_validator(mode="after")
    def _secrets_have_a_home(self) -> SandboxConfig:
        if not self.secrets:
            return self
        check_secrets(self.secrets)
        if self.network.mode not in ("allow", "full"):
            raise ValueError(
                "secrets are added by jailbox's proxy: set network='allow:HOST,...' naming their hosts, or "
                f"'full' (with {self.network.mode!r} networking the jail's requests would not pass through it)"
            )
        if self.rootfs == "host":
            raise ValueError(
                "secrets need a root filesystem, whose bundles get the sandbox's CA (the host rootfs's /etc is "
                "the host's, read-only), e.g. rootfs='default'"
            )
        rules = Rules(self.network.allow, self.network.deny) if self.network.mode == "allow" else Rules(("*:*",), ())
        for secret in self.secrets:
            for host in secret.hosts:
                if not rules.check_name(host, 443)[0]:
                    raise ValueError(
                        f"secret {secret.name} is bound to {host}, which the network rules do not allow; "
                        f"allow it, e.g. network='allow:{host}'"
                    )
        clash = sorted({s.name for s in self.secrets} & set(self.env))
        if clash:
            raise ValueError(f"{clash[0]} is both a secret and an env variable; keep it in one")
        return self

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, v: str) -> str:
        if not _HOSTNAME.match(v):
            raise ValueError(f"{v!r} is not a valid hostname (letters, digits, '-', at most 63)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        v = jail_path(v)
        if v in ("/", "/proc", "/dev", "/sys", "/tmp"):
            raise ValueError(f"workdir {v} is reserved")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not _USER.match(v):
            raise ValueError(f"user {v!r}: expected NAME, UID, NAME:GROUP or UID:GID")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("tmpfs_size", "output_limit", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_size(v)

    @field_validator("snapshot")
    @classmethod
    def _snapshot(cls, v: str | None) -> str | None:
        if v is not None and not (SNAPSHOT_ID.fullmatch(v) or SNAPSHOT_NAME.fullmatch(v)):
            raise ValueError("snapshot must be a snapshot's id or name, e.g. 'snap-0123456789ab' or 'repo-ready'")
        return v

    @field_validator("rootfs")
    @classmethod
    def _rootfs(cls, v: str) -> str:
        if v != "host" and not v.strip():
            raise ValueError('rootfs must be "host", a stored root filesystem name or a directory path')
        return v

    def capabilities(self) -> frozenset[str]:
        """What a command executed as uid 0 holds, in the jail's own user namespace: Docker's default
        set in a root-filesystem sandbox, none on the host rootfs; then ``cap_add``/``cap_drop``
        (``ALL`` in cap_add starts from every capability, in cap_drop from none). Without a user
        namespace (``userns=False``) they would be the host's: none unless added."""
        caps = set(DOCKER_CAPS) if self.rootfs != "host" and self.userns else set()
        if "ALL" in self.cap_add:
            caps = set(CAPABILITIES)
        elif "ALL" in self.cap_drop:
            caps = set()
        caps -= set(self.cap_drop)
        caps |= set(self.cap_add) - {"ALL"}
        return frozenset(caps)

    @model_validator(mode="after")
    def _distinct_mounts(self) -> SandboxConfig:
        seen = set()
        for m in self.mounts:
            if m.dst in seen:
                raise ValueError(f"two mounts target {m.dst}")
            seen.add(m.dst)
        return self


def check_env(env: dict[str, str]) -> dict[str, str]:
    for k, val in env.items():
        if not _ENV_NAME.match(k):
            raise ValueError(f"environment variable name {k!r} is invalid")
        if "\0" in val:
            raise ValueError(f"environment variable {k} contains a NUL byte")
    return env
