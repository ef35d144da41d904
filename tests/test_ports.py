"""``Sandbox.connect_port``: a TCP connection to a port on the jail's own loopback, in every network
mode, and what the host takes back from a jail's init that lies.

Real jails on the real kernel; the lying init is this test answering the host's request on the real
control-socket wire (``floor/wire.py``) with real descriptors: a pipe, sockets of every wrong kind."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from jailbox import Sandbox
from jailbox.sandbox import ports
from jailbox.sandbox.channel import Channel
from jailbox.sandbox.errors import ProtocolError, SandboxClosed
from jailbox.sandbox.floor import wire

SERVE = "python3 -m http.server {port} --bind {bind} >/dev/null 2>&1 &"


def _connected(sb: Sandbox, port: int) -> socket.socket:
    for _ in range(200):
        try:
            return sb.connect_port(port)
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise AssertionError(f"nothing came to listen on port {port}")


def _get(sock: socket.socket) -> bytes:
    sock.setblocking(True)
    sock.settimeout(30)
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
    return sock.recv(64)


@pytest.mark.parametrize("network", ["none", "allow:example.com"])
def test_a_port_on_the_jails_loopback_is_reached_in_every_mode(network: str) -> None:
    with Sandbox(network=network) as sb:
        with pytest.raises(ConnectionRefusedError, match="port 8000 of the sandbox"):
            sb.connect_port(8000)
        sb.exec(SERVE.format(port=8000, bind="127.0.0.1"))
        sb.exec(SERVE.format(port=8001, bind="::1"))  # IPv6 loopback only: tried second
        for port in (8000, 8001):
            with _connected(sb, port) as sock:
                assert sock.getblocking() is False and sock.type == socket.SOCK_STREAM
                assert _get(sock).startswith(b"HTTP/1.0 200"), port


@pytest.mark.needs("slirp4netns", "tun")
def test_a_port_is_reached_with_full_networking() -> None:
    with Sandbox(network="full") as sb:
        sb.exec(SERVE.format(port=8000, bind="0.0.0.0"))
        with _connected(sb, 8000) as sock:
            assert _get(sock).startswith(b"HTTP/1.0 200")


def test_bad_ports_are_named_and_a_full_backlog_times_out() -> None:
    with Sandbox() as sb:
        for bad in (0, 65536, -1, "80", True, 8.0):
            with pytest.raises(ValueError, match=r"port must be a number from 1 to 65535, e.g. connect_port\(8000\)"):
                sb.connect_port(bad)  # type: ignore[arg-type]
        # a listener that never accepts, its backlog full: the connection stays under way
        hold = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 8002)); s.listen(0); time.sleep(60)"
        sb.exec(f'python3 -c "{hold}" >/dev/null 2>&1 &')
        held = [_connected(sb, 8002)]
        try:
            with pytest.raises(TimeoutError, match=r"did not accept a connection within 0\.5s"):
                for _ in range(8):  # the kernel queues a couple beyond listen(0)
                    held.append(sb.connect_port(8002, timeout=0.5))
        finally:
            for sock in held:
                sock.close()
    with pytest.raises(SandboxClosed):
        sb.connect_port(8000)


# --- a lying init -------------------------------------------------------------------------------------


@pytest.fixture
def lying() -> Iterator[Callable[[Callable[[], list[int]]], Channel]]:
    """A channel whose init answers a connect with the descriptors ``make()`` gives (then closed here)."""
    threads: list[threading.Thread] = []
    socks: list[socket.socket] = []

    def channel(make: Callable[[], list[int]]) -> Channel:
        host, init = wire.seqpacket_pair()
        socks.extend((host, init))

        def answer() -> None:
            msg = wire.recv(init, max_fds=4, max_bytes=1 << 16)
            assert msg is not None and msg[0]["op"] == "connect", msg
            reply = socket.socket(fileno=msg[1][-1])
            fds = make()
            wire.send(reply, {"ok": True}, fds)
            reply.close()
            for fd in fds:
                os.close(fd)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        threads.append(thread)
        return Channel(host)

    yield channel
    for thread in threads:
        thread.join(timeout=10)
    for sock in socks:
        sock.close()


def _listener(family: int = socket.AF_INET, address: str = "127.0.0.1") -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((address, 0))
    server.listen(8)
    return server


def test_what_a_lying_init_hands_back_is_refused(lying: Callable[[Callable[[], list[int]]], Channel]) -> None:
    def fd_of(sock: socket.socket) -> int:
        return os.dup(sock.fileno())

    with _listener() as server:
        port = server.getsockname()[1]

        def connected_to(address: tuple[str, int]) -> list[int]:
            sock = socket.create_connection(address)
            fd = os.dup(sock.fileno())
            sock.close()
            return [fd]

        def pipe() -> list[int]:
            r, w = os.pipe()
            os.close(w)
            return [r]

        lies: dict[str, tuple[Callable[[], list[int]], str]] = {
            "no descriptor": (lambda: [], "handed back 0 descriptors"),
            "two": (lambda: [*connected_to(("127.0.0.1", port)), *pipe()], "too many descriptors \\(2\\)"),
            "a pipe": (pipe, "not a socket"),
            "a unix socket (its own control socket)": (lambda: [fd_of(socket.socketpair()[0])], "not TCP"),
            "UDP": (lambda: [fd_of(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))], "not TCP"),
            "a raw-ish SCTP-free stream of another family": (
                lambda: [fd_of(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))],
                "not TCP",
            ),
            "another port": (lambda: connected_to(("127.0.0.1", port)), f"127.0.0.1 port {port}"),
        }
        for why, (make, refusal) in lies.items():
            asked = port + 1 if why == "another port" else port
            with pytest.raises(ProtocolError, match=refusal):
                ports.connect(lying(make), asked, timeout=2)
        # the honest answer: a loopback connection to the port asked for
        with ports.connect(lying(lambda: connected_to(("127.0.0.1", port))), port, timeout=2) as sock:
            assert sock.getblocking() is False
    # a refused descriptor is closed: the lie's pipe has no reader left once the refusal is raised
    r, w = os.pipe()
    with pytest.raises(ProtocolError, match="not a socket"):
        ports.connect(lying(lambda: [os.dup(r)]), 8000, timeout=2)
    os.close(r)
    with pytest.raises(BrokenPipeError):
        for _ in range(100):  # the lying side closes its own copy just after it sent it
            os.write(w, b"x")
            time.sleep(0.02)
    os.close(w)


def test_a_connection_to_elsewhere_is_refused(lying: Callable[[Callable[[], list[int]]], Channel]) -> None:
    """A TCP connection the init made to another address (a proxy's, another host's; here 127.0.0.2,
    which a jail's own loopback has too) is not the port asked for, whatever its port."""
    with _listener(address="127.0.0.2") as server:
        port = server.getsockname()[1]

        def elsewhere() -> list[int]:
            sock = socket.create_connection(("127.0.0.2", port))
            fd = os.dup(sock.fileno())
            sock.close()
            return [fd]

        with pytest.raises(ProtocolError, match=f"a connection to 127.0.0.2 port {port}"):
            ports.connect(lying(elsewhere), port, timeout=2)
