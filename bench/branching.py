"""Filesystem branching (``docs/branching.md``): checkpoint() against ``cp -a`` of the layer it
copies, rollback() against a cold Sandbox(), fork(N) against N cold Sandbox() and fork(M) against M
sequential bwrap runs; snapshot() against ``tar`` of that layer, Sandbox(snapshot=...) against a
cold Sandbox(), N of them at once against N sequential bwrap runs; the host disk a child of a
fork takes before it writes; in one run, with a store of its own."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from bench.baselines import bwrap_argv
from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary, interleave, timed
from jailbox.sandbox import Sandbox, snapshots, state

FILL = (
    "cd /root && for d in $(seq 1 {dirs}); do mkdir d$d; "
    "for f in $(seq 1 100); do head -c {size} /dev/urandom > d$d/$f; done; done"
)
FILE_SIZE = 6710  # 10,000 of them: 64 MiB


def _checkpoint(sb: Sandbox) -> None:
    sb.checkpoint().drop()


def _cp_a(tree: str) -> None:
    scratch = tempfile.mkdtemp(prefix="bench-cp-")
    try:
        subprocess.run(["cp", "-a", tree, scratch + "/copy"], check=True)
    finally:
        shutil.rmtree(scratch)


def _cold(count: int) -> None:
    boxes = [Sandbox(upper="tmpfs") for _ in range(count)]
    for sb in boxes:
        sb.close()


def _fork(sb: Sandbox, count: int) -> None:
    children = sb.fork(count)
    for child in children:
        if child.exec(["true"]).exit_code != 0:
            raise RuntimeError("a forked child could not run `true`")
    for child in children:
        child.close()


def _disk(path: Path) -> int:
    """Bytes ``path``'s tree takes on the host's disk (``du``; what this user cannot read, skipped)."""
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def _disk_per_child(count: int) -> list[float]:
    """KiB of host disk each child of ``fork(count)`` of an unwritten ``upper="disk"`` sandbox
    takes before it writes: the state directory's growth over the fork (its state, its empty
    writable layer, its share of the cut), divided among the children; one figure per child set."""
    with Sandbox(upper="disk") as sb:
        where = state.state_dir(sb.config.state_dir) / "sandboxes"
        before = _disk(where)
        children = sb.fork(count)
        try:
            grown = _disk(where) - before
        finally:
            for child in children:
                child.close()
    return [grown / count / 1024] * count


def _tar(tree: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tar-") as scratch:
        subprocess.run(["tar", "-C", tree, "-cf", scratch + "/layer.tar", "."], check=True)


def _snapshot(sb: Sandbox) -> None:
    sb.snapshot()  # removed with the run's store, outside the timing


def _from(ident: str, count: int) -> None:
    """``count`` sandboxes started from snapshot ``ident`` at once, each running ``true``."""

    def one() -> None:
        with Sandbox(snapshot=ident, upper="tmpfs") as sb:
            if sb.exec(["true"]).exit_code != 0:
                raise RuntimeError("a sandbox started from a snapshot could not run `true`")

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        for future in [pool.submit(one) for _ in range(count)]:
            future.result()


def _bwrap(count: int) -> None:
    argv = bwrap_argv()
    for _ in range(count):
        subprocess.run(argv or ["true"], check=True)


@contextlib.contextmanager
def _own_store() -> Iterator[None]:
    """The snapshots a run makes go to a store of its own, removed after."""
    before = os.environ.get("JAILBOX_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="bench-store-") as store:
        os.environ["JAILBOX_CACHE_DIR"] = store
        try:
            yield
        finally:
            for snap in snapshots.list():
                snapshots.remove(snap.id)
            if before is None:
                del os.environ["JAILBOX_CACHE_DIR"]
            else:
                os.environ["JAILBOX_CACHE_DIR"] = before


def branching(settings: Settings) -> CaseResult:
    files, reps, count = settings.branch_files, settings.branch_reps, settings.fork_children
    starts, many = settings.snapshot_starts, settings.fork_many
    with Sandbox(upper="tmpfs") as sb:
        if sb.exec(FILL.format(dirs=max(1, files // 100), size=FILE_SIZE)).exit_code != 0:
            raise RuntimeError("could not fill the sandbox's writable layer")
        kept = sb.checkpoint()  # its layer is what `cp -a` copies: the same bytes, on the same disk
        cut = interleave(
            reps, [timed("checkpoint", partial(_checkpoint, sb)), timed("cp", partial(_cp_a, str(kept.layers[0].tree)))]
        )
        back = interleave(reps, [timed("rollback", partial(sb.rollback, kept)), timed("cold", partial(_cold, 1))], 1)
        forks = interleave(reps, [timed("fork", partial(_fork, sb, count)), timed("cold", partial(_cold, count))], 1)
        crowd_forks = interleave(
            reps, [timed("fork", partial(_fork, sb, many)), timed("bwrap", partial(_bwrap, many))], 1
        )
        with _own_store():
            keep = interleave(
                reps, [timed("snapshot", partial(_snapshot, sb)), timed("tar", partial(_tar, str(kept.layers[0].tree)))]
            )
            ident = sb.snapshot().id
            start = interleave(reps, [timed("from", partial(_from, ident, 1)), timed("cold", partial(_cold, 1))], 1)
            crowd = interleave(
                reps, [timed("from", partial(_from, ident, starts)), timed("bwrap", partial(_bwrap, starts))], 1
            )
    disk = _disk_per_child(count)
    mib = files * FILE_SIZE / (1 << 20)
    rows = [
        Row(f"checkpoint(): {files:,} files / {mib:.0f} MiB", "ms", Summary.of(cut["checkpoint"]), "cp -a of the layer",
            Summary.of(cut["cp"]), Target.check("<= 5 ms", Summary.of(cut["checkpoint"]).median <= 5)),
        Row("rollback()", "ms", Summary.of(back["rollback"]), "cold Sandbox()", Summary.of(back["cold"]),
            Target.check("<= 10 ms", Summary.of(back["rollback"]).median <= 10)),
        Row(f"fork({count}), every child usable", "ms", Summary.of(forks["fork"]), f"{count} cold Sandbox()",
            Summary.of(forks["cold"]), Target.check("<= 50 ms", Summary.of(forks["fork"]).median <= 50)),
        Row(f"fork({many}), every child usable", "ms", Summary.of(crowd_forks["fork"]),
            f"{many} sequential bwrap runs", Summary.of(crowd_forks["bwrap"]),
            Target.check("<= 100 ms", Summary.of(crowd_forks["fork"]).median <= 100)),
        Row(f"host disk per child of fork({count}), upper=disk, before it writes", "KiB", Summary.of(disk),
            "", None, Target.check("<= 1 MiB", Summary.of(disk).median <= 1024)),
        Row(f"snapshot(): {files:,} files / {mib:.0f} MiB", "ms", Summary.of(keep["snapshot"]), "tar of the layer",
            Summary.of(keep["tar"]), Target.check("<= 150 ms", Summary.of(keep["snapshot"]).median <= 150)),
        Row("Sandbox(snapshot=...), create to ready", "ms", Summary.of(start["from"]), "cold Sandbox()",
            Summary.of(start["cold"]),
            Target.check("<= 1.2x cold", Summary.of(start["from"]).median <= 1.2 * Summary.of(start["cold"]).median)),
        Row(f"{starts} Sandbox(snapshot=...) at once, each usable", "ms", Summary.of(crowd["from"]),
            f"{starts} sequential bwrap runs", Summary.of(crowd["bwrap"]),
            Target.check("<= 500 ms", Summary.of(crowd["from"]).median <= 500)),
    ]  # fmt: skip
    return CaseResult(rows)
