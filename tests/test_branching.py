"""checkpoint(), rollback() and fork(): round trips compared entry by entry inside real jails,
deep chains, long cycles with bounded mounts and disk, a jail racing the cut with links to host
paths, and nothing left after close()."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import HOST_SECRET, snapshot
from support.trees import SETUP, manifest
from support.waits import wait_until

from jailbox.sandbox import Sandbox
from jailbox.sandbox.child.layers import MAX_DEPTH, MAX_LAYERS
from jailbox.sandbox.errors import BranchError
from jailbox.sandbox.layers import Checkpoint


@pytest.fixture
def left(_state_dir: Path) -> Callable[[], list[str]]:
    """What this test's sandboxes left in the state directory: entries that were not there before
    it (other tests of the same worker share the directory)."""

    def entries() -> set[str]:
        try:
            return set(os.listdir(_state_dir / "sandboxes"))
        except FileNotFoundError:
            return set()

    before = entries()
    return lambda: sorted(entries() - before)


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_round_trip_keeps_content_modes_owners_links_holes_and_deletions(
    upper: str, left: Callable[[], list[str]]
) -> None:
    with Sandbox(upper=upper, cap_add=["CHOWN", "FOWNER", "FSETID", "DAC_OVERRIDE"]) as sb:
        assert sb.exec(SETUP).exit_code == 0
        before = manifest(sb)
        assert before["/root/tree/sparse"][5] and "/etc/os-release" not in before  # a hole; a whiteout
        cp = sb.checkpoint()
        sb.exec("echo changed > /root/tree/file; rm -rf /root/tree/sub /home/u; echo x > /etc/os-release")
        assert manifest(sb) != before
        sb.rollback(cp)
        assert manifest(sb) == before
        [child] = sb.fork(1)
        with child:
            assert manifest(child) == before
        sb.exec("rm -rf /root/tree")  # a layered jail: its cut squashes nothing yet, and keeps the whiteout
        [child] = sb.fork(1)
        with child:
            assert child.exec("ls /root/tree").exit_code != 0
            assert manifest(child) == manifest(sb)
    assert left() == []


def test_whiteouts_hold_across_nested_checkpoints_and_rollbacks(left: Callable[[], list[str]]) -> None:
    with Sandbox() as sb:
        sb.exec("echo one > /root/f")
        cp1 = sb.checkpoint()
        sb.rollback(cp1)  # from here the jail runs over cp1's layer: deletions become whiteouts
        sb.exec("rm /root/f /etc/os-release; echo two > /root/g")
        cp2 = sb.checkpoint()
        sb.exec("echo three > /root/f; rm /root/g")
        sb.rollback(cp2)
        assert sb.exec("cat /root/g; ls /root/f /etc/os-release").stdout == "two\n"
        sb.rollback(cp1)
        assert sb.exec("cat /root/f; ls /root/g").stdout == "one\n"
        with pytest.raises(BranchError, match="dropped"):
            sb.rollback(cp2)  # newer than cp1: dropped
        sb.rollback(cp1)  # cp1 itself stays
        assert sb.exec("cat /root/f").stdout == "one\n"
        sb.reset()  # a fresh jail over the root filesystem alone; cp1 still holds its layer
        assert sb.exec("ls /root").stdout == ""
        sb.rollback(cp1)
        assert sb.exec("cat /root/f").stdout == "one\n"
        with Sandbox() as other, pytest.raises(BranchError, match="another sandbox"):
            other.rollback(cp1)
    assert left() == []


def test_fork_of_a_fork_of_a_fork_sees_ancestors_only(left: Callable[[], list[str]]) -> None:
    with Sandbox() as top:
        top.exec("echo top > /root/level")
        [a] = top.fork(1)
        a.exec("echo a > /root/level; echo a > /root/a")
        [b, b2] = a.fork(2)
        b.exec("echo b > /root/level")
        [c] = b.fork(1)
        c.exec("echo c > /root/level")
        try:
            assert top.exec("cat /root/level; ls /root/a").stdout == "top\n"
            assert a.exec("cat /root/level").stdout == "a\n"
            assert b.exec("cat /root/level /root/a").stdout == "b\na\n"
            assert b2.exec("cat /root/level").stdout == "a\n"
            assert c.exec("cat /root/level /root/a").stdout == "c\na\n"
            for child in (a, b, b2, c):  # each a full jail of its own
                assert child.init_pid not in (top.init_pid,) and child.id != top.id
                assert child.enforcement.keys() == top.enforcement.keys()  # its own report (own ids differ)
        finally:
            for child in (c, b2, b, a):
                child.close()
        assert top.exec("cat /root/level").stdout == "top\n"
    assert left() == []


def test_checkpoint_write_checkpoint_rollback_rollback(left: Callable[[], list[str]]) -> None:
    with Sandbox() as sb:
        sb.exec("echo 1 > /root/n")
        cp1 = sb.checkpoint()
        sb.exec("echo 2 > /root/n")
        cp2 = sb.checkpoint()
        sb.exec("echo 3 > /root/n")
        sb.rollback(cp2)
        assert sb.exec("cat /root/n").stdout == "2\n"
        sb.exec("echo 4 > /root/n")
        cp3 = sb.checkpoint()
        sb.rollback(cp1)
        assert sb.exec("cat /root/n").stdout == "1\n"
        assert not cp2.valid and not cp3.valid and cp1.valid
    assert left() == []


@pytest.mark.slow
def test_two_hundred_cycles_keep_mounts_and_disk_bounded(left: Callable[[], list[str]]) -> None:
    longest = 0
    with Sandbox() as sb:
        cp = None
        for i in range(200):
            # each cycle deletes the file the one before made: a whiteout that squashing must keep
            sb.exec(f"echo {i} > /root/n{i % 7}; echo {i} > /root/last; touch /root/t{i}; rm -f /root/t{i - 1}")
            previous, cp = cp, sb.checkpoint()
            if previous is not None:
                previous.drop()  # kept, every checkpoint would keep its own layers on disk
            sb.exec("rm -f /root/last")
            sb.rollback(cp)
            layers = len(cp.layers)
            assert layers <= MAX_LAYERS
            mounts = sb.exec("head -1 /proc/self/mountinfo").stdout
            longest = max(longest, len(mounts))
            assert sb.exec("cat /root/last").stdout == f"{i}\n"
            # this sandbox's one jail and its one live checkpoint's layers, and no more
            assert len(left()) <= 1 + MAX_LAYERS
        assert sb.exec("cat /root/n0 /root/n6").stdout == "196\n195\n"
        assert sb.exec("ls /root | grep ^t").stdout == "t199\n"
    assert longest < 600  # MAX_LAYERS short names: far under the page the options must fit
    assert left() == []


def test_a_failed_cut_leaves_the_sandbox_as_it_was(left: Callable[[], list[str]]) -> None:
    with Sandbox() as sb:
        sb.exec("echo kept > /root/f")
        cp = sb.checkpoint()
        deep = "/".join(["d"] * (MAX_DEPTH + 5))
        assert sb.exec(f"mkdir -p /root/{deep}").exit_code == 0
        with pytest.raises(BranchError, match="deeper than"):
            sb.checkpoint()
        with pytest.raises(BranchError, match="deeper than"):
            sb.fork(2)
        assert sb.exec("cat /root/f").stdout == "kept\n"
        assert len(left()) == 2  # the jail's directory and cp's layer: no half-made one
        sb.rollback(cp)
        assert sb.exec("ls /root").stdout == "f\n"
        with pytest.raises(BranchError, match="fork"):
            sb.fork(0)
    assert left() == []


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


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_a_jail_racing_the_cut_with_links_to_host_paths_reaches_nothing(
    upper: str, outside: Path, left: Callable[[], list[str]]
) -> None:
    os.chmod(outside.parent, 0o755)
    os.chmod(outside, 0o755)
    os.chmod(outside / "secret", 0o644)  # readable by the jail's ids, were a link ever followed
    before = snapshot(outside)
    with Sandbox(upper=upper) as sb:
        sb.exec("mkdir -p /root/d1 && echo jail > /root/d1/f")
        sb.write_file("/tmp/race.sh", RACE.format(outside=outside))  # /tmp is scratch, not in a cut
        sb.exec("bash /tmp/race.sh >/dev/null 2>&1 &")
        cuts = []
        for _ in range(10):
            time.sleep(0.1)  # the racer runs between cuts: each cut pauses it, links and all
            cuts.append(sb.checkpoint())
        children = sb.fork(3)
        for child in children:
            with child:
                found = child.exec("grep -rs 'host secret' /root; find /root -maxdepth 1 -type l | wc -l")
                assert HOST_SECRET.strip() not in found.stdout
        links = 0
        for cp in reversed(cuts):
            sb.rollback(cp)
            assert "host secret" not in sb.exec("grep -rs 'host secret' /root").stdout
            links += int(sb.exec("find /root -maxdepth 1 -type l | wc -l").stdout)
        assert links > 0  # the cuts did meet the links: kept as links, never followed
    assert snapshot(outside) == before
    assert left() == []


def test_each_child_has_its_own_bound_and_writes(left: Callable[[], list[str]]) -> None:
    with Sandbox(upper="tmpfs", limits={"disk": 16 << 20}) as sb:
        sb.exec("head -c 8M /dev/zero > /root/big")
        kids = sb.fork(2)
        try:
            # the parent's 8 MiB are in the shared layer: each child may write its own 16 MiB less a margin
            assert kids[0].exec("head -c 12M /dev/zero > /root/mine").exit_code == 0
            assert kids[0].exec("head -c 12M /dev/zero > /root/more").exit_code != 0
            assert kids[1].exec("ls /root").stdout == "big\n"
        finally:
            for kid in kids:
                kid.close()
    assert left() == []


KILLED_MID_CUT = r"""
import sys
from jailbox.sandbox import Sandbox
sb = Sandbox()
sb.exec("cd /root && for d in $(seq 0 39); do mkdir $d; for f in $(seq 0 99); do echo $f > $d/$f; done; done")
print("cutting", flush=True)
while True:
    sb.checkpoint()
"""


@pytest.mark.slow
def test_a_host_killed_mid_cut_leaves_no_layer(left: Callable[[], list[str]]) -> None:
    host = subprocess.Popen([sys.executable, "-c", KILLED_MID_CUT], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline() == "cutting\n"
        time.sleep(0.5)  # several cuts made, one under way
    finally:
        host.kill()
        host.wait()
    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)  # its launcher removes what the host left, once it sees the host gone
    assert left() == []


def test_async_sandbox_branches_too(left: Callable[[], list[str]]) -> None:
    import asyncio

    from jailbox.sandbox import AsyncSandbox

    async def main() -> None:
        async with AsyncSandbox() as sb:
            await sb.exec("echo 1 > /root/n")
            cp = await sb.checkpoint()
            await sb.exec("echo 2 > /root/n")
            [child] = await sb.fork(1)
            async with child:
                assert (await child.exec("cat /root/n")).stdout == "2\n"
            await sb.rollback(cp)
            assert (await sb.exec("cat /root/n")).stdout == "1\n"

    asyncio.run(main())
    assert left() == []


def test_children_share_the_cut_and_cost_the_host_little_before_they_write(left: Callable[[], list[str]]) -> None:
    def used(top: Path) -> int:
        return sum(
            os.lstat(Path(here, name)).st_blocks * 512 for here, dirs, files in os.walk(top) for name in dirs + files
        )

    with Sandbox(upper="disk") as sb:
        sb.exec("head -c 8M /dev/urandom > /root/big")
        kids = sb.fork(3)
        try:
            layers = [name for name in left() if name.startswith("layer-")]
            assert len(layers) == 1  # one copy of the 8 MiB, shared
            for kid in kids:
                assert kid.dir is not None and used(kid.dir) <= 1 << 20
        finally:
            for kid in kids:
                kid.close()
    assert left() == []


def test_a_squash_drops_whiteouts_that_hide_nothing(left: Callable[[], list[str]]) -> None:
    with Sandbox() as sb:
        sb.exec("mkdir /root/new && echo a > /root/new/a && echo b > /root/new/b && rm /etc/os-release")
        sb.rollback(sb.checkpoint())
        sb.exec("rm /root/new/b")  # a whiteout, over a layer the squash below folds in
        for _ in range(MAX_LAYERS):
            sb.rollback(sb.checkpoint())
        # /root/new is in no layer beneath the squashed one: a whiteout kept there would be listed
        assert sb.exec("ls -A /root/new").stdout == "a\n"
        assert sb.exec("ls /etc/os-release").exit_code != 0  # the lower has it: that whiteout stays
    assert left() == []


@pytest.mark.slow
def test_a_call_made_during_a_cut_waits_for_it_and_the_cut_is_whole(left: Callable[[], list[str]]) -> None:
    """Calls from another thread while the jail is paused for cuts: none fails as on a paused
    sandbox, and each cut holds the lines written before it, whole, and none after."""
    import threading

    failures: list[BaseException] = []
    written: list[str] = []
    done = threading.Event()
    with Sandbox() as sb:
        # cuts that take a while: the jail is paused through each copy
        sb.exec("cd /root && mkdir many && cd many && for i in $(seq 1 3000); do : > $i; done")

        def writer() -> None:
            try:
                while not done.is_set():
                    result = sb.exec(f"echo {len(written)} >> /root/log")
                    assert result.exit_code == 0, result.stderr
                    written.append(str(len(written)))
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            wait_until(lambda: len(written) > 3, "the writer's first lines", 60)
            cuts = [sb.checkpoint() for _ in range(3)]
            [child] = sb.fork(1)
        finally:
            done.set()
            thread.join()
        assert failures == []
        # and a call made exactly while the jail is paused for a cut
        cutting = threading.Thread(target=lambda: cuts.append(sb.checkpoint()))
        cutting.start()
        wait_until(lambda: sb.paused, "the jail paused for the cut", 60, every=0.001)
        assert sb.exec(f"echo {len(written)} >> /root/log").exit_code == 0
        written.append(str(len(written)))
        cutting.join()
        final = sb.exec("cat /root/log").stdout.split()
        assert final == written
        with child:
            seen = child.exec("cat /root/log").stdout.split()
            assert seen == final[: len(seen)]
        for cp in reversed(cuts):  # newest first: a rollback drops the checkpoints after it
            sb.rollback(cp)
            seen = sb.exec("cat /root/log").stdout.split()
            assert seen == final[: len(seen)]
    assert left() == []


@pytest.mark.slow
def test_close_during_a_cut_waits_for_it_and_leaves_nothing(left: Callable[[], list[str]]) -> None:
    import threading

    outcome: list[object] = []
    sb = Sandbox()
    sb.exec("cd /root && mkdir many && cd many && for i in $(seq 1 3000); do : > $i; done")

    def cut() -> None:
        try:
            outcome.append(sb.checkpoint())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=cut)
    thread.start()
    wait_until(lambda: sb.paused, "the jail paused for the cut", 60, every=0.001)
    sb.close()  # waits for the cut, then drops the checkpoint it made
    thread.join()
    [cp] = outcome
    assert isinstance(cp, Checkpoint) and not cp.valid, cp
    assert left() == []
