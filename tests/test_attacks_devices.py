"""The attack battery, device nodes: the jail's /dev binds the host's own nodes, so their inodes must
not change through the jail, whoever the jail's root is on the host.

A jail's user namespace never maps host uid 0, which owns the nodes: there the kernel refuses a chmod
or chown whatever jailbox mounts. So each test also runs (as root) a jail without a user namespace,
whose root is the host's and holds CAP_CHOWN and CAP_FOWNER: only the read-only binds stand between
it and the host's inodes. Each test snapshots the nodes' mode, owner and times and checks them after;
reads and writes of the devices keep working.
"""

from __future__ import annotations

import os

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import SandboxSetupError

NODES = ("null", "zero", "full", "random", "urandom", "tty")
# the jails that try: the default one, and one whose root is the host's own (the kernel would let it)
JAILS = [
    pytest.param({}, id="default"),
    pytest.param({"userns": False, "cap_add": ["CHOWN", "FOWNER"]}, id="host-root", marks=pytest.mark.root),
]


def host_nodes() -> dict[str, tuple[int, ...]]:
    """Each node's mode, owner, group, and modification and change times (a chmod or chown changes
    the change time even when it sets what was there)."""
    return {
        n: (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns)
        for n in NODES
        for st in [os.stat(f"/dev/{n}")]
    }


@pytest.mark.parametrize("jail", JAILS)
def test_no_command_changes_a_host_device_node(jail):
    before = host_nodes()
    tries = [f"chmod 777 /dev/{n}; chown 1:1 /dev/{n}; touch -d 2001-01-01 /dev/{n}" for n in NODES]
    tries += [
        "chmod 777 /sys/kernel/vmcoreinfo /proc/kcore /proc/timer_list",  # masks bind the host's /dev/null
        "touch -d 2001-01-01 /sys/kernel/vmcoreinfo /proc/kcore; chown 1:1 /proc/timer_list",
        "python3 -c \"import os; os.chmod(os.open('/dev/null', os.O_WRONLY), 0o777)\"",
        "python3 -c \"import os; fd = os.open('/dev/zero', os.O_RDONLY); os.fchmod(fd, 0o600)\"",
        "python3 -c \"import os; fd = os.open('/dev/full', os.O_RDONLY); os.fchown(fd, 1, 1)\"",
        "python3 -c \"import os; os.utime(os.open('/dev/urandom', os.O_RDONLY), (0, 0))\"",
    ]
    with Sandbox(**jail) as sb:
        for attempt in tries:
            r = sb.exec(attempt)
            assert r.exit_code != 0 and "Read-only file system" in r.stderr, (attempt, r.stderr)
        sb.exec("chmod 777 /proc/self/fd/0")  # stdin: an empty pipe of the jail's, not a host node
        r = sb.exec("echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c && cat")
        assert (r.exit_code, r.stdout) == (0, "4\n4\n")  # the devices work, and stdin reads as empty
    assert host_nodes() == before


@pytest.mark.parametrize(
    ("workdir", "refusal"),
    [
        ("/dev/null", "not a directory"),
        ("/dev/zero", "not a directory"),
        ("/proc/self/fd/0", "Too many levels of symbolic links"),  # a magic link is never followed
    ],
)
@pytest.mark.parametrize("jail", JAILS)
def test_a_device_as_the_working_directory_is_refused_and_changes_nothing(workdir, refusal, jail):
    before = host_nodes()
    with pytest.raises(SandboxSetupError, match=refusal):
        Sandbox(workdir=workdir, **jail)
    assert host_nodes() == before
