"""No sandbox without a cgroup can take the host's memory through UNIX socket buffers.

What a stream socket's writer sends waits in kernel memory until its reader reads: about 200 KiB a
socket, which no rlimit counts and ``/proc`` shows no size of. The watcher (``limits/watch.py``)
reads it through the sock_diag socket the jail's init made in the jail's namespace
(``limits/sockdiag.py``). Each fill here takes about twice ``memory=96M`` if nothing stops it; the
holder must be killed, said so, and the host and the next sandbox must be fine.
"""

from __future__ import annotations

import os
import socket

import pytest
from support.host_memory import MiB, host_keeps_its_memory  # noqa: F401 (an autouse fixture)

from jailbox.sandbox import Sandbox
from jailbox.sandbox.child import netns
from jailbox.sandbox.config import Limits
from jailbox.sandbox.limits import sockdiag

# alone: measures the host's available memory, which other workers' tests use too
pytestmark = pytest.mark.alone

# Each writer fills its socket until the kernel refuses more (the reader never reads); "closed"
# closes the writer after, which leaves the bytes queued on the reader with no writer to report them.
PAIRS = """
import socket, time
kept = []
for _ in range({n}):
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * {chunk})
    except BlockingIOError:
        pass
    if {closed}:
        a.close()
        kept.append(b)
    else:
        kept += [a, b]
time.sleep(8)  # several processes: until the last has filled its pairs, with room to spare
print("survived", flush=True)
"""

# Filled pairs sent away in a message and closed: they are held by no descriptor, only by the
# queue of a carrier socket (a new carrier every 100 messages, so no carrier's queue fills).
IN_FLIGHT = """
import socket, time
carriers = []
for i in range({n}):
    if i % 100 == 0:
        carriers.append(socket.socketpair())
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * 65536)
    except BlockingIOError:
        pass
    socket.send_fds(carriers[-1][0], [b"x"], [a.fileno(), b.fileno()])
    a.close()
    b.close()
time.sleep(15)
print("survived", flush=True)
"""

# Connections a listener never accepts, each filled: "closed" closes the client, which leaves its
# bytes in a connection that has no inode and that no dump shows (only the listener's count of them).
BACKLOG = """
import socket, time
server = socket.socket(socket.AF_UNIX)
server.bind("\\0jailbox-backlog")
server.listen(4096)
kept = [server]
for _ in range({n}):
    c = socket.socket(socket.AF_UNIX)
    c.connect("\\0jailbox-backlog")
    c.setblocking(False)
    try:
        while True:
            c.send(b"x" * 65536)
    except BlockingIOError:
        pass
    if {closed}:
        c.close()
    else:
        kept.append(c)
time.sleep(15)
print("survived", flush=True)
"""


def run_all(sb: Sandbox, scripts: list[str]):
    cmd = " & ".join(f"python3 -c '{script}'" for script in scripts) + "; wait"
    return sb.exec(cmd, timeout=120)


@pytest.mark.nocgroup
@pytest.mark.parametrize(
    ("chunk", "closed"),
    [(65536, False), (1, False), (65536, True), (1, True)],
    ids=["filled", "byte-writes", "writer-closed", "byte-writes-writer-closed"],
)
def test_one_process_holding_socketpairs_whose_reader_never_reads_is_killed(chunk, closed):
    with Sandbox(limits=Limits(memory="96M")) as sb:
        assert "UNIX" in sb.enforcement["socket_buffers"]
        r = run_all(sb, [PAIRS.format(n=800, chunk=chunk, closed=closed)])
        assert r.oom_killed is True, (r.stdout, r.stderr)
        assert "survived" not in r.stdout, (r.stdout, r.stderr)
        assert sb._jail.counters()["oom_kill"] >= 1
        assert sb.exec("echo fine").stdout == "fine\n"


@pytest.mark.nocgroup
def test_filled_sockets_held_only_in_flight_in_a_message_are_killed():
    with Sandbox(limits=Limits(memory="96M")) as sb:
        r = run_all(sb, [IN_FLIGHT.format(n=800)])
        assert r.oom_killed is True, (r.stdout, r.stderr)
        assert "survived" not in r.stdout, (r.stdout, r.stderr)
        assert sb.exec("echo fine").stdout == "fine\n"


@pytest.mark.nocgroup
@pytest.mark.parametrize("processes", [4, 8])
def test_several_processes_holding_socketpairs_are_killed(processes):
    with Sandbox(limits=Limits(memory="96M")) as sb:
        r = run_all(sb, [PAIRS.format(n=800 // processes, chunk=65536, closed=False)] * processes)
        assert r.oom_killed is True, (r.stdout, r.stderr)
        # together they held twice the limit: not all of them can have lived to the end
        assert r.stdout.count("survived") < processes, (r.stdout, r.stderr)
        assert sb.exec("echo fine").stdout == "fine\n"


@pytest.mark.nocgroup
@pytest.mark.parametrize("closed", [False, True], ids=["clients-kept", "clients-closed"])
def test_a_backlog_of_unaccepted_connections_with_queued_data_is_killed(closed):
    with Sandbox(limits=Limits(memory="96M")) as sb:
        r = run_all(sb, [BACKLOG.format(n=800, closed=closed)])
        assert r.oom_killed is True, (r.stdout, r.stderr)
        assert "survived" not in r.stdout, (r.stdout, r.stderr)
        assert sb.exec("echo fine").stdout == "fine\n"


@pytest.mark.nocgroup
def test_sockets_under_the_bound_are_left_alone():
    """A few filled pairs (about 12 MiB) under memory=96M: nothing is killed."""
    with Sandbox(limits=Limits(memory="96M")) as sb:
        r = run_all(sb, [PAIRS.format(n=50, chunk=65536, closed=False).replace("time.sleep(8)", "time.sleep(1)")])
        assert r.stdout == "survived\n" and r.oom_killed is False, (r.stdout, r.stderr)


def test_the_diag_socket_takes_nothing_but_the_kernel():
    """Connected to the kernel: another netlink socket is refused. Rootless, sending to a netlink
    port needs CAP_NET_ADMIN anyway; as root (which may address any port, as a jail process with
    CAP_NET_ADMIN in its namespace may there) an unconnected socket takes the same forged message."""
    forged = sockdiag.HEADER.pack(sockdiag.HEADER.size, sockdiag.NLMSG_DONE, 0, 1, 0)
    diag = socket.socket(fileno=netns.diag_socket())
    try:
        with (
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netns.NETLINK_SOCK_DIAG) as other,
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netns.NETLINK_SOCK_DIAG) as unconnected,
        ):
            other.bind((0, 0))
            unconnected.bind((0, 0))
            with pytest.raises(OSError):
                other.sendto(forged, (diag.getsockname()[0], 0))
            if os.getuid() == 0:  # the check above is the connection's, not a lack of privilege
                other.sendto(forged, (unconnected.getsockname()[0], 0))
                assert unconnected.recv(64) == forged
        unix = sockdiag.Sockets(diag.detach())
        try:
            assert unix.measure(1 << 40) is not None  # and it still answers the kernel's dumps
        finally:
            unix.close()
    finally:
        diag.close()


@pytest.mark.parametrize(
    "batch",
    [
        b"\xff" * 7,  # shorter than a header
        sockdiag.HEADER.pack(1 << 20, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0) + b"\0" * 100,  # longer than received
        sockdiag.HEADER.pack(4, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0),  # shorter than its own header
        # a socket message whose attribute claims more than its message holds
        sockdiag.HEADER.pack(36, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        + bytes([socket.AF_UNIX, 1, 1, 0])
        + b"\0" * 12
        + sockdiag.ATTR.pack(4000, sockdiag.UNIX_DIAG_MEMINFO),
        # one attribute of length zero (a walk that did not advance would never end)
        sockdiag.HEADER.pack(36, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        + bytes([socket.AF_UNIX, 1, 1, 0])
        + b"\0" * 12
        + sockdiag.ATTR.pack(0, sockdiag.UNIX_DIAG_RQLEN),
        # a TCP socket whose memory figures claim more than its message holds
        sockdiag.HEADER.pack(96, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        + bytes([socket.AF_INET])
        + b"\0" * 71
        + sockdiag.ATTR.pack(4000, sockdiag.INET_DIAG_SKMEMINFO)
        + b"\xff" * 4,
        # one whose message is cut short
        sockdiag.HEADER.pack(40, sockdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0) + bytes([socket.AF_INET6]) + b"\xff" * 23,
    ],
    ids=["short", "overlong", "undersized", "attribute-overlong", "attribute-zero", "inet-attribute", "inet-short"],
)
def test_malformed_batches_are_read_within_their_bounds(batch):
    tally = sockdiag.Tally()
    assert sockdiag._parse(batch, 1, tally) is False
    assert tally.charged <= sockdiag.INET_SOCKET_OBJECT and tally.pending == 0


@pytest.mark.nocgroup
def test_a_jail_without_a_cgroup_hands_its_diag_socket_to_the_watcher_only():
    """The descriptor is the watcher's while it watches memory, and closed with the sandbox."""
    with Sandbox(limits=Limits(memory="96M")) as sb:
        watched = sb._jail.watched
        assert watched is not None and watched.sockets is not None and watched.sockets.diag is not None
        assert os.readlink(f"/proc/self/fd/{watched.sockets.diag.sock.fileno()}").startswith("socket:")
    assert watched.sockets.diag.sock.fileno() == -1
