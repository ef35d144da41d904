"""A jail's network, host side: what the child sets up, the files and variables the jail gets,
and the proxy attachment or slirp4netns process that lives as long as the jail."""

from __future__ import annotations

import ipaddress
import warnings

from ..errors import SecurityWarning
from .policy import NetworkPolicy, blocked_routes
from .proxy import PROXY, NetworkLogEntry, Tenant
from .slirp import Slirp

PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
SLIRP_NET = ipaddress.IPv4Network("10.0.2.0/24")
SLIRP_DNS = "10.0.2.3"
NO_PROXY = "localhost,127.0.0.1,::1"
RESOLV_CONF_MAX = 64 << 10


def child_spec(policy: NetworkPolicy, userns: bool, keep_caps: bool) -> dict:
    """What the init does in the jail's namespace (see ``sandbox/netns.py``)."""
    full = policy.mode == "full"
    if full and keep_caps:
        warnings.warn(
            "network 'full' with keep_caps=True: commands may delete the routes that keep the host's LAN out",
            SecurityWarning,
            stacklevel=5,
        )
    return {
        "proxy_port": PROXY_PORT if policy.mode == "allow" else 0,
        "slirp": full,
        "userns": userns,
        "unreachable": blocked_routes(policy.lan, SLIRP_NET) if full else [],
    }


def expected_fds(policy: NetworkPolicy, userns: bool) -> int:
    if policy.mode == "allow":
        return 1
    if policy.mode == "full":
        return 2 if userns else 1
    return 0


def files(policy: NetworkPolicy, generated: dict[str, str]) -> dict[str, str]:
    """``generated`` (the jail's /etc files) with the network's resolv.conf and hosts entries."""
    out = dict(generated)
    if policy.mode == "host":  # the host's resolvers, as Docker does, not whatever the rootfs was built with
        host = _host_resolv_conf()
        if host is not None:
            out["etc/resolv.conf"] = host
    elif policy.mode == "allow":
        out["etc/resolv.conf"] = f"# jailbox 'allow' network: names resolve through the proxy ({PROXY_URL})\n"
    elif policy.mode == "full":
        out["etc/resolv.conf"] = f"nameserver {SLIRP_DNS}\n"
        extra = "".join(f"{addr}\t{name}\n" for name, addr in policy.hosts.items())
        out["etc/hosts"] = out.get("etc/hosts", "") + extra
    return out


def _host_resolv_conf() -> str | None:
    try:
        with open("/etc/resolv.conf", "rb") as f:
            return f.read(RESOLV_CONF_MAX).decode(errors="replace")
    except OSError:
        return None


def env(policy: NetworkPolicy) -> dict[str, str]:
    """Proxy settings for curl, Python (urllib, requests, pip), git, apt and most other clients."""
    if policy.mode != "allow":
        return {}
    out = {}
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        out[name] = out[name.upper()] = PROXY_URL
    out["no_proxy"] = out["NO_PROXY"] = NO_PROXY
    out["PIP_PROXY"] = PROXY_URL
    out.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.proxy", GIT_CONFIG_VALUE_0=PROXY_URL)
    return out


class Network:
    """The live part of a jail's network: a proxy tenant (allow) or a slirp4netns process (full)."""

    def __init__(self, sandbox_id: str, policy: NetworkPolicy, fds: list[int], timeout: float) -> None:
        self.tenant: Tenant | None = None
        self.slirp: Slirp | None = None
        self.closed = False
        if policy.mode == "allow":
            self.tenant = PROXY.attach(sandbox_id, fds[0], policy)
        elif policy.mode == "full":
            self.slirp = Slirp(fds, policy.publish, timeout)

    def log(self) -> list[NetworkLogEntry]:
        """Every request so far (kept after ``close()``)."""
        return PROXY.log(self.tenant) if self.tenant is not None else []

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tenant is not None:
            PROXY.detach(self.tenant)
        if self.slirp is not None:
            self.slirp.close()
