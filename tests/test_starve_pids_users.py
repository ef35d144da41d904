"""The pids budget is the host's, across users: all sandboxes on the host, of root and of every
user, hold at most ``$JAILBOX_PIDS_BUDGET`` processes together. Root's sandboxes hold half, each
account that may run them (a login shell in /etc/shells, or a range in /etc/subuid) an equal part
of the rest; each part is held by the kernel where it counts that user (``limits/budget.py``).

Attacked as root with two more local users (``jailbox-ci`` and ``jbfresh``, run with ``runuser``
from this checkout): each holds sandboxes that fork sleepers until the kernel refuses, and the
sleepers in every sandbox of the three are counted from /proc, which none of them can forge.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from support import other_users
from support.other_users import as_user, require_users

from jailbox.sandbox import hostids
from jailbox.sandbox.limits import budget

# alone: the host's pids budget is shared with every worker's jails
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parent.parent
USERS = other_users.OTHERS
BUDGET = 600  # small, so every part fills quickly: root's 300, each other account's 600 // 2 // accounts
SANDBOXES = 2
FORKS = 250  # a user's sandboxes try 500 sleepers: more than any part, as much as the whole budget

# In a process of each user: SANDBOXES sandboxes, each forking sleepers (exec'd at once: small)
# until a fork fails or FORKS are made; prints what each got and how the budget is held; keeps them
# until its stdin closes.
HOLDER = r"""
import json, sys
from jailbox.sandbox import Limits, Sandbox
count, forks = int(sys.argv[1]), int(sys.argv[2])
FORK = f'''python3 -c "
import os
n = 0
for _ in range({forks}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv('/bin/sleep', ['sleep', '600'])
    n += 1
print(n)
"'''
sandboxes = [Sandbox(limits=Limits(pids=2 * forks)) for _ in range(count)]
got = [int(sb.exec(FORK, timeout=120).stdout or 0) for sb in sandboxes]
inits = [sb.init_pid for sb in sandboxes]
print(json.dumps({"got": got, "inits": inits, "enforcement": sandboxes[0].enforcement["pids_budget"]}), flush=True)
sys.stdin.read()
for sb in sandboxes:
    sb.close()
"""


def jailed_tasks(inits: list[int]) -> int:
    """Tasks of the processes of the jails whose inits are ``inits`` (host pids): each init and what
    is under it, in a pid namespace of its own, read from /proc, which no jail and no user can write."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    count, todo = 0, list(inits)
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            tasks = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspid) > 1:
            count += tasks
    return count


@pytest.fixture
def homes() -> Iterator[dict[str, Path]]:
    with other_users.homes(USERS) as made:
        yield made


@pytest.mark.root
@pytest.mark.slow
def test_sandboxes_of_several_users_together_stay_within_the_host_budget(homes: dict[str, Path]) -> None:
    """Before, each user's sandboxes held up to the whole budget (with 1,500, two users held 1,404
    each): here root and two users would take about 600 each. Now together they stay within it."""
    require_users(USERS)
    env = {**os.environ, budget.BUDGET_ENV: str(BUDGET)}
    holders: dict[str, subprocess.Popen[str]] = {}
    try:
        for user in (None, *USERS):
            home = homes[user] if user else Path("/")
            argv = [*as_user(user, home), budget.BUDGET_ENV + f"={BUDGET}"] if user else []
            holders[user or "root"] = subprocess.Popen(
                [*argv, sys.executable, "-c", HOLDER, str(SANDBOXES), str(FORKS)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT if user is None else home,
                env=env if user is None else None,
            )  # fmt: skip
        reports = {}
        for name, holder in holders.items():
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line, f"{name}'s holder ended early"
            reports[name] = json.loads(line)
        held = {name: jailed_tasks(report["inits"]) for name, report in reports.items()}
    finally:
        for holder in holders.values():
            holder.communicate("", timeout=120)
    assert sum(held.values()) <= BUDGET, {name: (held[name], reports[name]["got"]) for name in held}
    parts = {name: budget.pids_share(BUDGET, 0 if name == "root" else pwd.getpwnam(name).pw_uid) for name in held}
    assert sum(parts.values()) <= BUDGET, parts
    for name, count in held.items():
        assert 0 < count <= parts[name], (name, held, parts, reports[name])
        assert (
            f"is {'root' if name == 'root' else 'this user'}'s part of the {BUDGET} processes"
            in (reports[name]["enforcement"])
        ), reports[name]
    for holder in holders.values():
        assert holder.returncode == 0


@pytest.mark.root
def test_doctor_tells_each_user_its_part_of_the_host_budget(homes: dict[str, Path]) -> None:
    require_users(USERS)
    probe = r"""
import json, sys
from jailbox.sandbox.checks import doctor

p = doctor.shared_bounds(doctor.Host())
print(json.dumps([p.status, p.detail, p.fix]))
"""
    seen = {}
    for user in (None, *USERS, "nobody"):
        home = homes.get(user or "", Path("/tmp"))
        argv = [*as_user(user, home), f"{budget.BUDGET_ENV}={BUDGET}"] if user else []
        r = subprocess.run(
            [*argv, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
            env={**os.environ, budget.BUDGET_ENV: str(BUDGET)} if user is None else None,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        seen[user or "root"] = json.loads(r.stdout)
    accounts = budget.sharers(0)
    assert seen["root"][0] == "ok"
    assert seen["root"][1].startswith(
        f"pids: {BUDGET // 2} is root's part of the {BUDGET} processes all sandboxes on this host share, of every "
        f"user ({budget.BUDGET_ENV}): root's sandboxes hold 1/2 of it, each of the {accounts} accounts besides root"
    ), seen["root"]
    for user in USERS:
        status, detail, _ = seen[user]
        assert status == "ok" and detail.startswith(
            f"pids: {(BUDGET - BUDGET // 2) // accounts} is this user's part of the {BUDGET} processes"
        ), seen[user]
    status, detail, fix = seen["nobody"]  # no login shell, no range: the others do not count it
    assert status == "degraded" and "nobody has neither, so the other users do not count it" in detail, seen
    assert fix.startswith("sudo usermod --add-subuids "), fix


def test_every_account_computes_parts_that_sum_to_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Login shells and subordinate ranges count, by name or uid, once; nologin accounts, root and
    jailbox's own entries do not; the parts of root and of every account counted sum to at most the
    budget, whichever of them computes them."""
    passwd, shells, subuid = tmp_path / "passwd", tmp_path / "shells", tmp_path / "subuid"
    passwd.write_text(
        "root:x:0:0::/root:/bin/bash\n"
        "daemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n"
        "svc:x:120:120::/srv:/usr/sbin/nologin\n"  # a service with a range: counted
        "alice:x:1000:1000::/home/alice:/bin/bash\n"
        "bob:x:1001:1001::/home/bob:/usr/bin/zsh\n"  # a shell /etc/shells does not list, no range
        "carol:x:1002:1002::/home/carol:/bin/sh\n"
        "broken line\n"
    )
    shells.write_text("# login shells\n/bin/sh\n/bin/bash\n")
    subuid.write_text(
        "jailbox:131072:65536\njailbox-jails:196608:268435456\nsvc:300000:65536\n1002:400000:65536\n"
        "ldapuser:500000:65536\n"
    )
    monkeypatch.setattr(budget, "PASSWD", passwd)
    monkeypatch.setattr(budget, "SHELLS", shells)
    monkeypatch.setattr(hostids, "SUBUID", subuid)
    assert budget.accounts() == {"120", "1000", "1002", "ldapuser"}
    for total in (600, 16384, 1_000_003):
        counted = [budget.pids_share(total, uid) for uid in (120, 1000, 1002)]
        assert budget.pids_share(total, 0) + counted[0] * len(budget.accounts()) <= total
        assert len(set(counted)) == 1
        assert budget.pids_share(total, 1001) < counted[0]  # bob counts himself too, so takes less
    passwd.write_text("")
    subuid.write_text("")
    assert budget.pids_share(600, 1000) == 300 and budget.pids_share(600, 0) == 300


@pytest.mark.root
def test_root_of_a_namespace_another_user_made_takes_that_users_part(homes: dict[str, Path]) -> None:
    """``unshare -r`` makes the user root of a namespace of its own; the kernel still counts its
    sandboxes as that user's, so they take that user's part, not root's."""
    require_users(USERS)
    require(shutil.which("unshare") is not None, "unshare (util-linux)", "apt-get install util-linux")
    probe = "from jailbox.sandbox.limits import budget; print(budget.caller())"
    r = subprocess.run(
        [*as_user("jailbox-ci", homes["jailbox-ci"]), "unshare", "-r", sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == pwd.getpwnam("jailbox-ci").pw_uid
    assert budget.caller() == 0
