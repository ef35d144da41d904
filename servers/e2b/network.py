"""A sandbox's own network as E2B's API asks for it, under the server's ``--network``.

Runs in the serving host process, on a request's thread. ``Sandbox.create(allow_internet_access=...,
network={"allow_out": [...], "deny_out": [...]})`` and ``sandbox.update_network(...)`` (the wire's
``allow_internet_access`` and ``network.allowOut``/``denyOut``; the update's the same at its top level)
become a jailbox ``NetworkPolicy``. E2B's meaning: every destination is reachable unless ``denyOut``
lists it (``0.0.0.0/0`` meaning all, which ``allow_internet_access=False`` stands for), and an entry of
``allowOut`` (an IP address, a CIDR, a domain, ``*.domain``) is reachable even when ``denyOut`` covers
it. An update replaces the whole ask; nothing asked means "everything", and so does
``allow_internet_access=True``, E2B's default, which older SDKs send with every create.

The server's ``--network`` is a ceiling: the policy made is never wider than it. "Everything" means
what the operator allowed; an ``allowOut`` entry outside it is refused (403, naming the flag the
operator would have to widen), never quietly granted; the operator's deny rules win over any of the
caller's allow entries. Under ``allow`` the result is the ceiling's rules narrowed (an entry meets
the rule that covers it: the narrower name or network, the ports both allow), under ``full`` or
``host`` an ``allow`` jail of the caller's entries (names on any port, through the proxy; never the
host's LAN under ``full``), or ``none`` for "nothing". ``ask`` and ``policy`` bound and check all of it
before a jail is touched: at most ``NETWORK_RULES_MAX`` entries a list, ``NETWORK_RULE_MAX`` characters an
entry, and the policy made is validated (and so bounded) again as any policy is.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ...sandbox import NetworkPolicy
from ...sandbox.serving import (
    NETWORK_RULE_MAX,
    NETWORK_RULES_MAX,
    IPNetwork,
    Ports,
    Rules,
    first_error,
    lan_networks,
    normalize_host,
)
from .errors import ServeError

ALL_TRAFFIC = ("0.0.0.0/0", "::/0")
"""Entries that mean every destination (the SDK's ``ALL_TRAFFIC`` is the first)."""
EVERY_PORT: Ports = ((1, 65535),)
NAME_PORTS: Ports = ((80, 80), (443, 443))
"""A domain entry's ports: E2B filters domains on HTTP (80) and TLS (443) only."""


@dataclass(frozen=True)
class Ask:
    """What a caller asked for, checked: ``internet`` as sent (None: not sent); each list None if not
    sent, else its entries as IP networks or host patterns (``*.domain``)."""

    internet: bool | None = None
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None

    @property
    def empty(self) -> bool:
        return self.internet is None and self.allow is None and self.deny is None

    def record(self) -> dict[str, object]:
        """As kept with a paused sandbox across a server's stop (and read back by ``ask``)."""
        return {"allow_internet_access": self.internet, "allowOut": self.allow, "denyOut": self.deny}


def ask(internet: object, allow: object, deny: object, where: str) -> Ask:
    """Check a request's fields (``where``: how the request names their object, for errors)."""
    if internet is not None and not isinstance(internet, bool):
        raise ServeError(400, 'allow_internet_access must be true or false, e.g. {"allow_internet_access": false}')
    return Ask(
        internet, _entries(allow, f"{where}allowOut", names=True), _entries(deny, f"{where}denyOut", names=False)
    )


def from_create(body: dict) -> Ask:
    """``POST /sandboxes``: ``allow_internet_access`` and ``network``'s lists."""
    network = body.get("network")
    if network is not None and not isinstance(network, dict):
        raise ServeError(400, 'network must be an object, e.g. {"network": {"denyOut": ["0.0.0.0/0"]}}')
    network = network or {}
    _unserved(network, "network.")
    return ask(body.get("allow_internet_access"), network.get("allowOut"), network.get("denyOut"), "network.")


def from_update(body: dict) -> Ask:
    """``PUT /sandboxes/{id}/network``: the same fields at the top level; an empty body asks for
    everything (an update replaces the whole configuration)."""
    _unserved(body, "")
    return ask(body.get("allow_internet_access"), body.get("allowOut"), body.get("denyOut"), "")


def _unserved(fields: dict, where: str) -> None:
    """Refuse what would change how traffic leaves that the proxy does not do (per-host header
    transforms, a SOCKS5 egress proxy): a caller relying on one learns so, rather than having it
    dropped. The rest of E2B's fields (DNS servers, public traffic, host masking, HTTPS ports) mean
    nothing here: no sandbox has a public URL, and names resolve on the host."""
    for name, what in (("rules", "per-host transform rules"), ("egressProxy", "an egress proxy")):
        if fields.get(name):
            raise ServeError(400, f"{where}{name}: {what} are not served by jailbox (use allowOut and denyOut)")


def _entries(value: object, field: str, names: bool) -> tuple[str, ...] | None:
    if value is None:
        return None
    example = '["api.example.com", "10.0.0.0/8"]' if names else '["0.0.0.0/0"]'
    if not isinstance(value, list) or len(value) > NETWORK_RULES_MAX:
        raise ServeError(400, f"{field} must be a list of at most {NETWORK_RULES_MAX} strings, e.g. {example}")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not 0 < len(entry) <= NETWORK_RULE_MAX:
            raise ServeError(
                400, f"{field}[{i}] must be a string of 1 to {NETWORK_RULE_MAX} characters, e.g. {example}"
            )
        try:
            out.append(str(ipaddress.ip_network(entry, strict=False) if "/" in entry else ipaddress.ip_address(entry)))
            continue
        except ValueError:
            if entry.replace(".", "").replace("/", "").isdigit() or ":" in entry:
                raise ServeError(
                    400, f"{field}[{i}]: {entry[:80]!r} is not a valid IP address or CIDR, e.g. {example}"
                ) from None
        if not names:
            raise ServeError(
                400,
                f"{field}[{i}]: {entry[:80]!r} is not an IP address or CIDR (E2B's deny entries are), e.g. {example}",
            )
        try:
            out.append("*." + normalize_host(entry[2:]) if entry.startswith("*.") else normalize_host(entry))
        except ValueError:
            raise ServeError(
                400, f"{field}[{i}]: {entry[:80]!r} is not an IP address, CIDR, domain or *.domain, e.g. {example}"
            ) from None
        if "." not in out[-1] or "*" in out[-1][1:]:
            raise ServeError(400, f"{field}[{i}]: {entry[:80]!r} needs a domain, e.g. {example}")
    return tuple(dict.fromkeys(out))


def _net(entry: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(entry)
    except ValueError:
        return None


def _covers(outer: str, inner: str) -> bool:
    """Whether host pattern ``outer`` (``*``, ``*.d``, a name) matches every name ``inner`` does."""
    return outer == "*" or outer == inner or (outer.startswith("*.") and inner.endswith(outer[1:]))


def _ports(a: Ports, b: Ports) -> Ports:
    return tuple((max(x[0], y[0]), min(x[1], y[1])) for x in a for y in b if max(x[0], y[0]) <= min(x[1], y[1]))


def _rule(dest: str, ports: Ports) -> str:
    text = "*" if ports == EVERY_PORT else "+".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ports)
    return f"[{dest}]:{text}" if ":" in dest else f"{dest}:{text}"


def _meet(entry: str, ceiling: Rules) -> list[str]:
    """``entry`` as the ceiling's allow rules let it through: for each rule it meets, the narrower
    destination on the ports both allow."""
    net = _net(entry)
    mine = EVERY_PORT if net is not None else NAME_PORTS
    out = []
    for pattern, _, theirs, ports in ceiling.allow:
        both = _ports(mine, ports)
        if not both:
            continue
        if net is not None and theirs is not None and net.version == theirs.version:
            if net.subnet_of(theirs):  # type: ignore[arg-type]
                out.append(_rule(str(net), both))
            elif theirs.subnet_of(net):  # type: ignore[arg-type]
                out.append(_rule(str(theirs), both))
        elif net is None and theirs is None:
            if _covers(pattern, entry):
                out.append(_rule(entry, both))
            elif _covers(entry, pattern):
                out.append(_rule(pattern, both))
    return list(dict.fromkeys(out))


def _inside(entry: str, deny: Rules) -> bool:
    """Whether one of the operator's deny rules takes all of ``entry``: asked for, it could never be reached."""
    net = _net(entry)
    mine = EVERY_PORT if net is not None else NAME_PORTS
    for pattern, _, theirs, ports in deny.deny:
        if _ports(mine, ports) != mine:
            continue
        if net is not None and theirs is not None and net.version == theirs.version:
            if net.subnet_of(theirs):  # type: ignore[arg-type]
                return True
        elif net is None and theirs is None and _covers(pattern, entry):
            return True
    return False


def _past(entry: str, ceiling: NetworkPolicy) -> ServeError:
    """403 for an ``allowOut`` entry past the server's network."""
    now = (
        f"allow:{','.join((*ceiling.allow, *('!' + d for d in ceiling.deny)))}"
        if ceiling.mode == "allow"
        else ceiling.mode
    )
    wider = "allow:" + (_rule(entry, EVERY_PORT) if _net(entry) is not None else entry)
    return ServeError(
        403,
        f"allowOut {entry!r} is past what this server lets its sandboxes reach (its --network is {now}): the operator "
        f"must widen --network, e.g. jailbox serve --network {wider}",
    )


def _denied(deny: tuple[str, ...], allow: tuple[str, ...]) -> list[str]:
    """E2B's deny entries less what its allow entries take back (allow wins there): a deny range
    inside an allowed one is dropped, an allowed range inside a denied one is cut out of it."""
    allowed = [n for n in (_net(a) for a in allow) if n is not None]
    out: list[str] = []
    work = 0  # ranges compared: bounded, whatever the lists (each within its own bound) make of each other
    for entry in deny:
        pieces: list[IPNetwork] = [ipaddress.ip_network(entry)]
        for hole in allowed:
            work += len(pieces)
            if work > NETWORK_RULES_MAX**2:
                raise ServeError(400, "denyOut and allowOut cut each other into too many ranges: list fewer entries")
            nxt: list[IPNetwork] = []
            for piece in pieces:
                if piece.version != hole.version or not piece.overlaps(hole):
                    nxt.append(piece)
                elif hole.subnet_of(piece) and hole != piece:  # type: ignore[arg-type]
                    nxt += piece.address_exclude(hole)  # type: ignore[arg-type]
            pieces = nxt
            if len(out) + len(pieces) > NETWORK_RULES_MAX:
                raise ServeError(
                    400, f"denyOut less allowOut is more than {NETWORK_RULES_MAX} ranges: list fewer, wider entries"
                )
        out += (str(p) for p in pieces)
    return out


def policy(wanted: Ask, ceiling: NetworkPolicy, built: str | None = None) -> NetworkPolicy:
    """The policy ``wanted`` gets under ``ceiling`` (403 for an entry past it). ``built``: the mode of
    the running jail it is for (an update), whose mode cannot change: 409 if it would have to."""
    everything_denied = wanted.internet is False or any(d in ALL_TRAFFIC for d in wanted.deny or ())
    allow = wanted.allow or ()
    allow_all = any(a in ALL_TRAFFIC for a in allow)
    allow = tuple(a for a in allow if a not in ALL_TRAFFIC)
    deny = () if everything_denied or allow_all else _denied(wanted.deny or (), allow)  # allow wins, as on E2B
    nothing = everything_denied and not allow and not allow_all
    if ceiling.mode == "none":
        if wanted.allow:  # allow_internet_access=True is E2B's default (older SDKs send it): "everything"
            raise _past(wanted.allow[0], ceiling)
        made = ceiling
    elif ceiling.mode == "allow":
        rules, denied = Rules(ceiling.allow, ()), Rules((), ceiling.deny)
        met = []
        for entry in allow:
            got = _meet(entry, rules)
            if not got or _inside(entry, denied):
                raise _past(entry, ceiling)
            met += got
        if not everything_denied or allow_all:
            made = _allow(ceiling.allow, (*ceiling.deny, *deny), ceiling)
        else:
            made = _allow(tuple(dict.fromkeys(met)), ceiling.deny, ceiling)
    else:
        lan = tuple(str(n) for n in ceiling.lan)
        if ceiling.mode == "full":
            for entry in allow:
                net = _net(entry)
                if net is not None and _reaches_lan(net, ceiling.lan):
                    raise _past(entry, ceiling)
        # "everything" as an allow jail's rules: under host every address too; under full only the LAN it lists
        anywhere = ("*:*", *(_rule(n, EVERY_PORT) for n in (ALL_TRAFFIC if ceiling.mode == "host" else lan)))
        if nothing:
            made = NetworkPolicy(mode="none")
        elif (not everything_denied or allow_all) and not deny and built != "allow":
            made = ceiling
        elif not everything_denied or allow_all:
            made = _allow(anywhere, tuple(deny), ceiling)
        else:
            made = _allow(tuple(_rule(a, EVERY_PORT) if _net(a) else a for a in allow), (), ceiling)
    if nothing and built == "allow" and made.mode == "none":
        made = _allow((), (), ceiling)
    if built is not None and made.mode != built:
        raise ServeError(
            409,
            f"this sandbox was made with network {built!r} (the server's --network is {ceiling.mode!r}); "
            f"it cannot become {made.mode!r} while it runs: create a new sandbox with network= instead",
        )
    return made


def _reaches_lan(net: IPNetwork, listed: tuple[IPNetwork, ...]) -> bool:
    """Whether ``net`` takes in some of the host's loopback or LAN that ``full`` keeps out (all but
    what its ``lan`` lists)."""
    if any(n.version == net.version and net.subnet_of(n) for n in listed):  # type: ignore[arg-type]
        return False
    return any(n.version == net.version and net.overlaps(n) for n in lan_networks())


def _allow(allow: tuple[str, ...], deny: tuple[str, ...], ceiling: NetworkPolicy) -> NetworkPolicy:
    try:
        return NetworkPolicy(mode="allow", allow=allow, deny=deny, hosts=ceiling.hosts)
    except ValueError as exc:
        raise ServeError(400, f"network: {first_error(exc)}") from None
