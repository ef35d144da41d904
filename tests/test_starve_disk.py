"""No sandbox can fill the host's disk or its inode table, whichever writable layer it has.

Each test caps a small sandbox, writes past the cap several ways, and checks the bound, that the
host's inodes stayed bounded and that the sandbox (or the next one) is still usable.
"""

from __future__ import annotations

import os
import signal

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.config import Limits

MiB = 1 << 20
MANY_FILES = (
    'python3 -c \'import os\nos.makedirs("{d}", exist_ok=True)\n'
    'for i in range(200000): open(f"{d}/{{i}}", "w").close()\''
)


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
    return os.statvfs(path).f_favail


@pytest.fixture(autouse=True)
def next_sandbox_starts():
    yield
    with Sandbox() as sb:
        assert sb.exec("echo ok").stdout == "ok\n"


def test_the_default_sandbox_has_a_disk_and_an_inode_cap():
    with Sandbox() as sb:
        assert sb.enforcement["disk"].startswith("host watcher")
        assert sb.enforcement["inodes"].startswith("host watcher")
        assert not sb.enforcement["disk"].startswith("not enforced")


@pytest.mark.parametrize(
    "fill",
    [
        "for i in $(seq 12); do head -c 16M /dev/zero > /testbed/f$i; done",  # many files, each under the cap
        # writers in parallel, writing over time: the watcher samples every 50 ms, so a burst written
        # whole between two samples gets past the cap (README, "Resource bounds")
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
        assert used < 192 * MiB  # the writes asked for 192M or more; what got past the cap is measured in README
        assert sb.exec("rm -rf /testbed/* /fill; echo usable").stdout == "usable\n"
        assert sb.exec("head -c 1M /dev/zero > /testbed/small && echo wrote").stdout == "wrote\n"


@pytest.mark.parametrize("write", ["head -c 400M /dev/zero > /testbed/big", "dd if=/dev/zero of=/big bs=1M count=400"])
def test_one_file_stops_at_the_disk_cap(write):
    with Sandbox(limits=Limits(disk="32M")) as sb:
        r = sb.exec(write, timeout=120)
        assert r.disk_limit_hit is True and r.signal == signal.SIGKILL
        used, _ = host_usage(str(sb._jail.dir / "upper"))
        assert used < 400 * MiB


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_files_are_held_to_the_inode_cap(upper):
    before = host_inodes_free(os.environ["JAILBOX_STATE_DIR"])
    with Sandbox(upper=upper, limits=Limits(inodes=5000, disk="256M")) as sb:
        r = sb.exec(MANY_FILES.format(d="/testbed/many"), timeout=120)
        assert r.exit_code != 0
        count = int(sb.exec("ls /testbed/many | wc -l").stdout)
        assert count < 20_000
        if upper == "disk":
            assert r.disk_limit_hit is True
            assert before - host_inodes_free(os.environ["JAILBOX_STATE_DIR"]) < 20_000
        else:
            assert "No space left on device" in r.stderr
        sb.exec("rm -rf /testbed/many")
        assert sb.exec("touch /testbed/one && echo ok").stdout == "ok\n"


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/dev"])
def test_every_tmpfs_has_an_inode_cap(where):
    with Sandbox(limits=Limits(inodes=5000)) as sb:
        r = sb.exec(MANY_FILES.format(d=f"{where}/many"), timeout=120)
        assert r.exit_code != 0 and "No space left on device" in r.stderr
        assert int(sb.exec(f"ls {where}/many | wc -l").stdout) <= 5000
        assert sb.exec(f"rm -rf {where}/many; echo usable").stdout == "usable\n"


def test_removing_files_over_the_cap_is_not_killed():
    with Sandbox(limits=Limits(disk="64M")) as sb:
        # written over time, so the watcher sees it while it is written: a burst between two samples is
        # only seen after it ended, and then the next command is the one stopped (README, "Resource bounds")
        sb.exec("for i in $(seq 8); do head -c 16M /dev/zero > /testbed/f$i; sleep 0.2; done", timeout=120)
        r = sb.exec("rm -f /testbed/f*; sleep 0.5; echo cleaned")
        assert r.stdout == "cleaned\n" and r.disk_limit_hit is False
