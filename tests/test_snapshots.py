"""Durable snapshots: a sandbox's filesystem kept in the store and started from again, compared entry
by entry inside real jails; three generations deep; past the process that took it; names, refusals,
removal while in use, a replaced image, a host killed mid-copy, a jail racing the copy with links
to host paths; a private store; nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import HOST_SECRET, snapshot
from support.other_users import as_user, homes, require_users
from support.service_probe import jailbox, own_service
from support.trees import SETUP, manifest
from support.waits import wait_until

from jailbox import snapshots
from jailbox.sandbox import AsyncSandbox, Sandbox, SandboxConfig, SandboxPool
from jailbox.sandbox.errors import BranchError, SnapshotNotFound
from jailbox.sandbox.rootfs.store import Store

HANG = 300  # seconds: a hang guard only, never a measure
CAPS = ["CHOWN", "FOWNER", "FSETID", "DAC_OVERRIDE"]


@pytest.fixture
def shelf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store of the test's own; its snapshots are removed after (they may hold subordinate ids)."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    yield snapshots.root()
    for snap in snapshots.list():
        snapshots.remove(snap.id)


@pytest.fixture
def left(_state_dir: Path, shelf: Path) -> Callable[[], list[str]]:
    """What this test left: new entries of the state directory, and any but snapshots in the store."""

    def entries() -> set[str]:
        try:
            return set(os.listdir(_state_dir / "sandboxes"))
        except FileNotFoundError:
            return set()

    before = entries()
    return lambda: sorted(
        (entries() - before) | {n for n in os.listdir(shelf) if not n.startswith("snap-")} - {"names.lock"}
    )


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_a_snapshot_restores_content_modes_owners_links_holes_and_deletions(
    upper: str, left: Callable[[], list[str]]
) -> None:
    with Sandbox(upper=upper, cap_add=CAPS) as sb:
        assert sb.exec(SETUP).exit_code == 0
        before = manifest(sb)
        snap = sb.snapshot(name="set-up")
        sb.exec("echo changed > /root/tree/file; rm -rf /root/tree/sub")
    assert snap.name == "set-up" and snap.source != "" and snap.image == "host" and snap.size > 300_000
    for ref in (snap.id, "set-up"):
        with Sandbox(snapshot=ref, upper=upper, cap_add=CAPS) as again:
            assert manifest(again) == before
            assert again.exec("echo mine > /root/tree/file").exit_code == 0
    with Sandbox(snapshot=snap.id, hostname="other") as third:  # what a sandbox over it wrote stayed its own
        assert third.exec("cat /root/tree/file").stdout == "content\n"
        # the /etc files jailbox writes follow the new configuration, as over an image
        assert third.exec("cat /etc/hostname").stdout == "other\n"
    assert left() == []


def test_three_generations_each_restored_byte_for_byte(left: Callable[[], list[str]]) -> None:
    states = []
    with Sandbox(cap_add=CAPS) as sb:
        sb.exec(SETUP)
        states.append((sb.snapshot(), manifest(sb)))
    for generation in range(2):
        with Sandbox(snapshot=states[-1][0].id, cap_add=CAPS) as sb:
            sb.exec(f"echo {generation} > /root/gen; rm -f /root/tree/dangling; mkdir /root/g{generation}")
            sb.exec("truncate -s 1M /root/tree/sparse")
            states.append((sb.snapshot(), manifest(sb)))
    assert len({snap.id for snap, _ in states}) == 3
    for snap, seen in states:
        with Sandbox(snapshot=snap.id, cap_add=CAPS) as sb:
            assert manifest(sb) == seen
    assert left() == []


SNAP_AND_EXIT = r"""
from jailbox.sandbox import Sandbox
with Sandbox() as sb:
    sb.exec("echo from-another-process > /root/note")
    print(sb.snapshot(name="elsewhere").id)
"""


def test_a_snapshot_outlives_its_sandbox_and_its_process(left: Callable[[], list[str]]) -> None:
    made = subprocess.run([sys.executable, "-c", SNAP_AND_EXIT], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    [listed] = snapshots.list()
    assert listed.id == made.stdout.strip() and listed.name == "elsewhere"
    with Sandbox(snapshot="elsewhere") as sb:
        assert sb.exec("cat /root/note").stdout == "from-another-process\n"
    assert left() == []


def test_names_move_to_the_newest_and_refusals_name_what_to_do(left: Callable[[], list[str]]) -> None:
    with Sandbox() as sb:
        older = sb.snapshot(name="tip")
        sb.exec("echo 2 > /root/n")
        newer = sb.snapshot(name="tip")
        unnamed = sb.snapshot()
        assert snapshots.get("tip") == newer and snapshots.get(older.id).name is None
        assert [s.id for s in snapshots.list()] == [unnamed.id, newer.id, older.id]
        for bad in ("", "-x", "a b", "x" * 129, "a\nb", "../up"):
            with pytest.raises(BranchError, match=r"name: .* e\.g\. 'repo-ready'"):
                sb.snapshot(name=bad)
    with pytest.raises(SnapshotNotFound, match=r"no snapshot has the id or name .nope. \(there are: .*tip"):
        Sandbox(snapshot="nope")
    with pytest.raises(ValueError, match="snapshot must be a snapshot's id or name"):
        SandboxConfig(snapshot="../../etc")
    with pytest.raises(BranchError, match="was made over rootfs 'host', not '/'"):
        Sandbox(snapshot="tip", rootfs="/")
    with pytest.raises(BranchError, match="stored for other ids"):
        Sandbox(snapshot="tip", userns=False) if os.getuid() == 0 else Sandbox(snapshot="tip", idmap="single")
    assert snapshots.remove("tip") == newer
    with pytest.raises(SnapshotNotFound):
        snapshots.get("tip")
    assert left() == []


def test_a_snapshot_in_use_is_not_removed(left: Callable[[], list[str]], shelf: Path) -> None:
    with Sandbox() as sb:
        sb.exec("echo kept > /root/f")
        snap = sb.snapshot()
    with Sandbox(snapshot=snap.id) as user:
        with pytest.raises(BranchError, match="in use by a running sandbox"):
            snapshots.remove(snap.id)
        cp = user.checkpoint()  # a checkpoint and a child over it hold it too
        [child] = user.fork(1)
        user.rollback(cp)
        assert user.exec("cat /root/f").stdout == "kept\n"
        user.reset()  # back to the snapshot, not to an empty layer
        assert user.exec("cat /root/f").stdout == "kept\n"
        child.close()
        with pytest.raises(BranchError, match="in use"):
            snapshots.remove(snap.id)
    snapshots.remove(snap.id)
    assert sorted(os.listdir(shelf)) == ["names.lock"]
    assert left() == []


def test_a_replaced_image_refuses_its_old_snapshots(
    store: Store, mini_rootfs: Path, shelf: Path, left: Callable[[], list[str]]
) -> None:
    def stored() -> None:
        with store.create("mini", source="test", kind="import") as staging:
            subprocess.run(["cp", "-a", f"{mini_rootfs}/.", str(staging.tree)], check=True)

    stored()
    with Sandbox(rootfs="mini") as sb:
        sb.exec("echo over-mini > /etc/made")
        snap = sb.snapshot()
    assert snap.image == "mini"
    with Sandbox(snapshot=snap.id) as sb:
        assert sb.exec("cat /etc/made").stdout == "over-mini\n"
        assert sb.config.rootfs == "mini"
    time.sleep(0.01)
    stored()  # the image its changes were made over is gone
    with pytest.raises(BranchError, match="'mini' was replaced since"):
        Sandbox(snapshot=snap.id)
    snapshots.remove(snap.id)
    assert left() == []


def test_pools_async_sandboxes_and_configs_start_from_snapshots(left: Callable[[], list[str]]) -> None:
    async def take() -> str:
        async with AsyncSandbox() as sb:
            await sb.exec("echo async > /root/who")
            return (await sb.snapshot(name="from-async")).id

    ident = asyncio.run(take())
    with SandboxPool(2, SandboxConfig(snapshot="from-async")) as pool:
        for _ in range(3):
            with pool.acquire() as sb:
                assert sb.exec("cat /root/who").stdout == "async\n"
                sb.exec("echo dirty > /root/who")
    assert snapshots.get("from-async").id == ident
    assert left() == []


KILLED_MID_SNAPSHOT = r"""
from jailbox.sandbox import Sandbox
sb = Sandbox()
sb.exec("cd /root && for d in $(seq 0 39); do mkdir $d; for f in $(seq 0 99); do echo $f > $d/$f; done; done")
print("copying", flush=True)
while True:
    sb.snapshot()
"""


@pytest.mark.slow
def test_a_host_killed_mid_snapshot_leaves_only_whole_snapshots(left: Callable[[], list[str]], shelf: Path) -> None:
    host = subprocess.Popen([sys.executable, "-c", KILLED_MID_SNAPSHOT], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline() == "copying\n"
        time.sleep(0.5)  # several made, one under way
    finally:
        host.kill()
        host.wait()
    wait_until(lambda: left() == [], lambda: f"the launcher removing {left()}", 60)
    for snap in snapshots.list():  # each one listed is whole
        assert snap.size > 4000 * 4096 // 2
        with Sandbox(snapshot=snap.id) as sb:
            assert sb.exec("cat /root/39/99").stdout == "99\n"


RACE = r"""
cd /root
while :; do
  for n in 1 2 3 4; do
    rm -rf d$n; mkdir d$n; echo jail > d$n/f
    rm -rf d$n; ln -s {outside} d$n
    rm -f d$n; ln -s / d$n
  done
done
"""


def test_a_jail_racing_its_snapshot_with_links_to_host_paths_reaches_nothing(
    outside: Path, left: Callable[[], list[str]]
) -> None:
    os.chmod(outside.parent, 0o755)
    os.chmod(outside, 0o755)
    os.chmod(outside / "secret", 0o644)  # readable by the jail's ids, were a link ever followed
    before = snapshot(outside)
    with Sandbox() as sb:
        sb.write_file("/tmp/race.sh", RACE.format(outside=outside))
        sb.exec("bash /tmp/race.sh >/dev/null 2>&1 &")
        made = []
        for _ in range(6):
            time.sleep(0.1)
            made.append(sb.snapshot())
    links = 0
    for snap in made:
        with Sandbox(snapshot=snap.id) as sb:
            assert HOST_SECRET.strip() not in sb.exec("grep -rs 'host secret' /root").stdout
            links += int(sb.exec("find /root -maxdepth 1 -type l | wc -l").stdout)
    assert links > 0  # the copies did meet the links: kept as links, never followed
    assert snapshot(outside) == before
    assert left() == []


def test_the_store_of_snapshots_is_private(left: Callable[[], list[str]], shelf: Path) -> None:
    with Sandbox() as sb:
        sb.exec("echo private > /root/f")
        snap = sb.snapshot()
    for path in (shelf.parent, shelf, shelf / snap.id):  # its tree keeps the jail's own modes
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0, path
    assert left() == []


# As another user, with JAILBOX_CACHE_DIR naming the owner's store: list it, start from the snapshot
# by id, and read or start from its tree by path. Prints what each attempt got.
OTHER_TRIES = r"""
import json, os, sys
from jailbox import snapshots
from jailbox.sandbox import Sandbox

ident, tree = sys.argv[1:3]
out = {}
def attempt(key, call):
    try:
        out[key] = call()
    except Exception as exc:
        out[key] = "refused: " + type(exc).__name__ + ": " + str(exc)
def start(**how):
    with Sandbox(**how) as sb:
        return sb.exec("cat /root/secret").stdout
attempt("list", lambda: [snap.id for snap in snapshots.list()])
attempt("use", lambda: start(snapshot=ident))
attempt("read", lambda: os.listdir(tree))
attempt("as-rootfs", lambda: start(rootfs=tree))
print(json.dumps(out))
"""
# As the owner (not root): a snapshot of a sandbox that wrote a secret; prints its id and its tree.
OWN_SNAPSHOT = r"""
from jailbox import snapshots
from jailbox.sandbox import Sandbox
with Sandbox() as sb:
    sb.exec("echo mine > /root/secret")
    snap = sb.snapshot()
print(snap.id, snapshots.root() / snap.id)
"""


@pytest.mark.root
def test_another_user_can_neither_read_nor_use_a_users_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's snapshots against jailbox-ci, and jailbox-ci's own (a rootless store, its files owned by
    subordinate ids) against jbfresh: each told where the store is, the way to it opened up to the
    directories jailbox made, and trying every door."""
    require_users()
    with homes() as home:
        cache = home["jailbox-ci"].parent / "root-cache"
        monkeypatch.setenv("JAILBOX_CACHE_DIR", str(cache))
        with Sandbox() as sb:
            sb.exec("echo mine > /root/secret")
            snap = sb.snapshot()
        owned = {"root": (snap.id, str(snapshots.root() / snap.id), str(cache))}
        cache.chmod(0o755)  # what stands between another user and the snapshot is the store's own modes
        made = subprocess.run(
            [*as_user("jailbox-ci", home["jailbox-ci"]), sys.executable, "-c", OWN_SNAPSHOT],
            capture_output=True, text=True, cwd="/", timeout=HANG,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        ident, tree = made.stdout.split()
        owned["jailbox-ci"] = (ident, tree, str(Path(tree).parent.parent))  # the store: ~/.cache/jailbox
        for owner, other in (("root", "jailbox-ci"), ("jailbox-ci", "jbfresh")):
            ident, tree, store = owned[owner]
            tried = subprocess.run(
                [*as_user(other, home[other]), f"JAILBOX_CACHE_DIR={store}", sys.executable, "-c", OTHER_TRIES,
                 ident, tree],
                capture_output=True, text=True, cwd="/", timeout=HANG,
            )  # fmt: skip
            assert tried.returncode == 0, tried.stderr
            got = json.loads(tried.stdout)
            assert all(str(value).startswith("refused: ") for value in got.values()), (owner, other, got)
            assert "mine" not in tried.stdout, got
        cache.chmod(0o700)  # as jailbox keeps it, which it checks before removing
        snapshots.remove(snap.id)


# --- the CLI --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fork_snapshot_and_start_from_one_on_the_command_line(shelf: Path) -> None:
    with own_service() as env:
        assert jailbox(env, "create", "--name", "work").returncode == 0
        assert jailbox(env, "exec", "--id", "work", "--", "sh", "-c", "echo set-up > /root/state").returncode == 0
        r = jailbox(env, "fork", "work", "-n", "2")
        children = r.stdout.split()
        assert r.returncode == 0 and len(set(children)) == 2, r.stderr
        jailbox(env, "exec", "--id", children[0], "--", "sh", "-c", "echo child > /root/state")
        r = jailbox(env, "snapshot", children[1], "--name", "repo-ready")
        ident = r.stdout.strip()
        assert r.returncode == 0 and ident.startswith("snap-"), r.stderr
        listed = jailbox(env, "snapshots").stdout.splitlines()
        assert len(listed) == 1 and listed[0].startswith(f"{ident}  repo-ready ") and listed[0].endswith("host")
        assert jailbox(env, "exec", "--snapshot", "repo-ready", "--", "cat", "/root/state").stdout == "set-up\n"
        made = jailbox(env, "create", "--snapshot", ident).stdout.strip()
        assert jailbox(env, "exec", "--id", made, "--", "cat", "/root/state").stdout == "set-up\n"
        r = jailbox(env, "snapshots", "rm", "repo-ready")
        assert (
            r.returncode == 1
            and r.stderr == f"jailbox: snapshot {ident} is in use by a running sandbox; close it, then remove\n"
        )
        jailbox(env, "stop", made)
        assert jailbox(env, "snapshots", "rm", "repo-ready").stdout == f"removed {ident}\n"
        assert jailbox(env, "snapshots", "list", "--json").stdout.strip() == "[]"


@pytest.mark.slow
def test_snapshot_refusals_on_the_command_line_are_one_line(shelf: Path) -> None:
    with own_service() as env:
        jailbox(env, "create", "--name", "w")
        for args, code, says in [
            (("snapshot", "w", "--name", "a b"), 1, "is not a snapshot name"),
            (("snapshot", "nosuch"), 1, "no sandbox 'nosuch'"),
            (("fork", "w", "-n", "0"), 2, "-n"),
            (("fork", "../x"), 2, "jailbox fork 3f2a9c"),
            (("exec", "--snapshot", "a b/..", "--", "true"), 2, "--snapshot repo-ready"),
            (("exec", "--snapshot", "none-such", "--", "true"), 125, "no snapshot has the id or name 'none-such'"),
            (("snapshots", "rm", "none-such"), 1, "no snapshot has the id or name 'none-such'"),
        ]:
            r = jailbox(env, *args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == code and says in lines[-1], (args, r)
            assert len(lines) == 1 or lines[-1].startswith("Error: "), (args, r)  # a usage error: click's usage above
