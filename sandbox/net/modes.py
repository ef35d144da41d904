"""A jail's network, host side: one object per mode (none, host, allow, full) owns what the child
sets up (its ``NetSpec``, descriptors included), the files and variables the jail gets, and the
proxy attachment or slirp4netns process that lives as long as the jail."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from ..child.spec import NetSpec
from .policy import NetworkPolicy, blocked_routes, host_resolv_conf
from .slirp import Slirp

if TYPE_CHECKING:  # the proxy is imported by the modes that use it: exec with --network none never loads it
    from .proxy import NetworkLogEntry, Tenant
    from .secrets import Vault

PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
SLIRP_NET = ipaddress.IPv4Network("10.0.2.0/24")
SLIRP_DNS = "10.0.2.3"
NO_PROXY = "localhost,127.0.0.1,::1"


class Mode:
    """One network mode: everything the rest of jailbox asks about it, decided once by ``for_policy``.

    The default is a mode of its own namespace with nothing in it but loopback (``none``)."""

    def __init__(self, policy: NetworkPolicy, vault: Vault | None = None) -> None:
        self.policy = policy
        self.vault = vault  # the sandbox's secrets (allow only: config validation sees to it)

    def child_spec(self, userns: bool) -> NetSpec:
        """What the init does in the jail's namespace (``child/netns.py``), and which descriptors it
        hands back, in order."""
        return NetSpec(new_netns=True, proxy_port=0, namespaces=(), unreachable=())

    def files(self, generated: dict[str, str]) -> dict[str, str]:
        """``generated`` (the jail's /etc files) with the network's resolv.conf and hosts entries."""
        return dict(generated)

    def env(self) -> dict[str, str]:
        """Variables every command of the jail gets."""
        return {}

    def attach(self, sandbox_id: str, fds: list[int], timeout: float) -> Network:
        """The host side that lives as long as the jail; takes ownership of ``fds`` (the child
        spec's descriptors, in its order)."""
        return Network()


class NoNetwork(Mode):
    """``none``: an empty namespace of its own (loopback only)."""


class HostNetwork(Mode):
    """``host``: the host's own namespace."""

    def child_spec(self, userns: bool) -> NetSpec:
        return NetSpec(new_netns=False, proxy_port=0, namespaces=(), unreachable=())

    def files(self, generated: dict[str, str]) -> dict[str, str]:
        out = dict(generated)
        host = host_resolv_conf()  # the host's resolvers, as Docker does, not whatever the rootfs was built with
        if host is not None:
            out["etc/resolv.conf"] = host
        return out


class AllowNetwork(Mode):
    """``allow``: an own namespace whose only way out is the host proxy, through a listener on the
    jail's loopback that the proxy accepts on."""

    def child_spec(self, userns: bool) -> NetSpec:
        return NetSpec(new_netns=True, proxy_port=PROXY_PORT, namespaces=(), unreachable=())

    def files(self, generated: dict[str, str]) -> dict[str, str]:
        return {
            **generated,
            "etc/resolv.conf": f"# jailbox 'allow' network: names resolve through the proxy ({PROXY_URL})\n",
        }

    def env(self) -> dict[str, str]:
        """Proxy settings for curl, Python (urllib, requests, pip), git, apt and most other clients."""
        out = {}
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            out[name] = out[name.upper()] = PROXY_URL
        out["no_proxy"] = out["NO_PROXY"] = NO_PROXY
        out["PIP_PROXY"] = PROXY_URL
        out.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.proxy", GIT_CONFIG_VALUE_0=PROXY_URL)
        return out

    def attach(self, sandbox_id: str, fds: list[int], timeout: float) -> Network:
        (listener,) = fds
        from .proxy import PROXY

        return Network(tenant=PROXY.attach(sandbox_id, listener, self.policy, self.vault))


class FullNetwork(Mode):
    """``full``: an own namespace with a user-mode stack (slirp4netns, which joins the namespace
    through the descriptors the init hands over); the host's LAN is routed unreachable, and whatever
    passes the routes (a root with CAP_NET_RAW or CAP_NET_ADMIN) is checked again where slirp4netns
    meets the host (``egress.py``)."""

    def child_spec(self, userns: bool) -> NetSpec:
        return NetSpec(
            new_netns=True,
            proxy_port=PROXY_PORT if self.vault is not None else 0,  # the secrets' way out (``env``)
            namespaces=("net", "user") if userns else ("net",),  # slirp4netns joins the user namespace too
            unreachable=tuple(blocked_routes(self.policy.lan, SLIRP_NET)),
        )

    def env(self) -> dict[str, str]:
        """With secrets, HTTPS goes through the proxy, which adds them for their hosts and lets
        everything else through as ``full`` does (no loopback, LAN or host address but ``lan``'s);
        a client that ignores the variables reaches its host directly, with the placeholder."""
        if self.vault is None:
            return {}
        return {"https_proxy": PROXY_URL, "HTTPS_PROXY": PROXY_URL, "no_proxy": NO_PROXY, "NO_PROXY": NO_PROXY}

    def files(self, generated: dict[str, str]) -> dict[str, str]:
        extra = "".join(f"{addr}\t{name}\n" for name, addr in self.policy.hosts.items())
        return {
            **generated,
            "etc/resolv.conf": f"nameserver {SLIRP_DNS}\n",
            "etc/hosts": generated.get("etc/hosts", "") + extra,
        }

    def attach(self, sandbox_id: str, fds: list[int], timeout: float) -> Network:
        if self.vault is None:
            return Network(slirp=Slirp(fds, self.policy.publish, self.policy.lan, timeout))
        from .proxy import PROXY

        listener, *namespaces = fds
        anywhere = NetworkPolicy.model_construct(  # full's reach, as the proxy's rules: every name, every port
            mode="allow", allow=("*:*", *(str(net) for net in self.policy.lan)), deny=(), hosts=self.policy.hosts
        )
        tenant = PROXY.attach(sandbox_id, listener, anywhere, self.vault)
        try:
            return Network(tenant=tenant, slirp=Slirp(namespaces, self.policy.publish, self.policy.lan, timeout))
        except BaseException:
            PROXY.detach(tenant)
            raise


MODES: dict[str, type[Mode]] = {"none": NoNetwork, "host": HostNetwork, "allow": AllowNetwork, "full": FullNetwork}


def for_policy(policy: NetworkPolicy, vault: Vault | None = None) -> Mode:
    """The one place the mode name is looked at."""
    return MODES[policy.mode](policy, vault)


class Network:
    """The live part of a jail's network: a proxy tenant (allow) or a slirp4netns process (full)."""

    def __init__(self, tenant: Tenant | None = None, slirp: Slirp | None = None) -> None:
        self.tenant = tenant
        self.slirp = slirp
        self.closed = False

    def log(self) -> list[NetworkLogEntry]:
        """Every request so far (kept after ``close()``)."""
        if self.tenant is None:
            return []
        from .proxy import PROXY

        return PROXY.log(self.tenant)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tenant is not None:
            from .proxy import PROXY

            PROXY.detach(self.tenant)
        if self.slirp is not None:
            self.slirp.close()
