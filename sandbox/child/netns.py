"""Child side: shape the jail's own network namespace before any untrusted code runs.

Reads only the typed ``NetSpec`` the host's network mode (``net/modes.py``) wrote: a listening TCP
socket on the jail's 127.0.0.1 handed to the host proxy, which accepts the jail's connections
itself (no relay process inside, and the proxy knows which sandbox each connection comes from);
unreachable routes for the host's LAN; descriptors of this namespace (and its user namespace) for
slirp4netns on the host side; a sock_diag netlink socket bound to this namespace, through which the
host's watcher reads what the jail's sockets hold (``limits/sockdiag.py``): the host cannot
enter a rootless jail's namespace, and a netlink socket answers for the namespace it was made in,
whoever uses it later. Stdlib only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from .spec import NetSpec

NETLINK_ROUTE = 0
NETLINK_SOCK_DIAG = 4
RTM_NEWROUTE = 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLMSG_ERROR = 2
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4
RTN_UNREACHABLE = 7
RTA_DST = 1
PROXY_BACKLOG = 256


def setup(net: NetSpec) -> list[int]:
    """Configure the namespace; return the descriptors the host needs, in ``NetSpec``'s order
    (closed here after sending)."""
    fds = [diag_socket()] if net.new_netns else []
    if net.unreachable:
        add_unreachable_routes(net.unreachable)
    if net.proxy_port:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", net.proxy_port))
        listener.listen(PROXY_BACKLOG)
        fds.append(listener.detach())
    for kind in net.namespaces:
        fds.append(os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
    return fds


def diag_socket() -> int:
    """A NETLINK_SOCK_DIAG socket of this namespace, connected to the kernel: once connected, the
    kernel refuses to deliver to it from any other netlink socket, so nothing the jail runs later
    (even with CAP_NET_ADMIN here) can forge the answers the host reads from it."""
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    try:
        nl.connect((0, 0))
    except BaseException:
        nl.close()
        raise
    return nl.detach()


def add_unreachable_routes(prefixes: tuple[str, ...]) -> None:
    """``ip route add unreachable PREFIX`` for each IPv4 prefix, over rtnetlink."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as nl:
        for seq, prefix in enumerate(prefixes, 1):
            net = ipaddress.IPv4Network(prefix)
            rtmsg = struct.pack(
                "BBBBBBBBI", socket.AF_INET, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, 0, RTN_UNREACHABLE, 0
            )
            attr = struct.pack("HH", 8, RTA_DST) + net.network_address.packed
            body = rtmsg + attr
            flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
            nl.send(struct.pack("IHHII", 16 + len(body), RTM_NEWROUTE, flags, seq, 0) + body)
            reply = nl.recv(4096)
            kind = struct.unpack_from("H", reply, 4)[0]
            error = struct.unpack_from("i", reply, 16)[0] if kind == NLMSG_ERROR else 0
            if error:
                raise OSError(-error, f"adding an unreachable route for {prefix}: {os.strerror(-error)}")
