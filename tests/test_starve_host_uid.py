"""No root jail can take from its neighbours what the kernel counts per host uid.

Some counts are kept per host uid, whatever the user namespace: epoll watches
(``fs.epoll.max_user_watches``), descriptors sent in UNIX messages and not yet received (a sender is
refused with ETOOMANYREFS once its uid has more in flight than the sender's RLIMIT_NOFILE), pipe
buffers past ``fs.pipe-user-pages-soft``. As root, each jail runs under host ids of its own (a slot
of the ``jailbox-jails`` pool, ``hostids.claim_own_ids``), its lower and binds mounted idmapped, so
one jail filling such a count leaves its neighbour's alone. Before, root's jails shared one range:
one jail's fill refused the next jail's descriptor passing and epoll registrations. Rootless, the
jail's root is the user, and these counts are shared with the user's own processes (docs/bounds.md): every
jail's epoll instances are made by its init's maker (test_starve_epoll.py), and the watcher holds
descriptors in flight (test_starve_in_flight.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.per_uid_fills import WATCH_ONE, WATCHES, started

from jailbox.sandbox import Mount, Sandbox, hostids

# alone: root's shared slots are taken by every worker's jails
pytestmark = [pytest.mark.root, pytest.mark.alone]

RANGE = hostids.ROOT_RANGE

# Descriptors in flight: /dev/null, 253 a message (the kernel's most), over socket pairs nobody
# reads, until the kernel refuses the sender. Then the filler holds them there.
IN_FLIGHT = """
import array, os, socket, sys, time
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 253)
pairs, sent, refused = [], 0, 0
while not refused and len(pairs) < 1000:
    a, b = socket.socketpair()
    a.setblocking(False)
    pairs.append((a, b))
    while True:
        try:
            a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except BlockingIOError:
            break
        except OSError as exc:
            refused = exc.errno
            break
        sent += len(fds)
print(sent, refused, flush=True)
time.sleep(600)
"""

PASS_ONE = """
import array, socket
a, b = socket.socketpair()
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]))])
print("passed")
"""


def host_uid(sb: Sandbox) -> int:
    return int(Path(f"/proc/{sb.init_pid}/status").read_text().split("Uid:")[1].split()[0])


@contextlib.contextmanager
def sysctl(name: str, value: str) -> Iterator[None]:
    path = Path("/proc/sys") / name
    before = path.read_text()
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(before)


def test_root_jails_run_under_host_ids_of_their_own(tmp_path: Path) -> None:
    shared = hostids.plan("auto").host_root()
    binds = [tmp_path / "a", tmp_path / "b"]
    for b in binds:
        b.mkdir()
    with (
        Sandbox(upper="disk", mounts=[Mount(binds[0], "/out", readonly=False, give=True)]) as a,
        Sandbox(mounts=[Mount(binds[1], "/out", readonly=False, give=True)]) as b,
    ):
        uids = [host_uid(sb) for sb in (a, b)]
        assert uids[0] != uids[1] and shared[0] not in uids
        for sb, bind in zip((a, b), binds, strict=True):
            assert sb.enforcement["host_ids"].startswith("its own")
            # the tree and the bind are root's inside, though on disk they stay in root's shared range
            r = sb.exec("stat -c '%u %g' /etc/passwd /out; touch /etc/passwd /out/made; stat -c '%u %g' /out/made")
            assert r.stdout == "0 0\n0 0\n0 0\n", r.stderr
            assert (bind / "made").stat().st_uid == shared[0] and (bind / "made").stat().st_gid == shared[1]
        # the disk writable layer is the jail's own ids on the host
        assert a._jail.dir is not None
        assert (a._jail.dir / "upper" / "etc" / "passwd").stat().st_uid == uids[0]
        lock = a._jail._ids_lock
        assert lock is not None
        slot_file = os.fstat(lock)
    # the slot is given back: its lock file is closed (the descriptor is gone, or is another file now)
    with contextlib.suppress(OSError):
        assert os.fstat(lock).st_ino != slot_file.st_ino


def test_slots_are_taken_lowest_first_and_free_again(tmp_path: Path) -> None:
    slots = tmp_path / "ids"
    first, second = hostids._lock_slot(slots, 4), hostids._lock_slot(slots, 4)
    assert first is not None and second is not None and (first[0], second[0]) == (0, 1)
    hostids.release_slot(first[1])
    third = hostids._lock_slot(slots, 4)
    assert third is not None and third[0] == 0
    for _, fd in (second, third):
        hostids.release_slot(fd)


def _sleep_in_child() -> None:
    time.sleep(60)


@pytest.mark.parametrize("fork", ["os.fork", "multiprocessing"])
def test_a_host_process_forked_without_exec_does_not_keep_a_jails_slot(fork: str) -> None:
    with Sandbox() as sb:
        lock = sb._jail._ids_lock
        assert lock is not None
        slot = os.readlink(f"/proc/self/fd/{lock}")
        if fork == "os.fork":
            child = os.fork()
            if child == 0:  # a worker that lives on, forked from the process that holds the jail
                time.sleep(60)
                os._exit(0)
        else:
            worker = multiprocessing.get_context("fork").Process(target=_sleep_in_child, daemon=True)
            worker.start()
            assert worker.pid is not None
            child = worker.pid
    try:
        held = [os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")]
        assert slot not in held  # the child holds no copy of the slot's lock
        fd = os.open(slot, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free, though the child lives on
        finally:
            os.close(fd)
        with Sandbox() as again:  # and the next jail takes it
            assert again._jail._ids_lock is not None
            assert os.readlink(f"/proc/self/fd/{again._jail._ids_lock}") == slot
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_without_a_place_for_the_slot_locks_a_jail_shares_roots_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(hostids, "SLOTS", blocker / "ids")  # mkdir there fails (ENOTDIR), as on a read-only /run
    with Sandbox() as sb:
        assert host_uid(sb) == hostids.plan("auto").host_root()[0]
        assert sb.enforcement["host_ids"].startswith("shared")


@pytest.mark.parametrize("where", ["on sysfs", "holding a proc mount"])
def test_a_bind_that_cannot_be_idmapped_leaves_the_jail_in_roots_shared_range(tmp_path: Path, where: str) -> None:
    src = Path("/sys/kernel/mm")
    with contextlib.ExitStack() as undo:
        if where != "on sysfs":
            src = tmp_path / "bind"
            (src / "proc").mkdir(parents=True)
            subprocess.run(["mount", "-t", "proc", "proc", str(src / "proc")], check=True)
            undo.callback(subprocess.run, ["umount", "-l", str(src / "proc")], check=True)
        with Sandbox(mounts=[Mount(src, "/mnt/src")]) as sb:
            assert host_uid(sb) == hostids.plan("auto").host_root()[0]
            assert sb.enforcement["host_ids"].startswith("shared")
            assert sb.exec("ls /mnt/src >/dev/null && echo read").stdout == "read\n"


def test_a_root_jail_cannot_take_its_neighbours_descriptors_in_flight() -> None:
    with Sandbox() as filler, Sandbox() as neighbour:
        sent, refused = started(filler, IN_FLIGHT)
        nofile = int(filler.exec("ulimit -n").stdout)
        assert refused == errno.ETOOMANYREFS and sent > nofile  # the filler's uid holds all it may
        r = neighbour.exec(["python3", "-c", PASS_ONE])
        assert r.stdout == "passed\n", r.stderr
        r = filler.exec(["python3", "-c", PASS_ONE])
        assert "Too many references" in r.stderr  # the filler's own uid is full


def test_a_root_jail_cannot_take_its_neighbours_epoll_watches() -> None:
    # a low host limit for the test's length, so the fill is quick and small (the default is ~4% of memory)
    with sysctl("fs/epoll/max_user_watches", "20000"), Sandbox() as filler, Sandbox() as neighbour:
        watches, refused = started(filler, WATCHES)
        assert refused == errno.ENOSPC and watches >= 19000
        r = neighbour.exec(["python3", "-c", WATCH_ONE])
        assert r.stdout == "watched\n", r.stderr
        r = filler.exec(["python3", "-c", WATCH_ONE])
        assert "No space left" in r.stderr
