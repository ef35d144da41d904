"""No jail can keep its root's host uid from passing descriptors (``limits/flight.py``).

The kernel counts descriptors sent in UNIX messages and not yet received per host uid, and refuses a
sender (ETOOMANYREFS) once its uid has more in flight than the sender's soft ``RLIMIT_NOFILE``.
Rootless, a jail's root is you: a jail holding 1,025 refuses every process of yours at the usual
limit of 1,024. As root, the jails of root's shared range (forced here: no place for the slot
locks) share their root's uid the same way. Each fill below would hold its descriptors for ten
minutes; the watcher must kill it, and a victim of that uid with the usual limit, trying every
millisecond meanwhile, must pass again within seconds (as must one on the host, rootless).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jailbox.sandbox import Sandbox, hostids
from jailbox.sandbox.limits import flight

# alone: descriptors in flight are counted per user: another worker's jails' count toward the mark too
pytestmark = pytest.mark.alone

HOLD = "time.sleep(600)"

FILLS = {
    # one process, pairs nobody reads, until the kernel refuses the sender (about 20,000 here)
    "one queue": f"""
import array, os, socket, time
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 253)
kept = []
try:
    while True:
        a, b = socket.socketpair()
        a.setblocking(False)
        kept.append((a, b))
        while True:
            a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
except OSError:
    pass
{HOLD}
""",
    # ten queues of 1,012 each, sent in one carrier and closed: the carrier shows 10
    "nested": f"""
import array, os, socket, time
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 253)
carrier = socket.socketpair()
for _ in range(10):
    a, b = socket.socketpair()
    for _ in range(4):
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    carrier[0].sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [b.fileno()]))])
    a.close()
    b.close()
{HOLD}
""",
    # cycles of sockets nobody holds (each sent into its own queue), made without end: the kernel's
    # collector frees them, but not as fast as they come
    "cycles": """
import array, os, socket
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 253)
while True:
    a, b = socket.socketpair()
    try:
        for _ in range(20):
            a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), b.fileno()]))])
    except OSError:
        pass
    a.close()
    b.close()
""",
    # the queue's socket behind 8,000 other descriptors, past what one search of the watcher reads
    "hidden": f"""
import array, os, resource, socket, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
null = os.open("/dev/null", os.O_RDONLY)
kept = [os.dup(null) for _ in range(8000)]
fds = array.array("i", [null] * 253)
a, b = socket.socketpair()
a.setblocking(False)
try:
    while True:
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
except OSError:
    pass
a.close()
{HOLD}
""",
    # eight processes of 300 each: none alone is over
    "spread": f"""
import array, os, socket, time
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 100)
for _ in range(7):
    if os.fork() == 0:
        break
a, b = socket.socketpair()
for _ in range(3):
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
{HOLD}
""",
}

# Tries to pass a descriptor every millisecond, with the usual soft limit of 1,024, for argv[1]
# seconds, or until it has passed again for PASSING seconds once the file argv[2] exists (the test
# makes it when the fill has been killed); prints the longest run of refusals (ms) and whether the
# last try passed.
VICTIM = """
import array, errno, os, resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
end = time.monotonic() + float(sys.argv[1])
longest, since, tries, refusals, passing = 0.0, None, 0, 0, None
while time.monotonic() < end:
    if since is not None:
        passing = None
    elif passing is None:
        passing = time.monotonic()
    elif time.monotonic() - passing > PASSING and os.path.exists(sys.argv[2]):
        break
    tries += 1
    try:
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]))])
        socket.recv_fds(b, 1, 1)
        since = None
    except OSError as exc:
        assert exc.errno == errno.ETOOMANYREFS, exc
        refusals += 1
        since = time.monotonic() if since is None else since
        longest = max(longest, time.monotonic() - since)
    time.sleep(0.001)
print(round(longest * 1000), int(since is None), tries, refusals, flush=True)
"""
VICTIM_TIME = 5  # seconds: the fill starts within one and is held for 600 if nothing stops it
PASSING = 0.5  # seconds a victim told the fill is over goes on passing before it ends
VICTIM = VICTIM.replace("PASSING", repr(PASSING))
REFUSED_MOST = 3000  # ms a victim may be refused in a row: far below what the fill would hold


@pytest.fixture
def shared_root_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, jails in root's shared range (so they share their root's uid, as rootless jails
    share yours): without a place for the slot locks a jail gets no host ids of its own."""
    if os.getuid() == 0:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setattr(hostids, "SLOTS", blocker / "ids")


def probes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if "jailbox: the probe" in " ".join(p.cmdline())]


def probes_started() -> list[psutil.Process]:
    """The probes, once the watcher has started one (at its first sample after a jail of a shared
    uid opened: at most 10 s)."""
    for _ in range(200):
        if found := probes():
            return found
        time.sleep(0.05)
    return []


def victim_result(sb: Sandbox) -> list[int]:
    out = sb.exec("for i in $(seq 300); do [ -s /tmp/victim.out ] && break; sleep 0.1; done; cat /tmp/victim.out")
    return [int(word) for word in out.stdout.split()]


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.slow
def test_a_jail_holding_descriptors_in_flight_is_killed_and_its_uid_passes_again(
    fill: str, shared_root_uid: None, tmp_path: Path
) -> None:
    with Sandbox() as filler, Sandbox() as neighbour:
        assert filler.enforcement["in_flight"].startswith("host watcher"), filler.enforcement["in_flight"]
        assert len(probes_started()) == 1  # one for the uid both jails' roots are
        neighbour.write_file("/tmp/victim.py", VICTIM)
        neighbour.exec("sleep 600 >/dev/null 2>&1 &")  # a command of the neighbour's, which lives on
        neighbour.exec(f"python3 /tmp/victim.py {VICTIM_TIME} /tmp/fill.over >/tmp/victim.out 2>&1 &")
        on_host = None
        over = tmp_path / "fill.over"
        if os.getuid() != 0:  # your own process, as a laptop user's desktop would be
            on_host = subprocess.Popen(
                [sys.executable, "-c", VICTIM, str(VICTIM_TIME), str(over)], stdout=subprocess.PIPE, text=True
            )
        filler.write_file("/tmp/fill.py", FILLS[fill])
        r = filler.exec("python3 /tmp/fill.py", timeout=60)
        assert (r.exit_code, r.oom_killed) == (137, True), (r.exit_code, r.stderr[-2000:])
        neighbour.write_file("/tmp/fill.over", "")
        over.write_text("")
        results = {"neighbour": victim_result(neighbour)}
        if on_host is not None:
            results["host"] = [int(word) for word in on_host.communicate(timeout=60)[0].split()]
        for who, (longest, passes, tries, _) in results.items():
            assert passes == 1 and longest < REFUSED_MOST and tries > 100, (who, results)
        assert filler.exec("echo next").stdout == "next\n"
        assert neighbour.exec("pgrep -x sleep >/dev/null && echo alive").stdout == "alive\n"
    assert probes() == []  # it ends with the last jail of its uid


def test_descriptors_in_flight_under_the_mark_are_left_alone(shared_root_uid: None) -> None:
    under = flight.MARK // 2  # two messages: at most 253 descriptors go in one
    script = f"""
import array, os, socket, time
a, b = socket.socketpair()
for _ in range(2):
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0] * {under // 2}))])
time.sleep(1.5)  # thirty of the watcher's samples
print("kept")
"""
    with Sandbox() as sb:
        r = sb.exec(["python3", "-c", script])
        assert (r.exit_code, r.stdout, r.oom_killed) == (0, "kept\n", False), r.stderr
    assert probes() == []


@pytest.mark.slow
def test_a_probe_that_ends_is_started_again(shared_root_uid: None) -> None:
    with Sandbox() as sb:
        (first,) = probes_started()
        first.kill()
        first.wait(10)
        for _ in range(400):  # the next starts flight.PROBE_RETRY seconds after the watcher saw it gone
            if (again := probes()) and again[0].pid != first.pid:
                break
            time.sleep(0.05)
        assert [p.pid for p in probes()] != [first.pid] and len(probes()) == 1
        sb.write_file("/tmp/fill.py", FILLS["one queue"])
        time.sleep(0.5)  # it says it is ready at a later sample than the one that started it
        r = sb.exec("python3 /tmp/fill.py", timeout=60)
        assert (r.exit_code, r.oom_killed) == (137, True), (r.exit_code, r.stderr[-2000:])
    assert probes() == []


@pytest.mark.root
def test_root_jails_with_ids_of_their_own_are_not_probed() -> None:
    with Sandbox() as sb:
        assert sb.enforcement["in_flight"].startswith("per jail")
        assert sb.exec("echo ok").stdout == "ok\n"
        assert probes() == []
