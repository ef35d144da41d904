"""The attack battery, device nodes: the jail's /dev binds the host's own nodes, so their inodes must
not change through the jail, whoever the jail's root is on the host (as root today: host root).

Each test snapshots the host's nodes and checks them after; reads and writes of the devices keep
working. Root and rootless alike.
"""

from __future__ import annotations

import os

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import SandboxSetupError

NODES = ("null", "zero", "full", "random", "urandom", "tty")


def _host_nodes() -> dict[str, tuple[int, int, int]]:
    return {n: (st.st_mode, st.st_uid, st.st_gid) for n in NODES for st in [os.stat(f"/dev/{n}")]}


def test_no_command_changes_a_host_device_node(sb):
    before = _host_nodes()
    tries = [f"chmod 777 /dev/{n}; chown 1:1 /dev/{n}; touch -d 2001-01-01 /dev/{n}" for n in NODES]
    tries += [
        "chmod 777 /proc/self/fd/0",  # stdin: an empty pipe, not a host node
        "chmod 777 /sys/kernel/vmcoreinfo /proc/kcore /proc/timer_list",  # masks bind the host's /dev/null
        "python3 -c \"import os; os.chmod(os.open('/dev/null', os.O_WRONLY), 0o777)\"",
        "python3 -c \"import os; fd = os.open('/dev/zero', os.O_RDONLY); os.fchmod(fd, 0o600)\"",
    ]
    for attempt in tries:
        sb.exec(attempt)
    assert _host_nodes() == before
    r = sb.exec("echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c && cat")
    assert (r.exit_code, r.stdout) == (0, "4\n4\n")  # the devices work, and stdin reads as empty


@pytest.mark.parametrize(
    ("workdir", "refusal"),
    [
        ("/dev/null", "not a directory"),
        ("/dev/zero", "not a directory"),
        ("/proc/self/fd/0", "Too many levels of symbolic links"),  # a magic link is never followed
    ],
)
def test_a_device_as_the_working_directory_is_refused_and_changes_nothing(workdir, refusal):
    before = _host_nodes()
    with pytest.raises(SandboxSetupError, match=refusal):
        Sandbox(workdir=workdir)
    assert _host_nodes() == before
