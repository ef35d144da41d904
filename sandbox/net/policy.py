"""Network policies: what a jail may reach, validated before any process starts.

``none``: own namespace, loopback only. ``host``: the host's namespace (unconfined).
``allow``: own namespace plus jailbox's filtering proxy; rules are host-name patterns, presets and
IP rules, deny wins. ``full``: own namespace with a user-mode stack (slirp4netns) to anywhere
except the host's loopback and LAN (unless listed in ``lan``), optional published ports.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress, ValidationError, field_validator, model_validator

from ..limits import NETWORK_RULE_MAX, NETWORK_RULES_MAX

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org", "files.pythonhosted.org", "pypi.python.org"),
    "github": ("github.com", "*.github.com", "githubusercontent.com", "*.githubusercontent.com"),
    "debian": ("deb.debian.org", "security.debian.org", "ftp.debian.org", "snapshot.debian.org"),
    "huggingface": ("huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co"),
}
_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
# Never reachable by default: the host's loopback, private and link-local ranges and the like.
# The host's own interface addresses and subnets are added at run time (see ``lan_networks``).
LOCAL_RANGES = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8",
    )
)  # fmt: skip
LAN_RECHECK = 5.0
RESOLV_CONF = "/etc/resolv.conf"
RESOLV_CONF_MAX = 64 << 10
DNS_PORT = 53


def normalize_host(name: str) -> str:
    """Lower case, no trailing dot; raises ValueError for anything that is not a host name."""
    host = name.strip().rstrip(".").lower()
    if not _HOSTNAME.match(host) or len(host) > 253:
        raise ValueError(f"{name!r} is not a valid host name")
    return host


def _ip_rule(text: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None


DEFAULT_PORTS = "80+443"  # an allow rule without ports: plain HTTP and HTTPS only (a deny rule: every port)
_PORTS = re.compile(r"^(\*|\d{1,5}(-\d{1,5})?(\+\d{1,5}(-\d{1,5})?)*)$")


def split_ports(rule: str) -> tuple[str, str | None]:
    """``name[:ports]`` -> (name, ports or None). IPv6 rules with ports are bracketed: ``[::1]:8080``;
    a bare IPv6 address or network (several colons) has no port part."""
    if rule.startswith("["):
        inner, _, rest = rule[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"rule {rule!r}: expected [IPv6]:PORTS")
        return inner, rest[1:] if rest else None
    if rule.count(":") == 1:
        name, _, ports = rule.partition(":")
        return name, ports
    return rule, None


def port_ranges(ports: str) -> tuple[tuple[int, int], ...]:
    """``*``, ``8080``, ``8000-8100`` or several joined by ``+`` (``80+443+8000-8100``) as ranges."""
    if not _PORTS.match(ports):
        raise ValueError(f"ports {ports!r}: expected *, a port, a range LOW-HIGH, or several joined by '+'")
    if ports == "*":
        return ((1, 65535),)
    out = []
    for part in ports.split("+"):
        low, _, high = part.partition("-")
        lo, hi = int(low), int(high or low)
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"ports {ports!r}: {part} is not a port or range between 1 and 65535")
        out.append((lo, hi))
    return tuple(out)


def check_pattern(pattern: str) -> str:
    """A preset name, ``*``, ``*.domain``, ``host.domain``, an IP address or a CIDR, each optionally
    followed by ``:PORTS`` (``*``, ``8080``, ``8000-8100``, ``80+8080``); returned in canonical form."""
    if not isinstance(pattern, str):
        raise ValueError(f"a network rule must be a string such as 'example.com', not {type(pattern).__name__}")
    if not pattern.strip():
        raise ValueError("empty network rule")
    if len(pattern) > NETWORK_RULE_MAX:
        raise ValueError(f"a network rule is at most {NETWORK_RULE_MAX} characters ({pattern[:40]!r}... is longer)")
    text, ports = split_ports(pattern.strip().lower())
    name = _check_name_pattern(pattern, text)
    if ports is None:
        return name
    try:
        port_ranges(ports)
    except ValueError as exc:
        raise ValueError(f"rule {pattern!r}: {exc}") from None
    return f"[{name}]:{ports}" if ":" in name else f"{name}:{ports}"


def _check_name_pattern(pattern: str, text: str) -> str:
    if text in PRESETS or text == "*" or _ip_rule(text) is not None:
        return text
    if text.startswith("*."):
        return "*." + normalize_host(text[2:])
    if "*" in text:
        raise ValueError(f"rule {pattern!r}: a wildcard is only allowed as a leading '*.' (as in '*.example.com')")
    if "." not in text:
        raise ValueError(
            f"rule {pattern!r} is neither a preset ({', '.join(PRESETS)}) nor a host name with a domain "
            "(use an IP rule such as 127.0.0.1 for single-label names)"
        )
    try:
        return normalize_host(text)
    except ValueError:
        raise ValueError(f"rule {pattern!r} is not a preset, host name, *.domain, IP address or CIDR") from None


class PortMapping(BaseModel):
    """A TCP or UDP port of the host forwarded to a port of a ``full`` jail: ``8080:80``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host_port: int = Field(ge=1, le=65535)
    jail_port: int = Field(ge=1, le=65535)
    host_addr: ipaddress.IPv4Address = Field(
        ipaddress.IPv4Address("127.0.0.1"), description="host address to listen on (0.0.0.0 for every interface)"
    )
    proto: Literal["tcp", "udp"] = "tcp"

    @classmethod
    def parse(cls, spec: str) -> PortMapping:
        """``[HOST_ADDR:]HOST_PORT:JAIL_PORT[/tcp|udp]``."""
        text, _, proto = spec.partition("/")
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts[-2:]):
            raise ValueError(f"publish {spec!r}: expected [HOST_ADDR:]HOST_PORT:JAIL_PORT[/tcp|udp]")
        fields: dict = {"host_port": int(parts[-2]), "jail_port": int(parts[-1]), "proto": proto or "tcp"}
        if len(parts) == 3:
            fields["host_addr"] = parts[0]
        return cls(**fields)


class NetworkPolicy(BaseModel):
    """Where the jail may connect: ``NetworkPolicy(mode="allow", allow=("pypi", "*.example.com"))``.

    The string forms ``"none"``, ``"host"``, ``"full"`` and ``"allow:pypi,github,!gist.github.com"``
    (``!`` marks a deny rule) are accepted wherever a policy is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["none", "host", "allow", "full"] = "none"
    allow: tuple[str, ...] = Field((), description="allow mode: presets, host patterns, IP addresses or CIDRs")
    deny: tuple[str, ...] = Field((), description="allow mode: same syntax; a deny rule wins over any allow rule")
    hosts: dict[str, IPvAnyAddress] = Field(
        default_factory=dict, description="name -> address: the proxy's resolver (allow), /etc/hosts (full)"
    )
    lan: tuple[IPNetwork, ...] = Field((), description="full mode: LAN or host addresses the jail may reach")
    publish: tuple[PortMapping, ...] = Field((), description="full mode: host ports forwarded into the jail")

    @field_validator("allow", "deny", mode="before")
    @classmethod
    def _patterns(cls, v: object) -> object:
        if isinstance(v, str):
            v = (v,)
        if isinstance(v, (list, tuple)) and len(v) > NETWORK_RULES_MAX:
            raise ValueError(f"at most {NETWORK_RULES_MAX} rules each for allow and deny ({len(v)} given)")
        return tuple(check_pattern(p) for p in v) if isinstance(v, (list, tuple)) else v

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, v: object) -> object:
        return {normalize_host(k): a for k, a in v.items()} if isinstance(v, dict) else v

    @field_validator("publish", mode="before")
    @classmethod
    def _publish(cls, v: object) -> object:
        if isinstance(v, (str, PortMapping, dict)):
            v = (v,)
        if isinstance(v, (list, tuple)):
            return tuple(PortMapping.parse(p) if isinstance(p, str) else p for p in v)
        return v

    @model_validator(mode="after")
    def _fits_mode(self) -> NetworkPolicy:
        if self.mode != "allow" and (self.allow or self.deny):
            raise ValueError(f"allow and deny rules need mode 'allow' (mode is {self.mode!r})")
        if self.mode != "full" and (self.lan or self.publish):
            raise ValueError(f"lan and publish need mode 'full' (mode is {self.mode!r})")
        if self.mode in ("none", "host") and self.hosts:
            raise ValueError(f"hosts needs mode 'allow' or 'full' (mode is {self.mode!r})")
        seen = set()
        for p in self.publish:
            key = (p.host_addr, p.host_port, p.proto)
            if key in seen:
                raise ValueError(f"host port {p.host_port}/{p.proto} is published twice")
            seen.add(key)
        return self

    @classmethod
    def parse(cls, text: str) -> NetworkPolicy:
        """``none``, ``host``, ``full`` or ``allow:RULE,RULE,!DENIED``."""
        return cls(**fields_of(text))


def first_error(exc: ValueError) -> str:
    """One line for a refused policy: a validation error's first complaint, with the field it names."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        text = error["msg"].removeprefix("Value error, ")
        return f"{where}: {text}"[:300] if where else text[:300]
    return str(exc)[:300]


def fields_of(text: str) -> dict:
    """The fields a policy string stands for (validated by the model, so errors name the field)."""
    mode, sep, rest = text.strip().partition(":")
    if mode != "allow":
        if sep:
            raise ValueError(f"network {text!r}: only 'allow:' takes rules (none, host, full, allow:RULES)")
        return {"mode": mode}
    rules = [r.strip() for r in rest.split(",") if r.strip()]
    return {
        "mode": "allow",
        "allow": tuple(r for r in rules if not r.startswith("!")),
        "deny": tuple(r[1:] for r in rules if r.startswith("!")),
    }


Ports = tuple[tuple[int, int], ...]
Compiled = list[tuple[str, str, IPNetwork | None, Ports]]  # (name pattern, rule as written, IP rule's network, ports)


class Rules:
    """Allow and deny rules compiled for matching; every verdict names the rule that decided it."""

    def __init__(self, allow: tuple[str, ...], deny: tuple[str, ...]) -> None:
        self.allow = _compile(allow, DEFAULT_PORTS)
        self.deny = _compile(deny, "*")
        self.summary = ", ".join(allow) or "nothing"

    def check_name(self, host: str, port: int) -> tuple[bool, str]:
        """Verdict on a host name (not an address) and port: (allowed, the rule or why)."""
        rule = _match_name(self.deny, host, port)
        if rule is not None:
            return False, f"denied by rule {rule!r}"
        rule = _match_name(self.allow, host, port)
        if rule is not None:
            return True, f"allowed by rule {rule!r}"
        other = _match_name(self.allow, host, None)
        if other is not None:
            return False, f"port {port} of {host} is not allowed by rule {other!r} (name the port: {host}:{port})"
        return False, f"{host} is not in the allow list ({self.summary})"

    def check_address(self, addr: IPAddress, port: int) -> tuple[bool, str]:
        """Verdict on a literal address in a request: only IP rules match it."""
        rule = _match_ip(self.deny, addr, port)
        if rule is not None:
            return False, f"{addr} denied by rule {rule!r}"
        rule = _match_ip(self.allow, addr, port)
        if rule is not None:
            return True, f"allowed by rule {rule!r}"
        other = _match_ip(self.allow, addr, None)
        if other is not None:
            return False, f"port {port} of {addr} is not allowed by rule {other!r}"
        return False, f"{addr} is not in the allow list ({self.summary})"

    def check_resolved(self, addr: IPAddress, pinned: bool) -> tuple[bool, str]:
        """Verdict on an address an allowed name resolved to (``pinned``: from the hosts mapping).
        Local addresses need an IP rule or the mapping, so DNS cannot point the jail at the host.
        The port was decided with the name."""
        rule = _match_ip(self.deny, addr, None)
        if rule is not None:
            return False, f"{addr} denied by rule {rule!r}"
        if pinned or _match_ip(self.allow, addr, None) is not None or not is_local(addr):
            return True, ""
        return False, f"resolves to {addr}, a loopback, private or host address (allow it with an IP rule)"


def _compile(rules: tuple[str, ...], default_ports: str) -> Compiled:
    out: Compiled = []
    for rule in rules:
        name, ports = split_ports(rule)
        ranges = port_ranges(ports if ports is not None else default_ports)
        for item in PRESETS.get(name, (name,)):
            net = _ip_rule(item)
            label = f"{rule} ({item})" if name in PRESETS else rule
            out.append(("ip", label, net, ranges) if net is not None else (item, label, None, ranges))
    return out


def _in(port: int | None, ranges: Ports) -> bool:
    return port is None or any(lo <= port <= hi for lo, hi in ranges)


def _match_name(rules: Compiled, host: str, port: int | None) -> str | None:
    """The first rule naming ``host`` on ``port`` (None: on any port)."""
    for pattern, label, net, ranges in rules:
        if net is not None or not _in(port, ranges):
            continue
        if pattern == "*" or pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return label
    return None


def _match_ip(rules: Compiled, addr: IPAddress, port: int | None) -> str | None:
    for _, label, net, ranges in rules:
        if net is not None and net.version == addr.version and addr in net and _in(port, ranges):
            return label
    return None


def is_local(addr: IPAddress) -> bool:
    """Loopback, private, link-local or one of the host's own networks."""
    return any(addr.version == n.version and addr in n for n in lan_networks())


def lan_networks() -> tuple[IPNetwork, ...]:
    return _lan_networks(int(time.monotonic() / LAN_RECHECK))


@functools.lru_cache(maxsize=1)
def _lan_networks(_epoch: int) -> tuple[IPNetwork, ...]:
    """LOCAL_RANGES plus every address of the host's interfaces and the subnet it sits in."""
    import psutil

    found: list[IPNetwork] = list(LOCAL_RANGES)
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if not a.netmask or a.family.name not in ("AF_INET", "AF_INET6"):
                continue
            try:
                net = ipaddress.ip_network(f"{a.address.split('%')[0]}/{a.netmask}", strict=False)
                found += [net, ipaddress.ip_network(a.address.split("%")[0])]
            except ValueError:
                continue
    return tuple(found)


def full_refuses(addr: IPAddress, port: int, allowed: tuple[IPNetwork, ...]) -> bool:
    """Whether a ``full`` jail's traffic may not go to ``addr``:``port`` on the host's side: the host's
    loopback always; the LAN (``lan_networks``) unless ``allowed`` lists it; except port 53 of the
    host's own resolvers, which slirp4netns forwards the jail's DNS (10.0.2.3) to."""
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    if mapped is not None:  # an IPv6 socket reaches IPv4 through these
        addr = mapped
    if not addr.is_loopback and (not is_local(addr) or any(addr.version == n.version and addr in n for n in allowed)):
        return False
    return port != DNS_PORT or addr not in host_resolvers()


def host_resolvers() -> frozenset[IPAddress]:
    """The nameservers of the host's resolv.conf (what slirp4netns forwards the jail's DNS to)."""
    return _host_resolvers(int(time.monotonic() / LAN_RECHECK))


@functools.lru_cache(maxsize=1)
def _host_resolvers(_epoch: int) -> frozenset[IPAddress]:
    found: set[IPAddress] = set()
    for line in (host_resolv_conf() or "").splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                found.add(ipaddress.ip_address(words[1].split("%")[0]))
            except ValueError:
                continue
    return frozenset(found)


def host_resolv_conf() -> str | None:
    """The host's resolv.conf (its first ``RESOLV_CONF_MAX`` bytes), None if unreadable."""
    try:
        with open(RESOLV_CONF, "rb") as f:
            return f.read(RESOLV_CONF_MAX).decode(errors="replace")
    except OSError:
        return None


def blocked_routes(allowed: tuple[IPNetwork, ...], keep: IPNetwork) -> list[str]:
    """IPv4 prefixes a ``full`` jail gets unreachable routes for: the LAN minus ``allowed`` and
    minus ``keep`` (slirp4netns's own subnet, where its gateway and DNS live)."""
    blocked = [n for n in ipaddress.collapse_addresses(n for n in lan_networks() if n.version == 4)]
    for hole in (*[a for a in allowed if a.version == 4], keep):
        nxt: list[ipaddress.IPv4Network] = []
        for net in blocked:
            if hole.subnet_of(net):  # type: ignore[arg-type]
                nxt += net.address_exclude(hole)  # type: ignore[arg-type]
            elif not net.subnet_of(hole):  # type: ignore[arg-type]
                nxt.append(net)
        blocked = nxt
    return [str(n) for n in ipaddress.collapse_addresses(blocked) if not n.is_loopback]
