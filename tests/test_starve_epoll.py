"""A jail's epoll watches never count against its root's host uid, and all of them together against one.

The kernel counts epoll watches per host uid of the instance's maker (``fs.epoll.max_user_watches``),
whatever the user namespace. Rootless, a jail's root is its user: before, one default sandbox took
all its user's watches in about 5 seconds, and the user's own ``epoll_ctl()`` failed with ENOSPC
until the command ended; and each id a jail switched to had a count of its own. Now the init's
maker makes every instance of the jail as the jail's highest id (``sandbox/child/epoll.py``).

Root and rootless. As root, the fill runs under a host limit lowered for the test's length; rootless
cannot lower it, so the fill takes the real one (5.5 million watches here, about 9 s and 1 GiB of
kernel memory, given back when the sandbox closes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.per_uid_fills import WATCH_ONE, WATCHES, started

from jailbox.sandbox import Sandbox, SeccompPolicy, hostids
from jailbox.sandbox.errors import SecurityWarning

# alone: root's shared slots and the user's epoll watches are shared with every worker's jails
pytestmark = [pytest.mark.needs("subids"), pytest.mark.alone]

MAX_WATCHES = Path("/proc/sys/fs/epoll/max_user_watches")

IN_A_NEW_SANDBOX = """
import sys
from jailbox.sandbox import Sandbox
with Sandbox() as sb:
    r = sb.exec(["python3", "-c", sys.argv[1]])
    print(r.stdout + r.stderr, end="")
"""

# a process under a seccomp filter of its own whose listener it holds (as under another supervisor):
# the kernel gives no second listener to anything it starts, the jail's init included
UNDER_A_SUPERVISOR = """
import struct, sys
from jailbox.sandbox import Sandbox
from jailbox.sandbox.floor import linux as L
from jailbox.sandbox.seccomp import syscalls
acct = syscalls.syscall_table(syscalls.arch())["acct"]
ops = [(0x20, 0, 0, 0), (0x15, 0, 1, acct), (0x06, 0, 0, 0x7FC00000), (0x06, 0, 0, 0x7FFF0000)]
L.prctl(L.PR_SET_NO_NEW_PRIVS, 1)
held = L.install_seccomp(b"".join(struct.pack("HBBI", *op) for op in ops), listener=True)
with Sandbox() as sb:
    print(sb.enforcement["epoll"])
    print(sb.exec(["python3", "-c", sys.argv[1]]).stdout, end="")
"""


AS_ANOTHER_ID = "import os; os.setgroups([]); os.setresgid(1000, 1000, 1000); os.setresuid(1000, 1000, 1000)\n"

SEMANTICS = """
import asyncio, ctypes, fcntl, os, select
libc = ctypes.CDLL(None, use_errno=True)
def result(fd):
    return fd if fd >= 0 else -ctypes.get_errno()
ep = select.epoll()  # epoll_create1(EPOLL_CLOEXEC)
r, w = os.pipe()
ep.register(r, select.EPOLLIN)
os.write(w, b"x")
print("ready", ep.poll(1) == [(r, select.EPOLLIN)])
print("cloexec", bool(fcntl.fcntl(ep.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
plain = result(libc.epoll_create1(0))
print("plain", plain > 2 and fcntl.fcntl(plain, fcntl.F_GETFD) == 0)
print("sized", result(libc.epoll_create(5)) > 2)
print("size 0", result(libc.epoll_create(0)), "size -1", result(libc.epoll_create(-1)))
print("bad flags", result(libc.epoll_create1(1)))
print("instance", os.readlink(f"/proc/self/fd/{ep.fileno()}"))
async def main():
    await asyncio.sleep(0.01)
    return "loop"
print(asyncio.run(main()))
"""


@contextlib.contextmanager
def host_watch_limit(value: int) -> Iterator[None]:
    """As root, a low host limit for the test's length, so a fill is quick and small; rootless, as is."""
    if os.getuid() != 0:
        yield
        return
    before = MAX_WATCHES.read_text()
    MAX_WATCHES.write_text(str(value))
    try:
        yield
    finally:
        MAX_WATCHES.write_text(before)


def host_ids(sb: Sandbox) -> tuple[int, int]:
    """The host uid and gid of the jail's root (its init's)."""
    status = Path(f"/proc/{sb.init_pid}/status").read_text()
    return int(status.split("Uid:")[1].split()[0]), int(status.split("Gid:")[1].split()[0])


def watch_on_host(uid: int, gid: int) -> str:
    """Register one watch from a host process of ``uid``: a child of this one, which becomes it as
    root (forked, not run: the test's Python may live where that uid cannot read, as under ~root)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if os.getuid() != uid:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            readable, _ = os.pipe()
            select.epoll().register(readable, select.EPOLLIN)
            os.write(w, b"watched")
        except OSError as exc:
            os.write(w, str(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as got:
        out = got.read(4096).decode()
    os.waitpid(pid, 0)
    return out


def maker_of(sb: Sandbox) -> tuple[int, int]:
    """(pid, uid) of the jail's epoll maker, as the jail sees it."""
    out = sb.exec("ps -eo pid=,uid=,comm= | awk '$3 == \"jailbox-epoll\" {print $1, $2}'").stdout.split()
    return int(out[0]), int(out[1])


@pytest.fixture(params=["as made", pytest.param("root's shared range", marks=pytest.mark.root)])
def shared_map(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the test's jails share one map: rootless always; as root, where they have no ids of
    their own (a range named by JAILBOX_ROOT_RANGE, inherited by the test's other processes)."""
    if request.param != "as made":
        monkeypatch.setenv(hostids.RANGE_ENV, f"{hostids.root_range()[0]}:{hostids.ROOT_RANGE}")
    return os.getuid() != 0 or request.param != "as made"


def test_a_jail_that_takes_every_watch_it_can_leaves_its_roots_uid_and_its_neighbours_able_to_watch(
    shared_map: bool,
) -> None:
    limit = 20_000 if os.getuid() == 0 else int(MAX_WATCHES.read_text())
    # with the capabilities to switch ids (a default sandbox has none), which each had a count of their own
    with host_watch_limit(limit), Sandbox(cap_add=["SETUID", "SETGID"]) as filler, Sandbox() as neighbour:
        assert filler.enforcement["epoll"].startswith("held: every epoll instance"), filler.enforcement["epoll"]
        watches, refused = started(filler, WATCHES)
        assert refused == errno.ENOSPC and watches >= limit - 1000  # the maker's uid holds them all
        got = watch_on_host(*host_ids(filler))
        assert got == "watched", got  # before: ENOSPC, the jail's root's uid was full
        # a neighbour of this process, and one of another (the slots are in the state directory they share)
        assert host_ids(neighbour) == host_ids(filler) or not shared_map
        r = neighbour.exec(["python3", "-c", WATCH_ONE])
        assert r.stdout == "watched\n", r.stderr  # before this commit's slots: ENOSPC, their makers were one uid
        r = subprocess.run([sys.executable, "-c", IN_A_NEW_SANDBOX, WATCH_ONE], capture_output=True, text=True)
        assert r.stdout == "watched\n", r.stderr
        # every id of the jail makes its instances through the maker: one count for the whole jail
        r = filler.exec(["python3", "-c", AS_ANOTHER_ID + WATCH_ONE])
        assert "No space left" in r.stderr, (r.stdout, r.stderr)  # before: uid 1000 had a count of its own
        r = filler.exec(["python3", "-c", WATCH_ONE])
        assert "No space left" in r.stderr, (r.stdout, r.stderr)
    with Sandbox() as after:  # given back with the sandbox
        assert after.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"


def test_makers_take_the_lowest_free_slot_and_share_the_highest_id_once_all_are_held(
    shared_map: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostids, "MAKER_SLOTS", 2)
    with contextlib.ExitStack() as stack:
        jails = [stack.enter_context(Sandbox()) for _ in range(3)]
        for sb in jails:
            assert sb.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
        ids = [maker_of(sb)[1] for sb in jails]
        if not shared_map:  # as root with ids of their own: each its highest, its own
            assert all("(this jail's own)" in sb.enforcement["epoll"] for sb in jails)
            return
        highest = ids[0]
        assert ids == [highest, highest - 1, highest]
        assert "(no other live jail's maker's" in jails[1].enforcement["epoll"]
        assert "(shared with other jails: all 2 slots in the state directory held" in jails[2].enforcement["epoll"]
        jails[0].close()
        with Sandbox() as again:  # the first slot is free again
            assert again.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
            assert maker_of(again)[1] == highest


def test_epoll_in_a_jail_behaves_as_the_kernels() -> None:
    with Sandbox() as sb:
        r = sb.exec(["python3", "-c", SEMANTICS])
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[:5] == ["ready True", "cloexec True", "plain True", "sized True", "size 0 -22 size -1 -22"]
        assert lines[5:] == ["bad flags -22", "instance anon_inode:[eventpoll]", "loop"]
        assert r.refused_syscalls == {}  # made, not refused
        pid, uid = maker_of(sb)
        status = sb.exec(f"cat /proc/{pid}/status").stdout
        assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status and uid >= 65535  # the jail's highest id
        assert "Seccomp:\t2" in status  # under the jail's filter, as every command
        assert "CapEff:\t0000000000000000" in status


def test_a_jail_that_kills_or_stops_its_maker_hurts_only_itself() -> None:
    with Sandbox() as default:  # holds no capability: another id's process is out of its reach
        assert default.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
        r = default.exec(f"kill -STOP {maker_of(default)[0]}")
        assert r.exit_code == 1 and "Operation not permitted" in r.stderr
    with Sandbox(cap_add=["KILL"]) as sb:
        assert sb.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
        first, _ = maker_of(sb)
        killed(sb, first)
        r = sb.exec(["python3", "-c", WATCH_ONE])
        assert r.stdout == "watched\n", r.stderr
        second, _ = maker_of(sb)
        assert second != first  # another one, started once the first was reaped
        assert sb.exec(f"kill -STOP {second}").exit_code == 0
        r = sb.exec(["timeout", "2", "python3", "-c", WATCH_ONE])
        assert r.exit_code == 124  # waits for the stopped maker: this jail's loss only
        assert sb.exec("echo served").stdout == "served\n"  # the init never waited on it
        with Sandbox() as neighbour:
            assert neighbour.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
        killed(sb, second)
        assert sb.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"


def test_the_init_goes_on_serving_when_its_maker_dies_between_two_looks() -> None:
    # the maker's end of its socket and its exit can reach the init in one poll; the init then
    # took the closed socket's event for the control socket's and waited there for the host's
    # next request, with the maker unreaped (2 kills of 40 here)
    with Sandbox(cap_add=["KILL"]) as sb:
        for _ in range(40):
            assert sb.exec(["python3", "-c", WATCH_ONE]).stdout == "watched\n"
            pid, _ = maker_of(sb)
            r = sb.exec(f"kill -KILL {pid} && while kill -0 {pid} 2>/dev/null; do sleep 0.01; done", timeout=10)
            assert (r.exit_code, r.timed_out) == (0, False), r.stderr


def killed(sb: Sandbox, pid: int) -> None:
    """Kill ``pid`` from inside the jail and wait until the init has reaped it (a zombie still answers kill -0)."""
    r = sb.exec(f"kill -KILL {pid} && while kill -0 {pid} 2>/dev/null; do sleep 0.01; done")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"seccomp": None}, "not held: seccomp is off"),
        ({"seccomp": SeccompPolicy(deny=("setresuid",))}, "not held: the seccomp policy"),
        ({"seccomp": SeccompPolicy(deny=("epoll_create1",))}, "not held: the seccomp policy"),
    ],
)
def test_where_the_maker_cannot_make_them_the_report_says_so(config: dict, why: str) -> None:
    warned = pytest.warns(SecurityWarning) if config["seccomp"] is None else contextlib.nullcontext()
    with warned, Sandbox(**config) as sb:
        assert sb.enforcement["epoll"].startswith(why), sb.enforcement["epoll"]
        r = sb.exec(["python3", "-c", WATCH_ONE])
        if "epoll_create1" in getattr(config["seccomp"], "deny", ()):
            assert "Operation not permitted" in r.stderr
        else:
            assert r.stdout == "watched\n", r.stderr  # made by the caller, as without jailbox
        assert "jailbox-epoll" not in sb.exec("ps -eo comm=").stdout


@pytest.mark.root  # rootless, a process under no_new_privs cannot run the setuid newuidmap: no maker there
def test_under_a_supervisor_holding_the_listener_the_report_says_epoll_is_not_held() -> None:
    r = subprocess.run([sys.executable, "-c", UNDER_A_SUPERVISOR, WATCH_ONE], capture_output=True, text=True)
    assert r.stdout.splitlines() == [
        "not held: the init got no seccomp listener (a supervisor above holds one)",
        "watched",
    ], r.stderr
