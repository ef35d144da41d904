"""Filesystem branching (``docs/branching.md``): checkpoint() against ``cp -a`` of the layer it
copies, rollback() against a cold Sandbox(), fork(N) against N cold Sandbox(), in one run."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import partial

from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary, interleave, timed
from jailbox.sandbox import Sandbox

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


def branching(settings: Settings) -> CaseResult:
    files, reps, count = settings.branch_files, settings.branch_reps, settings.fork_children
    with Sandbox(upper="tmpfs") as sb:
        if sb.exec(FILL.format(dirs=max(1, files // 100), size=FILE_SIZE)).exit_code != 0:
            raise RuntimeError("could not fill the sandbox's writable layer")
        kept = sb.checkpoint()  # its layer is what `cp -a` copies: the same bytes, on the same disk
        cut = interleave(
            reps, [timed("checkpoint", partial(_checkpoint, sb)), timed("cp", partial(_cp_a, str(kept.layers[0].tree)))]
        )
        back = interleave(reps, [timed("rollback", partial(sb.rollback, kept)), timed("cold", partial(_cold, 1))], 1)
        forks = interleave(reps, [timed("fork", partial(_fork, sb, count)), timed("cold", partial(_cold, count))], 1)
    mib = files * FILE_SIZE / (1 << 20)
    rows = [
        Row(f"checkpoint(): {files:,} files / {mib:.0f} MiB", "ms", Summary.of(cut["checkpoint"]), "cp -a of the layer",
            Summary.of(cut["cp"]), Target.check("<= 5 ms", Summary.of(cut["checkpoint"]).median <= 5)),
        Row("rollback()", "ms", Summary.of(back["rollback"]), "cold Sandbox()", Summary.of(back["cold"]),
            Target.check("<= 10 ms", Summary.of(back["rollback"]).median <= 10)),
        Row(f"fork({count}), every child usable", "ms", Summary.of(forks["fork"]), f"{count} cold Sandbox()",
            Summary.of(forks["cold"]), Target.check("<= 50 ms", Summary.of(forks["fork"]).median <= 50)),
    ]  # fmt: skip
    return CaseResult(rows)
