"""Nothing leaks: after close(), after SIGKILL of the host, over 200 sandboxes (acceptance point 4)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import host_tree, jail_processes, pid_namespace_held
from support.descriptors import held_fds
from support.waits import wait_until

from jailbox.sandbox import Sandbox, state
from jailbox.sandbox.launcher import LAUNCHER
from jailbox.sandbox.limits import budget
from jailbox.sandbox.state import cleanup

CHILD = r"""
import json, sys, time
from jailbox.sandbox import Sandbox
from jailbox.sandbox.launcher import LAUNCHER
sb = Sandbox()
sb.exec("sleep 1000 & setsid sleep 1001 &")
print(json.dumps({"init": sb.init_pid, "ns": sb.exec("readlink /proc/self/ns/pid").stdout.strip(),
                  "dir": str(sb.dir), "launcher": LAUNCHER.pid}), flush=True)
time.sleep(1000)
"""


def _snapshot() -> dict:
    fds = held_fds()  # first: it waits for the remover, whose work shows in every count
    return {
        "processes": sorted({p.pid for p in host_tree()}),
        "fds": fds,
        "mounts": Path("/proc/self/mountinfo").read_text().count("\n"),
    }


def _sandbox_dirs(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "sandboxes").iterdir())


@pytest.mark.alone  # counts the host's mounts, which other workers' jails change
def test_close_leaves_no_process_mount_or_directory(_state_dir):
    with Sandbox():
        pass  # the launcher now exists: it belongs to the baseline
    before = _snapshot()
    sb = Sandbox()
    sb.exec("sleep 1000 & setsid sleep 1001 & (sleep 1002 &)")
    ns = sb.exec("readlink /proc/self/ns/pid").stdout.strip()
    assert len(jail_processes(ns)) >= 3  # the init itself is not dumpable: only root sees its ns
    assert sb.dir.exists()
    assert _snapshot() != before
    with pid_namespace_held(ns):
        sb.close()
        sb.close()  # idempotent
        assert jail_processes(ns) == []
    assert not psutil.pid_exists(sb.init_pid)
    assert not sb.dir.exists()
    assert _sandbox_dirs(_state_dir) == []
    assert _snapshot() == before  # once the remover is done with the directory close() handed it
    assert not (state.trash_dir(_state_dir) / sb.id).exists()


@pytest.mark.parametrize("group", [False, True], ids=["the host", "its whole process group"])
def test_sigkill_of_the_host_process_kills_and_removes_everything(_state_dir, group):
    """Killing the host's process group at once (as `kill -9 -PGID`, a supervisor, or Ray's raylet when
    a worker ends do) reaches the host only: the launcher lives on to kill the jails and remove their files."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parent.parent),
        start_new_session=group,  # a group of its own, which the test can kill whole
    )
    info = json.loads(child.stdout.readline())
    assert len(jail_processes(info["ns"])) >= 2
    with pid_namespace_held(info["ns"]):
        if group:
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.send_signal(signal.SIGKILL)
        child.wait()
        wait_until(lambda: jail_processes(info["ns"]) == [], "the jail's processes to end", 30)
    wait_until(
        lambda: (
            not psutil.pid_exists(info["launcher"]) or psutil.Process(info["launcher"]).status() == psutil.STATUS_ZOMBIE
        ),
        "the launcher to end",
        30,
    )
    wait_until(lambda: not Path(info["dir"]).exists(), "the sandbox directory to go", 30)


HALF_MADE = r"""
import json, os, sys, time
from pathlib import Path
from jailbox.sandbox import Sandbox, state
sb = Sandbox()
# what Jail does first for the next sandbox, before it asks the launcher for the jail: the host dies here
half = Path(sb.dir).parent / "halfmade0001"
half.mkdir(mode=0o700)
state.write_meta(half, host_pid=os.getpid(), host_start=state.own_start())
print(json.dumps({"dir": str(sb.dir), "half": str(half)}), flush=True)
time.sleep(1000)
"""


def test_a_host_killed_while_making_a_sandbox_leaves_no_directory(_state_dir):
    """The host names itself in a sandbox directory as soon as it makes it: killed before it asked
    for the jail, the directory is removed by its launcher too, and `cleanup` knows it is dead at once."""
    child = subprocess.Popen(
        [sys.executable, "-c", HALF_MADE], stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).parent.parent)
    )
    info = json.loads(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    wait_until(
        lambda: not Path(info["dir"]).exists() and not Path(info["half"]).exists(), "both sandbox directories to go", 30
    )
    late = _state_dir / "sandboxes" / "halfmade0002"  # one whose launcher is gone as well
    late.mkdir(mode=0o700)
    (late / "meta.json").write_text(json.dumps({"host_pid": child.pid, "host_start": 1.0}))
    removed, failed = cleanup(_state_dir)
    assert late in removed and not failed and not late.exists()


# The host dies inside Jail's making of its next sandbox directory, at the step argv[1] names, after
# printing what the state directory's sandboxes/ and trash/ hold then.
DIES_MAKING = r"""
import json, os, signal, sys
from jailbox.sandbox import Sandbox, state
sb = Sandbox()  # the launcher now knows this state directory
write_meta, rename, point = state.write_meta, os.rename, sys.argv[1]
def die() -> None:
    held = [str(p) for folder in ("sandboxes", "trash") for p in (sb.dir.parent.parent / folder).iterdir()]
    print(json.dumps({"pid": os.getpid(), "held": held}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
def meta(path, **fields):
    if point == "before its meta":
        die()
    write_meta(path, **fields)
    if point == "after its meta":
        die()
def moved(src, dst):
    rename(src, dst)
    if point == "once moved in" and os.path.dirname(dst) == str(sb.dir.parent):
        die()
state.write_meta, os.rename = meta, moved
Sandbox()
"""


@pytest.mark.parametrize("point", ["before its meta", "after its meta", "once moved in"])
def test_a_host_killed_at_any_step_of_making_a_sandbox_directory_leaves_none(_state_dir, point):
    """Killed between making the next sandbox's directory and writing its owner into it, between
    that and moving it into sandboxes/, or after: its launcher removes every directory it left, in
    sandboxes/ and trash/ (a directory without its meta in sandboxes/ once waited for `cleanup`'s grace)."""
    child = subprocess.Popen(
        [sys.executable, "-c", DIES_MAKING, point],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parent.parent),
    )
    info = json.loads(child.stdout.readline())
    assert child.wait() == -signal.SIGKILL
    held = [Path(p) for p in info["held"]]
    making = [p for p in held if p.parent.name == "trash" and p.name.startswith(f"new-{info['pid']}-")]
    live = [p for p in held if p.parent.name == "sandboxes"]
    # the first sandbox's directory, and the next one's: in the trash while being made, then beside it
    assert (len(making), len(live)) == ((0, 2) if point == "once moved in" else (1, 1)), held

    # the trash may hold other tests' closed sandboxes meanwhile: their hosts' removers are theirs
    def left() -> list[Path]:
        return [p for p in [*making, *live] if p.exists()]

    wait_until(lambda: not left(), lambda: f"what the dead host left to go: {left()}", 60)


@pytest.mark.parametrize("reaped", [True, False], ids=["owner reaped", "owner a zombie"])
def test_cleanup_removes_what_a_crashed_launcher_left(_state_dir, reaped):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).parent.parent)
    )
    info = json.loads(child.stdout.readline())
    with pid_namespace_held(info["ns"]):
        os.kill(info["launcher"], signal.SIGKILL)  # no janitor left: the jail dies, its files stay
        wait_until(lambda: jail_processes(info["ns"]) == [], "the jail's processes to end", 30)
    child.kill()
    if reaped:
        child.wait()
    else:  # dead, but its parent has not called wait(): its pid and start time are still in /proc
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert Path(info["dir"]).exists()
    removed, failed = cleanup(_state_dir)
    child.wait()
    assert failed == []
    assert info["dir"] in [str(p) for p in removed]  # with what other dead hosts of this worker left, if any
    assert [p for p in removed if p.parent.name == "sandboxes"] == [Path(info["dir"])]
    assert not Path(info["dir"]).exists()


def test_cleanup_leaves_live_sandboxes_alone(_state_dir):
    with Sandbox() as sb:
        removed, failed = cleanup(_state_dir)
        assert removed == [] and failed == []
        assert sb.exec("echo alive").stdout == "alive\n"


STEPPED = r"""
import sys
from pathlib import Path
from jailbox.sandbox import state
from jailbox.sandbox.limits import budget
base = Path(sys.argv[1])
removed, failed = state.cleanup(base)
budget.claim_counters(base, "stepped0001")  # rewrites the ledger, dropping owners it finds dead
budget.release_counters(base, "stepped0001")
print(len(removed), len(failed))
"""


def test_a_step_of_the_wall_clock_leaves_live_sandboxes_and_their_counters_alone(tmp_path, monkeypatch):
    """A host's clock may be stepped while sandboxes run (NTP at boot, a VM resumed): owners were once
    recorded in seconds since the epoch, which such a step moves, and 12 s of it made `cleanup` kill live
    sandboxes and the counters ledger drop their grants. The step is shown to a second process as the
    kernel shows it, in /proc/stat's boot time (in a mount namespace of its own), since stepping this
    host's clock would move every other test's. The state directory is the test's own: the worker's
    may hold an earlier test's sandbox whose removal is rightly finished by `cleanup`."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(state_dir))
    stat = Path("/proc/stat").read_text()
    stepped = tmp_path / "stat"
    stepped.write_text(re.sub(r"(?m)^btime (\d+)$", lambda m: f"btime {int(m[1]) + 12}", stat))
    stepped.chmod(0o644)
    namespace = ["unshare", "--mount"] if os.getuid() == 0 else ["unshare", "--map-root-user", "--mount"]
    code = f"mount --bind {stepped} /proc/stat && grep '^btime ' /proc/stat && exec \"$@\""
    with Sandbox() as sb:
        ledger = (state_dir / budget.LEDGER).read_text()
        assert sb.id in ledger  # this sandbox was given a share of the user's counters
        proc = subprocess.run(
            [*namespace, "sh", "-c", code, "sh", sys.executable, "-c", STEPPED, str(state_dir)],
            capture_output=True,
            text=True,
            cwd=str(Path(__file__).parent.parent),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        seen, counts = proc.stdout.splitlines()
        assert int(seen.split()[1]) != int(re.search(r"(?m)^btime (\d+)$", stat)[1])  # it saw the step
        assert counts == "0 0"
        assert sb.exec("echo alive").stdout == "alive\n"
        assert sb.id in (state_dir / budget.LEDGER).read_text()


@pytest.mark.alone  # counts the host's mounts, which other workers' jails change
@pytest.mark.slow
def test_two_hundred_sandboxes_in_a_row_leave_counts_unchanged(_state_dir):
    with Sandbox():
        pass
    before = _snapshot()
    for i in range(200):
        with Sandbox() as sb:
            assert sb.exec(f"echo {i}").stdout == f"{i}\n"
    assert _snapshot() == before
    assert _sandbox_dirs(_state_dir) == []
    assert LAUNCHER.pid in before["processes"]


def test_sandboxes_work_with_descriptor_numbers_above_1024():
    """Hosts with hundreds of sandboxes hold thousands of descriptors: nothing may use select(2)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    null = os.open("/dev/null", os.O_RDONLY)
    filler = [os.dup(null) for _ in range(1100)]
    try:
        with Sandbox() as sb:
            assert sb.exec("echo high").stdout == "high\n"
            sb.write_file("/testbed/f", b"x")
            assert sb.read_file("/testbed/f") == b"x"
    finally:
        for fd in [*filler, null]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
