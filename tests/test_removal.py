"""A closed sandbox's directory is removed after close() returns (sandbox/removal.py): out of
sandboxes/ at once, gone from trash/ once removed, and removed all the same when its host dies first,
or closes faster than the disk removes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.waits import wait_until

from jailbox.sandbox import Sandbox, removal, state

pytestmark = pytest.mark.needs("subids")  # files of another of the jail's users

# files the jail's root and another of its users leave, in a directory only that user may enter:
# rootless, the host's user cannot remove them itself (the launcher does, in a namespace of the map)
MESSY = "mkdir -p /testbed/a/b && echo x > /testbed/a/b/f && chmod 700 /testbed/a && chown -R 1000:1000 /testbed/a"


def _trash(base: Path) -> list[str]:
    return sorted(p.name for p in state.trash_dir(base).iterdir())


def test_close_moves_the_directory_out_and_the_remover_removes_it(_state_dir):
    removal.wait()
    closed = []
    for _ in range(3):
        sb = Sandbox(cap_add=["CHOWN"])
        assert sb.exec(MESSY).exit_code == 0
        sb.close()
        closed.append(sb.id)
        assert not sb.dir.exists()
        assert sb.id not in os.listdir(_state_dir / "sandboxes")
    assert removal.wait(60)
    assert set(closed).isdisjoint(_trash(_state_dir))  # other dead hosts' are their launchers'


def test_past_the_backlog_close_removes_its_own(_state_dir, monkeypatch):
    """A caller that closes faster than the disk removes would pile up trash: past BACKLOG trees
    waiting (here none may wait), close() removes the directory before it returns."""
    removal.wait()
    monkeypatch.setattr(removal, "BACKLOG", 0)
    sb = Sandbox(cap_add=["CHOWN"])
    assert sb.exec(MESSY).exit_code == 0
    sb.close()
    assert not sb.dir.exists()
    assert sb.id not in _trash(_state_dir)


DYING = r"""
import json, os
from jailbox.sandbox import Sandbox, state
sb = Sandbox(cap_add=["CHOWN"])
# a tree that takes its remover a while (about 6 ms a directory on this disk), messy as MESSY
tree = "mkdir -p /testbed/t && cd /testbed/t && for i in $(seq 400); do mkdir d$i; done"
assert sb.exec(tree + " && " + MESSY).exit_code == 0
sb.close()
print(json.dumps({"id": sb.id, "trash": sorted(os.listdir(state.trash_dir(state.state_dir())))}), flush=True)
os._exit(0)  # no atexit: the remover's queue dies with the host
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exits without atexit", "SIGKILL"])
def test_a_host_gone_before_its_remover_leaves_the_launcher_to_remove_it(_state_dir, how):
    removal.wait()
    code = DYING.replace("MESSY", repr(MESSY))
    if how == "SIGKILL":
        code = code.replace("os._exit(0)", "import time; time.sleep(1000)")
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).parent.parent)
    )
    info = json.loads(child.stdout.readline())
    if how == "SIGKILL":
        child.send_signal(signal.SIGKILL)
    child.wait()
    assert info["id"] in info["trash"]  # its host went before the remover was done
    wait_until(lambda: info["id"] not in _trash(_state_dir), "the launcher to remove the closed sandbox", 60)


def test_cleanup_removes_trash_whose_owner_is_gone_and_leaves_a_live_owners(_state_dir):
    """A dead owner's closed sandbox is removed; a live owner's is its remover's, also once that has
    removed the meta.json that names the owner (a young tree without one is left alone)."""
    removal.wait()
    trash = state.trash_dir(_state_dir)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone, live, unnamed = trash / "closedgone01", trash / "closedlive01", trash / "closedbare01"
    for path, pid, start in ((gone, int(dead.stdout), 1), (live, os.getpid(), state.own_start())):
        (path / "upper" / "x").mkdir(parents=True, mode=0o700)
        state.write_meta(path, host_pid=pid, host_start=start)
    (unnamed / "upper").mkdir(parents=True, mode=0o700)
    removed, failed = state.cleanup(_state_dir)
    assert gone in removed and live not in removed and unnamed not in removed and failed == []
    assert not gone.exists() and live.exists() and unnamed.exists()
    removed, failed = state.cleanup(_state_dir, force=True)
    assert {live, unnamed} <= set(removed) and failed == [] and _trash(_state_dir) == []


def test_the_host_exit_waits_for_its_remover(_state_dir):
    """A host that exits normally removes what it closed before it goes (atexit, bounded)."""
    removal.wait()
    code = DYING.replace("MESSY", repr(MESSY)).replace("os._exit(0)", "import sys; sys.exit(0)")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(Path(__file__).parent.parent), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["id"] in info["trash"]
    assert info["id"] not in _trash(_state_dir)  # gone when the process was
