"""No sandbox can hold host memory that no process's pages show: pipe buffers, SysV IPC objects, memfds,
the kernel's records of mappings.

With a cgroup the kernel counts all of these in the sandbox's memory. Without one, the host's watcher
sums the jail's processes' pages, which do not show them: each open descriptor and each mapping is
charged, SysV IPC is bounded in the jail's own IPC namespace, and ``memfd_create`` is ENOSYS. Each test bounds a small
sandbox, tries to hold far more than its limit one of these ways while a thread samples the host's
available memory, and checks that the host lost no more than the bound and some slack.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.host_memory import MiB, host_keeps_its_memory, mem_available  # noqa: F401 (an autouse fixture)

from jailbox.sandbox import ExecResult, Sandbox
from jailbox.sandbox.config import Limits
from jailbox.sandbox.limits import scratch

# alone: measures the host's available memory, which other workers' tests use too
pytestmark = pytest.mark.alone

LIMIT = 128 * MiB
# What the host may lose beyond the limit: the pipes the kernel gives full buffers before the per-user
# soft limit (fs.pipe-user-pages-soft, 64 MiB), the watcher's reaction at full speed, and the noise of
# a shared machine. Each attack below would take 600 MiB to 1 GiB past the limit unbounded.
SLACK = 256 * MiB


@contextmanager
def lowest_available() -> Iterator[list[int]]:
    """The host's MemAvailable before, and its lowest while the block runs (sampled every 20 ms)."""
    found = [mem_available()]
    found.append(found[0])
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            found[1] = min(found[1], mem_available())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()


def _held_to_the_bound(sb: Sandbox, program: str) -> ExecResult:
    """How ``program`` ended, once the host is seen to have lost no more than the bound while it ran."""
    with lowest_available() as memory:
        r = sb.exec(["python3", "-c", program], timeout=120)
    before, lowest = memory
    assert before - lowest <= LIMIT + SLACK, (f"the host lost {(before - lowest) // MiB} MiB", r.stdout, r.stderr)
    assert not r.timed_out
    return r


# Processes that each open as many full pipes as they may (one page each past the per-user soft
# limit), then hold them: 64,000 pipes in all, about 700 MiB of kernel memory unbounded.
PIPES = r"""
import os, resource, sys, time
per = min(8000, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 32) // 2)
workers = -(-64000 // per)
for _ in range(workers):
    if os.fork() == 0:
        held = []
        try:
            for _ in range(per):
                r, w = os.pipe()
                os.set_blocking(w, False)
                try:
                    while True:
                        os.write(w, b"x" * 65536)
                except BlockingIOError:
                    pass
                held.append((r, w))
        except OSError as exc:
            print("stopped:", exc.strerror, flush=True)
        time.sleep(8)
        os._exit(0)
killed = 0
for _ in range(workers):
    _, status = os.wait()
    killed += os.WIFSIGNALED(status)
print("workers", workers, "killed", killed)
"""


def test_pipe_buffers_count_against_the_memory_limit():
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        r = _held_to_the_bound(sb, PIPES)
        assert r.oom_killed, (r.stdout, r.stderr)  # holders killed: by the watcher, or the cgroup's OOM killer
        if "cgroup" not in sb.enforcement["memory"]:
            assert int(r.stdout.split()[-1]) > 0 and "descriptor" in sb.enforcement["memory"], r.stdout
        assert sb.exec("echo usable").stdout == "usable\n"


# Netlink sockets each sent dump requests they never read the answers to (the kernel answers each into
# the socket's queue, up to its receive buffer): 0.7-1 GiB of queues neither a cgroup nor
# sock_diag's UNIX/TCP/UDP dumps see.
NETLINK_DUMPS = r"""
import os, resource, socket, struct, time
request = struct.pack("=IHHII", 32, 18, 0x301, 1, 0) + bytes(16)  # RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP
per = min(4000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 32)
workers = -(-8000 // per)
for _ in range(workers):
    if os.fork() == 0:
        held = []
        for _ in range(per):
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            s.setblocking(False)
            for _ in range(200):
                try:
                    s.send(request)
                except OSError:
                    break
            held.append(s)
        time.sleep(8)
        os._exit(0)
for _ in range(workers):
    os.wait()
"""


def test_netlink_queues_are_held_to_the_memory_limit():
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        r = _held_to_the_bound(sb, NETLINK_DUMPS)
        assert r.oom_killed, (r.stdout, r.stderr)
        assert "netlink, packet and raw" in sb.enforcement["socket_queues"]
        assert sb.exec("echo usable").stdout == "usable\n"


def test_netlink_sockets_that_send_to_each_other_are_refused():
    """NETLINK_USERSOCK: the one protocol whose sockets send to each other unprivileged, a memcpy into a
    queue no cgroup counts (3,000 pairs filled 1.1 GiB in 0.2 s, faster than any sample)."""
    with Sandbox() as sb:
        r = sb.exec(["python3", "-c", "import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)"])
        assert r.exit_code == 1 and "PermissionError" in r.stderr, r.stderr
        assert r.refused_syscalls == {"socket": 1}
        assert sb.exec(["python3", "-c", "import socket; socket.if_nameindex()"]).exit_code == 0  # NETLINK_ROUTE


# SysV shared memory outlives the processes that made it: segments made, touched and detached by
# processes that then exit hold pages that are in no process at all.
SHM = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for _ in range(32):
    if os.fork() == 0:
        sid = libc.shmget(0, 32 << 20, 0o1600)
        if sid < 0:
            os._exit(ctypes.get_errno())
        addr = libc.shmat(sid, None, 0)
        ctypes.memset(addr, 1, 32 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        os._exit(0)
    _, status = os.wait()
    if os.waitstatus_to_exitcode(status) != 0:
        print("refused:", os.strerror(os.waitstatus_to_exitcode(status)))
        break
    made += 32
print("MiB", made)
"""


def test_sysv_shared_memory_is_bounded_to_the_tmpfs_size():
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        out = _held_to_the_bound(sb, SHM).stdout
        tmpfs_size = scratch.tmpfs(sb.config)[0]
        assert "refused: No space left on device" in out, out
        assert int(out.split()[-1]) * MiB <= tmpfs_size, out
        assert f"shared memory {tmpfs_size} bytes" in sb.enforcement["ipc"]
        assert sb.exec("echo usable").stdout == "usable\n"


IPC_COUNTS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
queues = sets = 0
while queues < 100000 and libc.msgget(0, 0o1600) >= 0:
    queues += 1
queue_errno = ctypes.get_errno()
while sets < 100000 and libc.semget(0, 250, 0o1600) >= 0:
    sets += 1
print(queues, queue_errno, sets, ctypes.get_errno())
"""


def test_sysv_message_queues_and_semaphores_are_bounded():
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        queues, queue_errno, sets, set_errno = (int(v) for v in sb.exec(["python3", "-c", IPC_COUNTS]).stdout.split())
        assert (queues, queue_errno) == (scratch.IPC_MESSAGE_QUEUES, errno.ENOSPC)
        assert (sets, set_errno) == (int(scratch.IPC_SEMAPHORES.split()[3]), errno.ENOSPC)


@pytest.mark.parametrize(
    "how",
    [
        "echo 18446744073692774399 > /proc/sys/kernel/shmall",
        "echo 32000 > /proc/sys/kernel/msgmni",
        "mount -o remount,rw /proc/sys 2>&1; echo 32000 > /proc/sys/kernel/msgmni",
        "mount -t proc proc /mnt 2>&1; echo 32000 > /mnt/sys/kernel/msgmni",
        "unshare --ipc sh -c 'echo 32000 > /proc/sys/kernel/msgmni; cat /proc/sys/kernel/msgmni'",
    ],
)
def test_the_jail_cannot_raise_its_ipc_bounds(how):
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        r = sb.exec(how)
        assert r.exit_code != 0, (r.stdout, r.stderr)
        values = sb.exec("cat /proc/sys/kernel/shmall /proc/sys/kernel/msgmni").stdout.split()
        assert values == [scratch.ipc(scratch.tmpfs(sb.config)[0])[k] for k in ("shmall", "msgmni")]


# memfds: written with write(), their pages are in no process's memory and on no tmpfs with a size
MEMFD = r"""
import errno, os, time
made = 0
try:
    for _ in range(8):
        fd = os.memfd_create("hold")
        for _ in range(128):
            os.write(fd, b"y" * (1 << 20))
        made += 128
except OSError as exc:
    print("refused:", errno.errorcode[exc.errno])
time.sleep(2)
print("MiB", made)
"""


def test_memfds_cannot_hold_memory_past_the_limit():
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        watched = "cgroup" not in sb.enforcement["memory"]
        r = sb.exec(["python3", "-c", MEMFD], timeout=120)
        if watched:  # no cgroup counts a memfd: there are none
            assert "refused: ENOSYS" in r.stdout and r.stdout.endswith("MiB 0\n"), (r.stdout, r.stderr)
            assert "memfd_create ENOSYS" in sb.enforcement["memory"]
        with lowest_available() as memory:
            r = sb.exec(["python3", "-c", MEMFD], timeout=120)
        assert memory[0] - memory[1] <= LIMIT + SLACK, (memory, r.stdout, r.stderr)
        assert r.oom_killed or "refused" in r.stdout, (r.stdout, r.stderr)  # the cgroup's OOM killer, or none
        assert sb.exec("echo usable").stdout == "usable\n"


def test_large_answers_from_the_init_travel_without_memfds(tmp_path):
    """A listing far past the inline message size comes back whole, with or without memfds."""
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        sb.exec("mkdir -p /tmp/many && cd /tmp/many && for i in $(seq 3000); do : > file-with-a-long-name-$i; done")
        sb.get("/tmp/many", tmp_path / "many")
        assert len(list((tmp_path / "many").iterdir())) == 3000


# Processes that each make as many one-page mappings as they may (vm.max_map_count, or their
# RLIMIT_AS in pages), of alternating protection so that neighbours are not merged, then hold them:
# each is some 228 bytes of kernel records no process's pages show, about 1 GiB unbounded. Two ways:
# anonymous, and of one file's first page (every mapping of a file goes into that file's one tree,
# under one lock, so reading the processes' maps waits behind their mmap() calls for seconds).
MAPPINGS = r"""
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
# MAP_PRIVATE of the file, or MAP_PRIVATE | MAP_ANONYMOUS
fd, flags = (os.open("/etc/passwd", os.O_RDONLY), 0x02) if sys.argv[1] == "file" else (-1, 0x22)
workers = 200
for _ in range(workers):
    if os.fork() == 0:
        for i in range(65000):
            if libc.mmap(None, mmap.PAGESIZE, 1 if i % 2 else 3, flags, fd, 0) in (None, ctypes.c_void_p(-1).value):
                break
        time.sleep(8)
        os._exit(0)
killed = 0
for _ in range(workers):
    killed += os.WIFSIGNALED(os.wait()[1])
print("workers", workers, "killed", killed)
"""


@pytest.mark.parametrize("how", ["anonymous", "file"])
def test_mappings_count_against_the_memory_limit(how):
    with Sandbox(limits=Limits(memory=LIMIT)) as sb:
        with lowest_available() as memory:
            r = sb.exec(["python3", "-c", MAPPINGS, how], timeout=120)
        before, lowest = memory
        assert before - lowest <= LIMIT + SLACK, (f"the host lost {(before - lowest) // MiB} MiB", r.stdout, r.stderr)
        # workers, or the process forking them, killed: by the watcher, or the cgroup's OOM killer
        assert not r.timed_out and r.oom_killed, (r.stdout, r.stderr)
        assert "cgroup" in sb.enforcement["memory"] or "each mapping" in sb.enforcement["memory"]
        assert sb.exec("echo usable").stdout == "usable\n"
