"""``--network full`` against a jail whose root holds CAP_NET_RAW: frames written on its tap past
its routes (packet sockets, raw sockets with their own IP header) must not reach the host's loopback
or LAN, by TCP, UDP, fragments, ICMP or IPv6, while listed destinations still work. Servers listen
on every host address and count what arrives. Runs as root and rootless alike."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time

import pytest
from support.standin import host_address

from jailbox.sandbox import Sandbox
from jailbox.sandbox.net.policy import full_refuses, host_resolvers, is_local

LAN = host_address()
pytestmark = [pytest.mark.needs("slirp4netns", "tun")]

# Runs in the jail: python3 -c PROBE MODE PROTO DST PORT. Each frame goes three times.
PROBE = r"""
import os, socket, struct, sys, time
mode, proto, dst, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def csum(b):
    b += b"\0" * (len(b) % 2)
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF

V6 = ":" in dst
FAM = socket.AF_INET6 if V6 else socket.AF_INET
SRC = socket.inet_pton(FAM, "fd00:2::100" if V6 else "10.0.2.100")
DST = socket.inet_pton(FAM, dst)

def ip(nr, payload, frag=0, ident=0):
    if V6:
        return struct.pack("!IHBB16s16s", 6 << 28, len(payload), nr, 64, SRC, DST) + payload
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident, frag, 64, nr, 0, SRC, DST)
    return h[:10] + struct.pack("!H", csum(h)) + h[12:] + payload

def pseudo(nr, segment):
    if V6:
        return SRC + DST + struct.pack("!IxxxB", len(segment), nr)
    return SRC + DST + struct.pack("!BBH", 0, nr, len(segment))

def packets(sport):
    if proto == "tcp":
        t = struct.pack("!HHIIBBHHH", sport, port, 1000, 0, 5 << 4, 0x02, 64240, 0, 0)
        return [ip(6, t[:16] + struct.pack("!H", csum(pseudo(6, t) + t)) + t[18:])]
    if proto == "icmp":
        m = struct.pack("!BBHHH", 8, 0, 0, sport, 1) + b"jailbox-probe"
        return [ip(1, m[:2] + struct.pack("!H", csum(m)) + m[4:])]
    u = struct.pack("!HHHH", sport, port, 8 + 64, 0) + b"j" * 64
    u = u[:6] + struct.pack("!H", csum(pseudo(17, u) + u) or 0xFFFF) + u[8:]
    if proto == "udp":
        return [ip(17, u)]
    # udpfrag: the header and 16 bytes, then the rest at offset 24 (in 8-byte units: 3)
    return [ip(17, u[:24], frag=0x2000, ident=sport), ip(17, u[24:], frag=3, ident=sport)]

me = bytes.fromhex(open("/sys/class/net/tap0/address").read().strip().replace(":", ""))
gateway = bytes.fromhex("52550a000202")  # slirp4netns's 10.0.2.2
for i in range(3):
    for pkt in packets(40000 + (os.getpid() * 3 + i) % 20000):
        if mode == "packet":
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            s.bind(("tap0", 0))
            s.send(gateway + me + (b"\x86\xdd" if V6 else b"\x08\x00") + pkt)
        else:  # raw: routed to the gateway, the header names the destination
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
            s.sendto(pkt, ("10.0.2.2", 0))
        s.close()
    time.sleep(0.1)
print("sent")
"""


class Listeners:
    """TCP and UDP servers on every IPv4 and IPv6 address of the host, counting what arrives."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []
        self.socks: list[socket.socket] = []
        self.ports: dict[str, int] = {}
        for name, family, kind in (
            ("tcp", socket.AF_INET, socket.SOCK_STREAM),
            ("udp", socket.AF_INET, socket.SOCK_DGRAM),
            ("tcp6", socket.AF_INET6, socket.SOCK_STREAM),
            ("udp6", socket.AF_INET6, socket.SOCK_DGRAM),
        ):
            s = socket.socket(family, kind)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            if kind == socket.SOCK_STREAM:
                s.listen(64)
            self.ports[name] = s.getsockname()[1]
            self.socks.append(s)
            threading.Thread(target=self._serve, args=(name, s), daemon=True).start()
        if os.geteuid() == 0:  # slirp4netns sends ICMP echo as a datagram to port 7 without ping sockets
            echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                echo.bind(("0.0.0.0", 7))
                self.socks.append(echo)
                threading.Thread(target=self._serve, args=("echo", echo), daemon=True).start()
            except OSError:
                echo.close()

    def _serve(self, name: str, s: socket.socket) -> None:
        while True:
            try:
                if s.type == socket.SOCK_STREAM:
                    conn, peer = s.accept()
                    conn.close()
                else:
                    _, peer = s.recvfrom(65536)
            except OSError:
                return
            self.hits.append((name, str(peer[0])))

    def close(self) -> None:
        for s in self.socks:
            s.shutdown(socket.SHUT_RDWR) if s.type == socket.SOCK_STREAM else None
            s.close()


@pytest.fixture
def listeners():
    ls = Listeners()
    yield ls
    ls.close()


def _guard_refused(sb: Sandbox) -> dict[str, int]:
    """Addresses the host's check refused slirp4netns, with counts."""
    return dict(sb._jail.network.slirp.guard.refused)


def _send(sb: Sandbox, mode: str, proto: str, dst: str, port: int) -> None:
    r = sb.exec(["python3", "-c", PROBE, mode, proto, dst, str(port)])
    assert r.stdout == "sent\n", r.stderr


HOST_TARGETS = ["127.0.0.1", "127.3.2.1", "0.0.0.0", *([LAN] if LAN else [])]


@pytest.mark.slow
def test_crafted_frames_reach_neither_the_hosts_loopback_nor_its_lan(listeners):
    """Every way a frame can name the host: loopback (any 127/8 address, 0.0.0.0, slirp4netns's
    10.0.2.2), the LAN address, by TCP SYN, UDP, fragmented UDP and ICMP, from packet and raw sockets,
    and IPv6's ::1 and a v4-mapped loopback."""
    with Sandbox(network="full", cap_add=["NET_RAW"]) as sb:
        for dst in (*HOST_TARGETS, "10.0.2.2"):  # slirp4netns's alias of the host's loopback refuses itself
            for mode in ("packet", "raw"):
                for proto, port in (("tcp", "tcp"), ("udp", "udp"), ("udpfrag", "udp"), ("icmp", "udp")):
                    _send(sb, mode, proto, dst, listeners.ports[port])
        for dst in ("::1", "::ffff:127.0.0.1"):
            _send(sb, "packet", "tcp", dst, listeners.ports["tcp6" if dst == "::1" else "tcp"])
            _send(sb, "packet", "udp", dst, listeners.ports["udp6" if dst == "::1" else "udp"])
        time.sleep(1)  # what slirp4netns still had in hand
        assert listeners.hits == []
        refused = _guard_refused(sb)
        # each of the 24 calls per address (2 ways x 4 protocols x 3 tries) was refused where it meets the host
        assert all(refused.get(dst, 0) >= 24 for dst in HOST_TARGETS), refused


@pytest.mark.skipif(LAN is None, reason="this host has no non-loopback IPv4 address")
def test_deleted_routes_do_not_open_the_lan(listeners):
    """A root holding CAP_NET_ADMIN deletes the routes that keep the LAN out; its own connects and
    datagrams still stop where slirp4netns meets the host."""
    with Sandbox(network="full", cap_add=["NET_ADMIN"]) as sb:
        r = sb.exec("ip route flush type unreachable && ip route show type unreachable | wc -l")
        assert r.stdout == "0\n", r.stderr
        script = (
            "import socket, sys; lan, tcp, udp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); "
            "s = socket.socket(); s.settimeout(5); print(s.connect_ex((lan, tcp))); "
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', (lan, udp))"
        )
        r = sb.exec(["python3", "-c", script, LAN, str(listeners.ports["tcp"]), str(listeners.ports["udp"])])
        assert r.stdout.strip() not in ("", "0"), r.stderr
        time.sleep(1)
        assert listeners.hits == []
        assert _guard_refused(sb).get(LAN, 0) >= 2


@pytest.mark.skipif(LAN is None, reason="this host has no non-loopback IPv4 address")
def test_listed_lan_addresses_still_work_and_loopback_never_opens(listeners):
    """``lan`` opens the listed address, by the jail's own calls and by crafted frames alike; listing
    the loopback opens nothing (the jail's own calls never reach it either)."""
    with Sandbox(network={"mode": "full", "lan": [LAN, "127.0.0.0/8"]}, cap_add=["NET_RAW"]) as sb:
        script = (
            "import socket, sys; lan, tcp, udp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); "
            "socket.create_connection((lan, tcp), timeout=5).close(); "
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', (lan, udp)); print('ok')"
        )
        r = sb.exec(["python3", "-c", script, LAN, str(listeners.ports["tcp"]), str(listeners.ports["udp"])])
        assert r.stdout == "ok\n", r.stderr
        _send(sb, "packet", "tcp", LAN, listeners.ports["tcp"])
        _send(sb, "packet", "tcp", "127.0.0.1", listeners.ports["tcp"])
        _send(sb, "raw", "udp", "127.0.0.1", listeners.ports["udp"])
        deadline = time.monotonic() + 10
        while len({h for h in listeners.hits if h[0] == "tcp"}) < 1 or len(listeners.hits) < 3:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        assert {peer for _, peer in listeners.hits} == {LAN}, listeners.hits
        assert ("tcp", LAN) in listeners.hits and ("udp", LAN) in listeners.hits
    assert not [t for t in threading.enumerate() if t.name == "jailbox-slirp-egress"]  # the guard went with it


def test_the_jails_dns_still_goes_to_the_hosts_resolver():
    try:
        expected = {a[4][0] for a in socket.getaddrinfo("deb.debian.org", 80, socket.AF_INET, socket.SOCK_STREAM)}
    except OSError:
        pytest.skip("this host does not resolve deb.debian.org")
    with Sandbox(network="full") as sb:
        r = sb.exec("getent ahostsv4 deb.debian.org | head -1")
        assert r.exit_code == 0 and r.stdout.split()[0] in expected, r.stderr
        assert _guard_refused(sb) == {}


@pytest.mark.slow
@pytest.mark.skipif(LAN is None, reason="this host has no non-loopback IPv4 address")
def test_without_its_supervisor_slirp_reaches_nothing(listeners):
    """Fail closed: once the host's checking thread is gone, slirp4netns's connects and datagrams
    fail in the kernel, listed destinations included, crafted or not."""
    with Sandbox(network={"mode": "full", "lan": [LAN]}, cap_add=["NET_RAW"]) as sb:
        sb._jail.network.slirp.guard.close()
        script = (
            "import socket, sys; lan, tcp = sys.argv[1], int(sys.argv[2]); "
            "print(socket.socket().connect_ex((lan, tcp)) != 0)"
        )
        r = sb.exec(["python3", "-c", script, LAN, str(listeners.ports["tcp"])])
        assert r.stdout == "True\n", r.stderr
        for dst in (LAN, "127.0.0.1"):
            _send(sb, "packet", "tcp", dst, listeners.ports["tcp"])
            _send(sb, "packet", "udp", dst, listeners.ports["udp"])
        time.sleep(1)
    assert listeners.hits == []


def test_what_full_refuses_where_slirp_meets_the_host():
    """The one rule the check applies, by address family and form: loopback in every spelling,
    never opened by ``lan``; the LAN unless listed; the host's resolvers on port 53 only."""
    ip, net = ipaddress.ip_address, ipaddress.ip_network
    for addr in ("127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "fe80::1", "10.0.2.2"):
        assert full_refuses(ip(addr), 80, ()), addr
    assert full_refuses(ip("127.0.0.1"), 80, (net("127.0.0.0/8"), net("::ffff:0:0/96")))
    assert full_refuses(ip("192.168.1.7"), 443, ()) and full_refuses(ip("::ffff:192.168.1.7"), 443, ())
    assert not full_refuses(ip("192.168.1.7"), 443, (net("192.168.1.0/24"),))
    assert not full_refuses(ip("93.184.215.14"), 443, ()) and not full_refuses(ip("2606:2800:21f::1"), 443, ())
    for resolver in host_resolvers():
        assert not full_refuses(resolver, 53, ())
        assert full_refuses(resolver, 54, ()) == is_local(resolver)
