"""No sandbox starves the host through shared kernel counters: pids, per-user counters, leftovers.

Each test asserts the bound and that the host stayed usable: the host user can still create an
inotify instance while a jail holds all it can, the host can still fork while sandboxes hold the
whole pids budget, a crashed host process's cgroups go, a YAML bomb costs no memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.waits import wait_until

from jailbox.sandbox import Sandbox
from jailbox.sandbox.checks import doctor
from jailbox.sandbox.errors import ConfigError, SandboxSetupError
from jailbox.sandbox.floor import procstat
from jailbox.sandbox.launcher import LAUNCHER
from jailbox.sandbox.limits import budget, cgroupfs, cgroups, reap

# alone: the user's pids budget, its counters and the host's stale groups are shared with every worker's jails
pytestmark = pytest.mark.alone

ROOT = str(Path(__file__).resolve().parent.parent)

# Opens inotify instances until the kernel refuses, as each of the uids in argv[1] in turn (a child
# per uid, which keeps its instances), writes the total to argv[2], then holds them all.
HOG = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
total = 0
for uid in [int(u) for u in sys.argv[1].split(",")]:
    r, w = os.pipe()
    if os.fork() == 0:
        if uid:
            os.setgid(uid)
            os.setuid(uid)
        n = 0
        while libc.inotify_init1(0) >= 0:
            n += 1
        os.write(w, b"%d" % n)
        time.sleep(600)
        os._exit(0)
    os.close(w)
    total += int(os.read(r, 32) or b"0")
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(total))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(600)
"""

SET = "echo 100000 > /proc/sys/user/max_inotify_instances && cat /proc/sys/user/max_inotify_instances"
RAISE = {  # how: (the command that raises the limit, then runs the hog in the same namespace; raised?)
    # /proc/sys/user is read-only in the jail
    "direct write": (f"{SET}; exec python3 /hog/hog.py {{uids}} /hog/total", False),
    # with its capabilities kept, root of the jail can remount /proc read-write and raise its own
    # namespace's limits: not the ones that bind it
    "remounted /proc": (f"mount -o remount,rw /proc && {SET} && exec python3 /hog/hog.py {{uids}} /hog/total", True),
    # a nested user namespace has limits of its own to raise, and is charged up the chain: the hog runs
    # in it (as its root, the one uid it maps); its map is written to /proc, remounted read-write first
    "nested user namespace": (
        f"mount -o remount,rw /proc && unshare -U -r sh -c '{SET} && exec python3 /hog/hog.py 0 /hog/total'",
        True,
    ),
}


def _host_inotify() -> int:
    fd = ctypes.CDLL(None, use_errno=True).inotify_init1(0)
    if fd >= 0:
        os.close(fd)
    return fd


def _written(path: Path) -> str:
    """What the hog wrote to ``path`` (it renames the file into place whole), within a hang guard."""
    return wait_until(lambda: path.exists() and path.read_text(), str(path), 60)


@pytest.mark.parametrize("how", sorted(RAISE))
def test_a_jail_takes_a_bounded_share_of_the_users_inotify_instances(how, tmp_path):
    limit = budget.counter_limits()["max_inotify_instances"]
    (tmp_path / "hog.py").write_text(HOG)
    tmp_path.chmod(0o777)  # the hog's result is written as whichever uid the jail maps to
    hog = {"src": str(tmp_path), "dst": "/hog", "readonly": False}
    with Sandbox(cap_add=["ALL"], seccomp=None, mounts=[hog]) as sb:
        assert sb.enforcement["kernel_counters"].startswith("limits of the user namespace the jail's is nested in")
        mapped = sum(int(n) for n in sb.exec("cat /proc/self/uid_map").stdout.split()[2::3])
        # each uid has counts of its own in the jail's namespace: use eight where the jail maps them
        uids = ",".join(str(u) for u in range(min(mapped, 8)))
        command, raised = RAISE[how]
        sb.exec(f"({command.format(uids=uids)}) > /hog/said 2>&1 &")
        total = tmp_path / "total"
        held = int(
            wait_until(
                lambda: total.exists() and total.read_text(),
                lambda: f"the hog's total; it said {(tmp_path / 'said').read_text()!r}",
                60,
            )
        )
        said = (tmp_path / "said").read_text()
        assert said == "100000\n" if raised else "Read-only file system" in said, said
        assert 0 < held <= limit, (held, limit)
        assert _host_inotify() >= 0  # while the jail holds all it can


# --- per-user counters: a budget all sandboxes of a user share, across processes ----------------------

# In a process of its own: argv[2] sandboxes, each running the hog in its own directory under argv[1];
# prints what they were given and hold, then keeps them until its stdin closes.
HOLD = r"""
import json, os, sys, time
from pathlib import Path
from jailbox.sandbox import Sandbox
from test_starve_counters import _hog_all, _hog_dir
hog = _hog_dir(Path(sys.argv[1]))
sandboxes = [Sandbox(mounts=[hog]) for _ in range(int(sys.argv[2]))]
given = [sb._jail.spec.counters["max_inotify_instances"] for sb in sandboxes]
held = _hog_all(sandboxes, Path(sys.argv[1])) if sys.argv[3] == "hog" else []
print(json.dumps({"given": given, "held": held}), flush=True)
sys.stdin.read()
for sb in sandboxes:
    sb.close()
"""


def _instances() -> tuple[int, int]:
    """(what one sandbox is given, what all of this user's sandboxes may hold together)."""
    limit = int(Path("/proc/sys/user/max_inotify_instances").read_text())
    return budget.counter_limits()["max_inotify_instances"], limit // budget.USER_SHARE


def _hog_dir(where: Path) -> dict:
    """A directory for the hog and its results, and the mount that puts it at /hog."""
    where.mkdir(exist_ok=True)
    where.chmod(0o777)  # the results are written as whichever uid the jail maps to
    (where / "hog.py").write_text(HOG)
    return {"src": str(where), "dst": "/hog", "readonly": False}


def _hog_all(sandboxes: list[Sandbox], where: Path) -> list[int]:
    """Each sandbox opens all the inotify instances it can, as two uids where it maps them (the
    bound is on all its uids together); returns what each holds, once all hold it."""
    for sb in sandboxes:
        mapped = sum(int(n) for n in sb.exec("cat /proc/self/uid_map").stdout.split()[2::3])
        uids = ",".join(str(u) for u in range(min(mapped, 2)))
        sb.exec(f"python3 /hog/hog.py {uids} /hog/{sb._jail.id} > /dev/null 2>&1 &")
    return [int(_written(where / sb._jail.id)) for sb in sandboxes]


def _ledger_lines() -> list[str]:
    from jailbox.sandbox import state

    path = state.state_dir() / budget.LEDGER
    return path.read_text().splitlines() if path.exists() else []


def _after_all_closed() -> None:
    """The whole budget is free again: a new sandbox gets its full share, and can use it."""
    share, _ = _instances()
    with Sandbox() as sb:
        assert sb._jail.spec.counters["max_inotify_instances"] == share
        assert len(_ledger_lines()) == 1
        opened = sb.exec('python3 -c "import ctypes; print(ctypes.CDLL(None).inotify_init1(0))"').stdout
        assert int(opened) >= 0
    assert _ledger_lines() == []


def test_sandboxes_of_one_process_together_hold_at_most_the_users_counter_budget(tmp_path):
    share, total = _instances()
    count = total // share + 4  # more than the budget has room for (20 with the default limits)
    hog = _hog_dir(tmp_path)
    sandboxes = [Sandbox(mounts=[hog]) for _ in range(count)]
    try:
        given = [sb._jail.spec.counters["max_inotify_instances"] for sb in sandboxes]
        assert sum(given) == total and max(given) == share and 0 in given
        held = _hog_all(sandboxes, tmp_path)
        assert all(h <= g for h, g in zip(held, given, strict=True)) and sum(held) <= total
        assert _host_inotify() >= 0  # while they hold all they can
        assert "share" in sandboxes[-1].enforcement["kernel_counters"]
        with Sandbox() as late:  # one more, with nothing left for it, still runs
            assert late._jail.spec.counters["max_inotify_instances"] == 0
            assert late.exec("echo up").stdout == "up\n"
    finally:
        for sb in sandboxes:
            sb.close()
    _after_all_closed()


def _holder(where: Path, count: int, hog: bool) -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(where), str(count), "hog" if hog else "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,  # HOLD imports this module
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, "the holder process failed"
    return child, json.loads(line)


def test_sandboxes_of_two_processes_together_hold_at_most_the_users_counter_budget(tmp_path):
    share, total = _instances()
    count = total // share // 2 + 2  # in each process: together more than the budget has room for
    child, theirs = _holder(tmp_path / "theirs", count, hog=True)
    ours = tmp_path / "ours"
    hog = _hog_dir(ours)
    sandboxes = [Sandbox(mounts=[hog]) for _ in range(count)]
    try:
        given = theirs["given"] + [sb._jail.spec.counters["max_inotify_instances"] for sb in sandboxes]
        assert sum(given) == total and 0 in given
        held = theirs["held"] + _hog_all(sandboxes, ours)
        assert sum(held) <= total
        assert _host_inotify() >= 0
    finally:
        for sb in sandboxes:
            sb.close()
        child.communicate("", timeout=120)
    assert child.returncode == 0
    _after_all_closed()


def test_a_killed_process_does_not_keep_its_share_of_the_counters(tmp_path):
    share, total = _instances()
    child, theirs = _holder(tmp_path / "theirs", total // share + 1, hog=False)
    assert sum(theirs["given"]) == total  # all of it
    child.send_signal(signal.SIGKILL)
    child.wait()
    _after_all_closed()  # its entries go at the next update


def test_a_corrupt_counters_ledger_is_started_afresh_with_what_this_process_holds(tmp_path, caplog):
    from jailbox.sandbox import state

    path = state.state_dir() / budget.LEDGER
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    share, _ = _instances()
    live = f"{os.getppid()} {procstat.start_ticks(os.getppid())}"  # a live owner, not this process
    corrupt = {
        "binary junk": lambda: path.write_bytes(secrets.token_bytes(300)),
        "half a line, as a crash mid-write leaves it": lambda: path.write_text(f"0123456789ab {os.getpid()} 17"),
        "a grant beyond one sandbox's share": lambda: path.write_text(f"0123456789ab {live} {share * 99} 0 0 0\n"),
        "a negative grant": lambda: path.write_text(f"0123456789ab {live} -{share * 99} 0 0 0\n"),
        "too large": lambda: path.write_text(f"0123456789ab {live} 1 0 0 0\n" * (budget.LEDGER_MAX // 20)),
        "a symlink": lambda: (path.unlink(missing_ok=True), path.symlink_to(outside)),
    }
    with Sandbox() as held:
        for how, damage in corrupt.items():
            damage()
            with caplog.at_level("WARNING", logger="jailbox"), Sandbox() as sb:
                assert sb._jail.spec.counters["max_inotify_instances"] == share, how
                assert any("ledger" in r.getMessage() for r in caplog.records), how
                ids = sorted(line.split()[0] for line in _ledger_lines())
                assert ids == sorted([held._jail.id, sb._jail.id]), how  # ours restated, the forged gone
            caplog.clear()
            assert not path.is_symlink() and outside.read_text() == "keep\n", how
    assert _ledger_lines() == []


# --- pids: a budget all sandboxes share -------------------------------------------------------------

# In a process of its own: COUNT sandboxes; each forks up to 15 sleepers that stay; prints how many
# each got, and whether the host could fork; with "hold", keeps them until its stdin closes.
# OWN: "cg:GROUP,PARENT": run from GROUP (a group of the pids hierarchy), sandboxes' groups made under
# PARENT where JAILBOX_CGROUP_PARENT is read (v2), jails without a user namespace (root), so the
# cgroup's budget is all that holds them; "+N": the budget is this user's tasks now plus N;
# "": the budget the environment says.
BUDGET = r"""
import json, os, subprocess, sys
from pathlib import Path
own, count, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
userns = True
if own.startswith("cg:"):
    group, parent = own[3:].split(",")
    Path(group, "cgroup.procs").write_text(str(os.getpid()))
    os.environ["JAILBOX_CGROUP_PARENT"] = parent
    userns = False
elif own.startswith("+"):  # rootless, the budget counts all of this user's processes; as root, of root's jails
    mine = (lambda uid: uid >= 100000) if os.getuid() == 0 else (lambda uid: uid == os.getuid())
    tasks = sum(len(os.listdir(f"/proc/{p}/task")) for p in os.listdir("/proc")
                if p.isdigit() and os.path.exists(f"/proc/{p}") and mine(os.stat(f"/proc/{p}").st_uid))
    from jailbox.sandbox.limits import budget  # the host's budget whose part for this user is that
    parts = 1 if os.getuid() == 0 else budget.sharers(os.getuid())
    os.environ["JAILBOX_PIDS_BUDGET"] = str(budget.ROOT_SHARE * parts * (tasks + int(own[1:])))
from jailbox.sandbox import Sandbox
FORK = '''python3 -c "
import os, time
n = 0
for _ in range(15):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    n += 1
print(n)
"'''
sandboxes = [Sandbox(userns=userns) for _ in range(count)]
got = [int(sb.exec(FORK).stdout or 0) for sb in sandboxes]
host = subprocess.run(["true"]).returncode == 0
print(json.dumps({"got": got, "host_forks": host, "enforcement": sandboxes[0].enforcement["pids_budget"]}), flush=True)
if hold:
    sys.stdin.read()
for sb in sandboxes:
    sb.close()
"""


def _budget_command(own: str, count: int, hold: bool = False) -> list[str]:
    return [sys.executable, "-c", BUDGET, own, str(count), "hold" if hold else "end"]


def _budget_run(own: str, env: dict[str, str], count: int = 3, pre: tuple[str, ...] = ()) -> dict:
    r = subprocess.run(
        [*pre, *_budget_command(own, count)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _check_budget(result: dict) -> None:
    first, second, third = result["got"]
    assert first == second == 15  # within the budget
    assert third < 15  # the third sandbox's forks fail: the first two hold most of the budget
    assert result["host_forks"]


@contextlib.contextmanager
def _pids_groups(owns: int) -> Iterator[tuple[list[Path], str]]:
    """(``owns`` sibling groups of the pids hierarchy to run processes from; the parent the sandboxes'
    groups are made under where JAILBOX_CGROUP_PARENT is read, v2); all removed after, with the
    ``jailbox`` groups made in them."""
    tag = f"jbx-budget-{os.getpid()}"
    v2 = cgroupfs.v2_mounted()
    root = cgroupfs.V2_ROOT if v2 else cgroupfs.v1_mounts()["pids"]
    groups = [root / f"{tag}-own{i}" for i in range(owns)]
    made = [*groups, *([root / tag] if v2 else [])]
    for group in made:
        group.mkdir()
    try:
        yield groups, tag
    finally:
        for group in made:
            made_in = sorted((p for p in group.glob("jailbox/*") if p.is_dir()), reverse=True)  # not its files
            for sub in [*made_in, group / "jailbox", group]:
                if sub.exists():
                    cgroupfs.remove_v2(sub) if v2 else cgroupfs.remove_v1([sub])


@pytest.mark.root
@pytest.mark.cgroup
def test_sandboxes_together_stay_within_the_pids_budget_of_their_cgroup(tmp_path):
    """Jails without a user namespace run as host root, which RLIMIT_NPROC does not bind: the
    budget is pids.max of their jailbox group."""
    # each sandbox: its init, the python that forks, 15 sleepers; 40 leave the third a few forks
    with _pids_groups(1) as (groups, parent):
        result = _budget_run(f"cg:{groups[0]},{parent}", {"JAILBOX_PIDS_BUDGET": str(40 * budget.ROOT_SHARE)})
        assert "pids.max=40" in result["enforcement"] and "RLIMIT_NPROC" not in result["enforcement"]
        _check_budget(result)


@pytest.mark.alone  # the user's budget is shared with every worker's jails
def test_sandboxes_together_stay_within_the_pids_budget_of_their_user():
    """Rootless, and as root with or without a cgroup: RLIMIT_NPROC of the user namespace's creator
    counts every process of that user, the host's and every sandbox's."""
    # the user's tasks now, plus: the launcher, three inits, twice (python + 15 sleepers), and a few
    result = _budget_run(f"+{1 + 3 + 2 * 16 + 4}", {})
    assert "RLIMIT_NPROC=" in result["enforcement"]
    _check_budget(result)


def test_sandboxes_of_processes_in_different_cgroups_share_one_pids_budget():
    """Root's processes run from different cgroups (each login session and service has its own), and
    the pids cgroup budget is on a jailbox group under the caller's: RLIMIT_NPROC is what holds all of
    root's sandboxes together. One process holds two sandboxes of 15 sleepers; another, run from a
    group of its own, with a budget of what the user has then plus 8, gets fewer than 15. Before, as
    root, it got all 15 (and two sessions could take every pid of the host)."""
    with contextlib.ExitStack() as stack:
        groups = (
            stack.enter_context(_pids_groups(2))[0]
            if os.getuid() == 0 and (cgroups.v1_usable() or cgroupfs.v2_mounted())
            else []
        )

        def moved(i: int) -> tuple[str, ...]:
            return ("sh", "-c", f'echo $$ > {groups[i]}/cgroup.procs && exec "$@"', "sh") if groups else ()

        holder = subprocess.Popen(
            [*moved(0), *_budget_command("", 2, hold=True)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            held = json.loads(holder.stdout.readline())
            assert held["got"] == [15, 15], held
            other = _budget_run("+8", {}, count=1, pre=moved(1))
            assert other["got"][0] < 15 and other["host_forks"], other
        finally:
            holder.communicate("", timeout=120)
        assert holder.returncode == 0


def test_the_pids_budget_is_checked():
    for bad in ("0", "-5", "lots", "150%", str(budget.pid_max() + 1)):
        os.environ[budget.BUDGET_ENV] = bad
        try:
            with pytest.raises(ConfigError, match=f"{budget.BUDGET_ENV}=.*e.g. {budget.BUDGET_ENV}=8000"):
                budget.pids_budget()
        finally:
            del os.environ[budget.BUDGET_ENV]
    assert budget.pids_budget() == budget.pid_max() // 2


@pytest.mark.root
def test_the_pids_budget_is_a_share_of_threads_max_where_pid_max_is_higher():
    """systemd raises kernel.pid_max to 4194304; a fork past kernel.threads-max (memory over 128 KiB)
    fails all the same, root's too, so the budget is a share of the lower of the two."""
    pid_max = Path("/proc/sys/kernel/pid_max")
    before = pid_max.read_text()
    threads = int(Path("/proc/sys/kernel/threads-max").read_text())
    pid_max.write_text("4194304")
    try:
        assert budget.pids_budget() == min(4194304, threads) // 2
        with Sandbox() as sb:
            assert f"pids.max={min(4194304, threads) // 2 // budget.ROOT_SHARE}" in sb.enforcement["pids_budget"]
    finally:
        pid_max.write_text(before)
    assert budget.pids_budget() == min(int(before), threads) // 2


# --- leftovers: cgroups of a killed host process ------------------------------------------------------

HOLDER = r"""
import json, time
from jailbox.sandbox import Sandbox
from jailbox.sandbox.checks import doctor
from jailbox.sandbox.errors import ConfigError, SandboxSetupError
from jailbox.sandbox.floor import procstat
from jailbox.sandbox.launcher import LAUNCHER
sb = Sandbox()
sb.exec("sleep 1000 &")
group = sb._jail.cgroup
print(json.dumps([str(p) for p in group.dirs.values()] if hasattr(group, "dirs") else [str(group.path)]), flush=True)
time.sleep(1000)
"""


def _killed_holder() -> list[Path]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    groups = [Path(p) for p in json.loads(child.stdout.readline())]
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert groups and all(g.exists() for g in groups)
    return groups


@pytest.mark.cgroup
@pytest.mark.xdist_group("stale-cgroups")  # one worker: each removes what the others leave
def test_jailbox_cleanup_removes_the_cgroups_of_a_killed_host_process():
    groups = _killed_holder()
    r = subprocess.run([*JAILBOX, "cleanup"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    for group in groups:
        assert f"removed {group}" in r.stdout
        assert not group.exists()


@pytest.mark.cgroup
@pytest.mark.xdist_group("stale-cgroups")  # one worker: each removes what the others leave
def test_a_new_process_removes_the_cgroups_dead_owners_left():
    groups = _killed_holder()
    r = subprocess.run(
        [sys.executable, "-c", "from jailbox.sandbox import Sandbox\nwith Sandbox() as sb: sb.exec('true')"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert not any(group.exists() for group in groups)


@pytest.mark.cgroup
@pytest.mark.xdist_group("stale-cgroups")  # one worker: each removes what the others leave
def test_cleanup_removes_empty_groups_of_the_old_naming_and_keeps_busy_ones():
    """Groups named by a bare sandbox id (before names recorded an owner) cannot be tied to a
    process: empty and idle ones go, one with a process in it stays, and its process lives."""
    groups = _killed_holder()
    parent = groups[0].parent
    empty = [parent / secrets.token_hex(6) for _ in range(3)]
    busy = parent / secrets.token_hex(6)
    young = parent / secrets.token_hex(6)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        for group in [*empty, busy, young]:
            group.mkdir()
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        for group in [*empty, busy]:
            old = time.time() - 2 * reap.OLD_IDLE
            os.utime(group, (old, old))
        r = subprocess.run([*JAILBOX, "cleanup"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        assert not any(group.exists() for group in empty), r.stdout
        assert busy.exists() and young.exists()
        assert sleeper.poll() is None
        assert not any(group.exists() for group in groups)
    finally:
        sleeper.kill()
        sleeper.wait()
        for group in (busy, young):
            cgroupfs.remove_v2(group) if cgroupfs.v2_mounted() else cgroupfs.remove_v1([group])


# --- a YAML bomb in a prompt config ---------------------------------------------------------------------

LAUGHS = "".join(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
BOMBS = {
    "aliases": "l0: &l0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + LAUGHS + "system_prompt: *l8\n",
    "merge keys": "base: &b {a: 1, b: 2}\nsystem_prompt: x\nother: {<<: *b}\n",
    "deep nesting": "system_prompt: " + "[" * 200_000 + "\n",
    "a huge file": "system_prompt: '" + "x" * (3 << 20) + "'\n",
}
MEASURE = r"""
import json, resource, sys
from jailbox.agent import prompts

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    prompts.load(sys.argv[1])
    error = None
except ValueError as exc:
    error = str(exc)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps([error, grown]))
"""


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_yaml_bomb_in_a_prompt_config_is_refused_with_bounded_memory(kind, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS[kind])
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 0, r.stderr
    error, grown_kb = json.loads(r.stdout)
    assert error is not None and error.startswith(str(path)) and "\n" not in error
    assert grown_kb < 64 * 1024  # KiB: the bomb would take gigabytes


def test_jails_whose_init_fails_at_once_leave_the_launcher_running():
    """The init may exit before its launcher-side pipe is written (its A now waits for A2 first)."""
    Sandbox().close()
    launcher = LAUNCHER.pid
    for _ in range(60):
        with pytest.raises(SandboxSetupError, match="not a directory"):
            Sandbox(workdir="/dev/null")
    assert LAUNCHER.pid == launcher
    with Sandbox() as sb:
        assert sb.exec("echo up").stdout == "up\n"


def test_doctor_reports_the_shared_bounds_and_a_bad_budget(monkeypatch):
    assert doctor.shared_bounds(doctor.Host()).status == "ok"
    monkeypatch.setenv(budget.BUDGET_ENV, "half")
    probe = doctor.shared_bounds(doctor.Host())
    assert probe.status == "failing" and budget.BUDGET_ENV in probe.detail and budget.BUDGET_ENV in probe.fix
