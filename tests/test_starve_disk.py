"""No sandbox can fill the host's disk or its inode table, whichever writable layer it has.

Each test caps a small sandbox, writes past the cap several ways, and checks the bound, that the
host's inodes stayed bounded and that the sandbox (or the next one) is still usable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.config import Limits
from jailbox.sandbox.limits import disk

MiB = 1 << 20
MANY_FILES = (
    'python3 -c \'import os\nos.makedirs("{d}", exist_ok=True)\n'
    'for i in range(200000): open(f"{d}/{{i}}", "w").close()\''
)

# Files the loop makes past a disk layer's inode cap before the watcher stops it: measured 682-3,577
# in CI's passes, 8,096 in a pass beside two busy loops (the watcher's thread shares the host's CPUs).
OVER_THE_INODE_CAP = 20_000


def host_usage(top: str) -> tuple[int, int]:
    """(bytes allocated, entries) under ``top``, as the host sees them."""
    used = entries = 0
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            used += st.st_blocks * 512
            entries += 1
    return used, entries


def host_inodes_free(path: str) -> int:
    os.makedirs(path, mode=0o700, exist_ok=True)  # the state directory: not made yet in a run of one test
    return os.statvfs(path).f_favail


@pytest.fixture(autouse=True)
def next_sandbox_starts():
    yield
    with Sandbox() as sb:
        assert sb.exec("echo ok").stdout == "ok\n"


def test_the_default_sandbox_has_a_disk_and_an_inode_cap():
    with Sandbox() as sb:
        limits = sb.config.limits
        assert (limits.disk, limits.inodes, limits.memory, limits.pids) == (4 << 30, 1_000_000, 2 << 30, 512)
        assert sb.config.upper == "disk"
        assert sb.enforcement["disk"].startswith("host watcher")
        assert sb.enforcement["inodes"].startswith("host watcher")
        bounds = (
            "memory",
            "pids",
            "pids_budget",
            "kernel_counters",
            "tmpfs",
            "host_files",
            "in_flight",
            "socket_queues",
            "ipc",
        )
        built = ("aio", "ptys", "dev", "init", "output", "transfers", "teardown")  # held the same on every host
        for bound in bounds + built:
            assert not sb.enforcement[bound].startswith(("unbounded", "not", "off")), (bound, sb.enforcement[bound])
        assert "proxy" not in sb.enforcement  # no network: no proxy shared with other sandboxes


@pytest.mark.parametrize(
    "fill",
    [
        "for i in $(seq 12); do head -c 16M /dev/zero > /testbed/f$i; done",  # many files, each under the cap
        # writers in parallel, writing over time: the watcher samples every 50 ms, so a burst written
        # whole between two samples gets past the cap (docs/bounds.md)
        "for i in $(seq 6); do (for j in $(seq 40); do head -c 1M /dev/zero; sleep 0.02; done > /testbed/p$i) &"
        " done; wait",
        "mkdir -p /fill && for i in $(seq 12); do head -c 16M /dev/zero > /fill/f$i; done",  # outside the workdir
    ],
)
def test_a_disk_layer_is_held_to_the_disk_cap(fill):
    with Sandbox(limits=Limits(disk="64M")) as sb:
        upper = str(sb._jail.dir / "upper")
        r = sb.exec(fill, timeout=120)
        assert r.disk_limit_hit is True and r.exit_code != 0
        used, _ = host_usage(upper)
        assert used < 192 * MiB  # the writes asked for 192M or more; what got past the cap: docs/bounds.md
        assert sb.exec("rm -rf /testbed/* /fill; echo usable").stdout == "usable\n"
        assert sb.exec("head -c 1M /dev/zero > /testbed/small && echo wrote").stdout == "wrote\n"


@pytest.mark.alone  # how far past the cap a writer gets is the watcher's sampling delay, which other workers stretch
@pytest.mark.parametrize("write", ["head -c 400M /dev/zero > /testbed/big", "dd if=/dev/zero of=/big bs=1M count=400"])
def test_one_file_stops_at_the_disk_cap(write):
    with Sandbox(limits=Limits(disk="32M")) as sb:
        r = sb.exec(write, timeout=120)
        assert r.disk_limit_hit is True and r.signal == signal.SIGKILL
        used, _ = host_usage(str(sb._jail.dir / "upper"))
        # a writer from /dev/zero gets what it writes between the watcher's samples past the cap before
        # it is killed: measured 49-158 MiB held in 6 runs beside other suites (at most 126 MiB past the
        # cap), once 289 MiB beside CI's four workers; the bound lets 224 MiB past, not the whole 400 MiB
        assert used < 32 * MiB + 224 * MiB, used // MiB


@pytest.mark.alone  # counts the host filesystem's free inodes, which other workers' tests use too
@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_files_are_held_to_the_inode_cap(upper):
    before = host_inodes_free(os.environ["JAILBOX_STATE_DIR"])
    with Sandbox(upper=upper, limits=Limits(inodes=5000, disk="256M")) as sb:
        r = sb.exec(MANY_FILES.format(d="/testbed/many"), timeout=120)
        assert r.exit_code != 0
        count = int(sb.exec("ls /testbed/many | wc -l").stdout)
        if upper == "disk":  # the watcher's samples: stopped well short of the loop's 200,000 files
            assert r.disk_limit_hit is True
            assert count < 5000 + OVER_THE_INODE_CAP, count
            assert before - host_inodes_free(os.environ["JAILBOX_STATE_DIR"]) < 5000 + OVER_THE_INODE_CAP
        else:  # the tmpfs's own inode count, exact (4,984 files and the layer's own entries)
            assert "No space left on device" in r.stderr
            assert count <= 5000, count
        sb.exec("rm -rf /testbed/many")
        assert sb.exec("touch /testbed/one && echo ok").stdout == "ok\n"


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/dev"])
def test_every_tmpfs_has_an_inode_cap(where):
    with Sandbox(limits=Limits(inodes=5000)) as sb:
        r = sb.exec(MANY_FILES.format(d=f"{where}/many"), timeout=120)
        assert r.exit_code != 0 and "No space left on device" in r.stderr
        assert int(sb.exec(f"ls {where}/many | wc -l").stdout) <= 5000
        assert sb.exec(f"rm -rf {where}/many; echo usable").stdout == "usable\n"


# files of 1-24 MiB, 300 MiB in all, allocated by one process in a few ms: a burst past twice the cap,
# then a wait the watcher ends by killing it once it has seen the burst (a walk taken after the removal
# began would judge the burst then, and kill the removal, as docs/bounds.md says of bursts)
BURST = (
    'python3 -c \'import os\nfor i in range(1, 25): os.posix_fallocate(os.open(f"/testbed/f{i}", '
    "os.O_CREAT | os.O_WRONLY), 0, i << 20)' && exec sleep 120"
)


@pytest.mark.parametrize(
    "fill, remove",
    [
        # written over time, so the watcher sees it while it is written
        ("for i in $(seq 8); do head -c 16M /dev/zero > /testbed/f$i; sleep 0.2; done", "rm -f /testbed/f*; sleep 0.5"),
        # past twice the cap, a file at a time over many walks: a walk that stopped counting at twice
        # the cap saw a different part of the layer each time, and this was killed
        (BURST, "for f in $(ls /testbed | shuf); do rm /testbed/$f; sleep 0.05; done"),
        (BURST, "for f in $(ls /testbed | shuf); do truncate -s 0 /testbed/$f; sleep 0.05; done"),
        (BURST, "for i in $(seq 24 -1 1); do rm /testbed/f$i; sleep 0.05; done"),
    ],
    ids=["over time", "removed one by one", "truncated one by one", "largest first"],
)
def test_removing_files_over_the_cap_is_not_killed(fill, remove):
    with Sandbox(limits=Limits(disk="64M")) as sb:
        r = sb.exec(fill, timeout=120)
        assert r.disk_limit_hit is True
        if fill == BURST:  # the case: past twice the cap when the watcher first saw it
            assert host_usage(str(sb._jail.dir / "upper"))[0] > 2 * 64 * MiB
        r = sb.exec(f"{remove}; echo cleaned", timeout=120)
        assert r.stdout == "cleaned\n" and r.disk_limit_hit is False


SWAPPER = """
import os, time
os.makedirs("/testbed/big")
os.chdir("/testbed/big")
for i in range(60000):  # so that a walk of this directory spans many samples
    open(f"f{i}", "w").close()
for i in range(20):
    os.makedirs(f"d{i}/usr")
    for j in range(500):
        open(f"d{i}/usr/{j}", "w").close()
end = time.monotonic() + 12  # about 120 rounds of swaps
while time.monotonic() < end:
    for i in range(20):  # each directory, listed as one, becomes a link to the host's root
        os.rename(f"d{i}", f"r{i}")
        os.symlink("/", f"d{i}")
    time.sleep(0.05)
    for i in range(20):
        os.unlink(f"d{i}")
        os.rename(f"r{i}", f"d{i}")
    time.sleep(0.05)
print("done")
"""


@pytest.mark.slow
def test_the_walk_of_a_layer_never_follows_a_link_swapped_in_for_a_directory():
    """The jail swaps directories the watcher has listed for links to "/" (and the parents of ones it
    has listed: d/usr then names the host's /usr): a walk that followed either would count the host's
    files as the jail's and kill it for them, and stat what it should not see."""
    with Sandbox(limits=Limits(disk="256M")) as sb:
        r = sb.exec(["python3", "-c", SWAPPER], timeout=180)
        assert (r.exit_code, r.stdout, r.disk_limit_hit) == (0, "done\n", False), r.stderr


REFUSED = """
import errno, json, os, struct, sys
from jailbox.sandbox.floor import linux as L
# what a host under a seccomp profile older than openat2 gets: ENOSYS for it, everything else allowed
program = b"".join(struct.pack("HBBI", *op) for op in (
    (0x20, 0, 0, 0), (0x15, 0, 1, L._NR["openat2"]), (0x06, 0, 0, 0x00050000 | errno.ENOSYS), (0x06, 0, 0, 0x7FFF0000)))
L.prctl(38, 1)  # no_new_privs: what an unprivileged filter needs
L.install_seccomp(program, listener=False)
top = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
seen = {}
for path in ("a", "a/b", ".", "up", "up/usr", "a/up/usr", "a/b/up"):
    try:
        fd = L.open_beneath(top, path, os.O_RDONLY | os.O_DIRECTORY, L.RESOLVE_NO_SYMLINKS | L.RESOLVE_NO_XDEV)
        seen[path] = sorted(os.listdir(fd))
        os.close(fd)
    except OSError as exc:
        seen[path] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""


def test_a_walk_where_openat2_is_refused_still_never_follows_a_link(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "in").write_text("")
    for link in ("up", "a/up", "a/b/up"):
        (tmp_path / link).symlink_to("/")
    proc = subprocess.run([sys.executable, "-c", REFUSED, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen.pop("a") == ["b", "up"] and seen.pop("a/b") == ["in", "up"] and seen.pop(".") == ["a", "up"]
    assert set(seen.values()) <= {"ELOOP", "ENOTDIR"}, seen  # each link refused, as a last component or not


DEEP = """
import os, sys, time
name, levels = sys.argv[1], int(sys.argv[2])
for _ in range(levels):
    os.mkdir(name)
    os.chdir(name)  # each step relative: the whole path is past what one call may name
with open("data", "wb") as f:
    for _ in range(400):
        f.write(b"x" * (1 << 20))
        f.flush()
        time.sleep(0.02)
"""


WRITTEN = """
import os, sys
for _ in range(int(sys.argv[2])):
    os.chdir(sys.argv[1])
print(os.stat("data").st_blocks * 512)
"""


@pytest.mark.parametrize(("name", "levels"), [("n" * 250, 24), ("d", 5000)], ids=["long names", "many levels"])
def test_data_deeper_than_a_path_can_name_is_held_to_the_disk_cap(name, levels):
    """A directory whose path is past PATH_MAX could not be opened by it, and what it held went
    uncounted: the walk opens deep directories from ones it holds open below the layer."""
    with Sandbox(limits=Limits(disk="64M")) as sb:
        r = sb.exec(["python3", "-c", DEEP, name, str(levels)], timeout=180)
        assert r.disk_limit_hit is True and r.signal == signal.SIGKILL, (r.exit_code, r.stderr)
        written = sb.exec(["python3", "-c", WRITTEN, name, str(levels)]).stdout
        assert 0 < int(written) < 192 * MiB  # the writer was after 400M
        where = sb.dir
    assert where is not None and not where.exists()  # removed whole: shutil.rmtree's recursion gave out


WIDE = """
import os, sys, time
for _ in range(12):  # 3,000 bytes down: each waiting directory's path would be as long
    os.mkdir("n" * 250)
    os.chdir("n" * 250)
for i in range(int(sys.argv[1])):
    os.mkdir(f"{i:0250}")
time.sleep(120)
"""

SIDEWAYS = """
import os, sys, time
for level in range(int(sys.argv[1])):  # a chain with side branches at every level, read after it
    for k in range(8):  # names of their own at each level: one of them, at least, is listed before d
        os.mkdir(f"s{level}.{k}")
        if k == 3:
            os.mkdir("d")
    os.chdir("d")
time.sleep(120)
"""


def _peaks(stop: threading.Event, seen: dict[str, int]) -> None:
    me = psutil.Process()
    while not stop.wait(0.01):
        seen["rss"] = max(seen["rss"], me.memory_info().rss)
        seen["fds"] = max(seen["fds"], me.num_fds())


@pytest.mark.parametrize(
    ("script", "count"), [(WIDE, 60_000), (SIDEWAYS, 2_200)], ids=["many waiting", "many open bases"]
)
@pytest.mark.slow
def test_a_tree_too_big_to_walk_in_bounds_is_judged_over_them(script, count):
    """What a walk holds for the directories it has still to read is the jail's to shape: 60,000 of
    3,000 bytes of path each took the host 200 MB at every walk. Past ``WALK_HELD`` bytes or
    ``WALK_BASES`` open directories, the walk stops and the jail is judged over its bounds, though
    it is within them (the tree is far under 1G and 200,000 entries)."""
    with Sandbox(limits=Limits(disk="1G", inodes=200_000)) as sb:
        seen = {"rss": psutil.Process().memory_info().rss, "fds": psutil.Process().num_fds()}
        before = dict(seen)
        stop = threading.Event()
        sampler = threading.Thread(target=_peaks, args=(stop, seen))
        sampler.start()
        try:
            r = sb.exec(["python3", "-c", script, str(count)], timeout=180)
        finally:
            stop.set()
            sampler.join()
        assert r.disk_limit_hit is True and r.signal == signal.SIGKILL, (r.exit_code, r.stdout, r.stderr)
        assert seen["rss"] - before["rss"] < 64 * MiB
        assert seen["fds"] - before["fds"] <= disk.WALK_BASES + 16
