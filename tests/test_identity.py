"""User namespaces and id maps, rootless and as root, and kernel refusals with their fixes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jailbox.sandbox import Sandbox, hostids
from jailbox.sandbox.errors import ConfigError


def _uid_map(sb: Sandbox) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in sb.exec("cat /proc/self/uid_map").stdout.splitlines()]


@pytest.mark.rootless
def test_rootless_single_map_puts_the_caller_at_uid_0():
    with Sandbox(idmap="single") as sb:
        assert _uid_map(sb) == [[0, os.getuid(), 1]]
        assert sb.exec("id -u; echo x > /testbed/f; stat -c %u /testbed/f").stdout == "0\n0\n"


@pytest.mark.rootless
@pytest.mark.needs("subids")
def test_rootless_full_range_lets_programs_switch_ids():
    with Sandbox(cap_add=["ALL"]) as sb:
        rows = _uid_map(sb)
        assert rows[0] == [0, os.getuid(), 1] and rows[1][0] == 1 and rows[1][2] >= 1000
        r = sb.exec(
            "mkdir /testbed/d && chown 1000:1000 /testbed/d && python3 -c 'import os; os.setgid(1000); "
            'os.setuid(1000); open("/testbed/d/f", "w").write("x"); print(os.getuid())\''
        )
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "1000\n"
        box_dir = sb.dir
    assert not box_dir.exists()  # files owned by subordinate ids were removed too


@pytest.mark.rootless
def test_rootless_userns_false_is_refused():
    with pytest.raises(ConfigError, match="needs root"):
        Sandbox(userns=False)


@pytest.mark.root
def test_root_uses_a_user_namespace_with_its_own_range():
    pool = hostids._pool_range(str(hostids.SUBUID), str(hostids.SUBGID))[0]
    assert pool >= hostids.FIRST_ID
    with Sandbox() as sb:
        [[inside, start, count]] = _uid_map(sb)
        assert (inside, count) == (0, 65536) and pool <= start < pool + hostids.POOL_SLOTS * 65536
        ns_inside = sb.exec("readlink /proc/self/ns/user").stdout.strip()
        assert ns_inside != os.readlink("/proc/self/ns/user")


@pytest.mark.root
def test_root_without_user_namespace_when_asked():
    with Sandbox(userns=False) as sb:
        assert sb.exec("readlink /proc/self/ns/user").stdout.strip() == os.readlink("/proc/self/ns/user")
        r = sb.exec("cat /proc/self/status")
        assert "NoNewPrivs:\t1" in r.stdout and "CapEff:\t0000000000000000" in r.stdout
        assert sb.exec("touch /usr/x").exit_code != 0


def test_kernel_refusal_names_the_sysctl_that_fixes_it():
    """A real refusal: inside a user namespace whose own user-namespace limit is 0."""
    script = (
        "echo 0 > /proc/sys/user/max_user_namespaces && exec " + sys.executable + " -c '"
        "from jailbox.sandbox import Sandbox\nfrom jailbox.sandbox.errors import KernelRefused\n"
        "try:\n    Sandbox()\nexcept KernelRefused as exc:\n    print(exc)'"
    )
    if os.getuid() == 0:  # root's jails need root's range mapped in the namespace too: we write its maps
        r = _in_userns_with_roots_range(script)
    else:
        r = _as_root_of_own_userns(script)
    assert "sysctl -w user.max_user_namespaces=" in r.stdout, r.stderr
    with Sandbox() as sb:
        assert sb.exec("true").exit_code == 0


def _in_userns_with_roots_range(script: str) -> subprocess.CompletedProcess:
    """``script`` as root of a new user namespace that maps host root and root's jail range.
    The shell waits for its maps, then execs a new shell: capabilities come with that exec."""
    uid, gid = hostids.plan("auto").host_root()
    proc = subprocess.Popen(
        ["unshare", "--user", "sh", "-c", 'read go && exec sh -c "$0"', script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    for key, first in (("uid_map", uid), ("gid_map", gid)):
        for _ in range(500):  # until unshare has made the namespace (a bounded wait)
            if os.readlink(f"/proc/{proc.pid}/ns/user") != os.readlink("/proc/self/ns/user"):
                break
            time.sleep(0.01)
        Path(f"/proc/{proc.pid}/{key}").write_text(f"0 0 1\n{first} {first} 65536\n")
    out, err = proc.communicate("go\n", timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.rootless
def test_root_of_a_users_own_namespace_runs_jails_as_that_user():
    """uid 0 of a namespace an unprivileged user made (``unshare --map-root-user``) is that user, not
    the host's root: its jails need no range of root's, and their root is that same one id."""
    script = (
        "exec " + sys.executable + " -c '"
        "from jailbox.sandbox import Sandbox\nwith Sandbox() as sb:\n"
        '    print(sb.exec("cat /proc/self/uid_map").stdout.split())\''
    )
    r = _as_root_of_own_userns(script)
    assert r.stdout.strip() == "['0', '0', '1']", r.stderr


def _as_root_of_own_userns(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` as uid 0 of a user namespace this (unprivileged) user makes, mapping only itself."""
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=60,
    )
