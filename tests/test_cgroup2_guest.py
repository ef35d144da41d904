"""cgroup v2 for real: the cgroup tests, run as root and as a delegated user inside a QEMU guest.

This machine has cgroup v1 only; the guest (Debian's kernel under software emulation, this host's
filesystem shared read-only) has the unified hierarchy that laptops and most CI runners have.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ci_user, require
from support import qemu_guest

ROOT = Path(__file__).resolve().parent.parent
GUEST_TESTS = (
    "tests/test_limits.py tests/test_pause.py -k 'bomb or quota or ordinary or pause_twice or uses_no_cpu or outlive'"
)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.guest
@pytest.mark.timeout(1800)
@pytest.mark.needs("qemu-system-x86_64", "apt-get", "dpkg-deb", "cpio", "test-user")
def test_cgroup_v2_limits_in_a_qemu_guest(_alone: Callable[[], None]) -> None:
    require(
        Path(sys.base_prefix).is_relative_to("/usr"),
        f"a venv made from a Python under /usr (the guest runs it from the host's /usr, not {sys.base_prefix})",
        "sudo apt-get install python3-venv && /usr/bin/python3 -m venv .venv",
    )
    user = ci_user()
    assert user is not None
    # One process per pass (-n 0): the suite's four workers, each starting Python and pytest under
    # emulation, made each pass 76 s against 58 and the whole test 147 s against 93 here.
    pytest_cmd = "/tmp/venv/bin/python -m pytest -p no:cacheprovider -n 0 -q --durations=0 --durations-min=1"
    pytest_cmd += f" -m 'cgroup or not nocgroup' {GUEST_TESTS}"
    script = f"""
set -e
export HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/repo /tmp/venv
mount --bind /mnt{ROOT} /tmp/repo
mount --bind /mnt{sys.prefix} /tmp/venv
cd /tmp/repo
echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control
# root's pass runs beside the user's (two vCPUs; under emulation each pass is mostly Python starting),
# from the root group: this shell moves to the user's delegated group below, its child stays.
# Its output is in the scratch folder, so that it comes back even if the guest has to be killed.
(JAILBOX_STATE_DIR=/tmp/jb-root {pytest_cmd} > /var/tmp/root.out 2>&1; echo $? > /tmp/root.rc) &
ROOT_PASS=$!
mkdir /tmp/u && chown {user.pw_uid}:{user.pw_gid} /tmp/u
AS_USER="setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --init-groups env HOME=/tmp/u JAILBOX_STATE_DIR=/tmp/u/jb"
echo "=== doctor before delegation"
$AS_USER /tmp/venv/bin/python -c 'from jailbox.cli import main; main()' doctor --json | tr -d '\n'; echo
# what systemd's Delegate=yes does for a user's scope
mkdir -p /sys/fs/cgroup/user/session
chown -R {user.pw_uid}:{user.pw_gid} /sys/fs/cgroup/user
echo '+memory +pids +cpu' > /sys/fs/cgroup/user/cgroup.subtree_control
echo $$ > /sys/fs/cgroup/user/session/cgroup.procs
echo "=== doctor after delegation"
$AS_USER /tmp/venv/bin/python -c 'from jailbox.cli import main; main()' doctor --json | tr -d '\n'; echo
echo "=== {user.pw_name}"
USER_RC=0
$AS_USER {pytest_cmd} || USER_RC=$?
wait $ROOT_PASS
[ "$USER_RC" = 0 ] && [ "$(cat /tmp/root.rc)" = 0 ]
"""
    rc, out = qemu_guest.run(script, booted=_alone)  # once booted, the alone tests run beside it
    assert rc == 0, out[-12000:]
    lines = out.splitlines()
    before, after = (
        json.loads(lines[lines.index(f"=== doctor {when} delegation") + 1]) for when in ("before", "after")
    )
    cgroup_before = next(p for p in before if p["name"] == "cgroups")
    assert cgroup_before["status"] == "degraded" and "Delegate=yes" in cgroup_before["fix"]
    assert next(p for p in after if p["name"] == "cgroups")["status"] == "ok"
    summaries = [line for line in out.splitlines() if " passed" in line or " failed" in line]
    assert len(summaries) == 2, out[-6000:]
    for summary in summaries:  # root (root.out), then the delegated user: the same cgroup-backed tests (4 of
        # limits, 6 of pause: with a cgroup v2 every sandbox has one, so both of pause's ways freeze it)
        assert summary.startswith("10 passed") and "failed" not in summary, out[-6000:]
