"""A sandbox on a stored root filesystem against one on ``host``: the store's tree is the overlay's
lower layer as is, so creating a sandbox on it must cost no more than on the host's files, whatever
the tree's size (nothing is copied per sandbox)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.results import CaseResult, Row, Target, ratio
from bench.settings import Settings
from bench.timing import Summary, interleave, timed
from jailbox.sandbox import Sandbox, SandboxConfig
from jailbox.sandbox.rootfs.store import Store

TOOLS = ("bash", "true", "cat", "ls")
NAME = "bench-small"


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    return {part for line in out.splitlines() for part in line.split() if part.startswith("/")}


def _fill(tree: Path) -> None:
    """bash and a few tools with their libraries: enough for ``exec true``."""
    needed: set[str] = set()
    (tree / "bin").mkdir()
    for tool in TOOLS:
        path = os.path.realpath(shutil.which(tool, path="/usr/bin:/bin") or f"/bin/{tool}")
        shutil.copy2(path, tree / "bin" / tool)
        needed |= _libraries(path)
    for lib in needed:
        target = tree / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)


def _one_shot(rootfs: str) -> None:
    with Sandbox(SandboxConfig(rootfs=rootfs)) as sb:
        result = sb.exec(["true"])
        if result.exit_code != 0:
            raise RuntimeError(f"`true` on rootfs {rootfs} exited with {result.exit_code}")


def stored_rootfs(settings: Settings) -> CaseResult:
    with tempfile.TemporaryDirectory(prefix="jailbox-bench-store-") as root:
        store = Store(Path(root))
        with store.create(NAME, source="bench", kind="import") as staging:
            _fill(staging.tree)
        old = os.environ.get("JAILBOX_CACHE_DIR")
        os.environ["JAILBOX_CACHE_DIR"] = root
        try:
            thunks = [timed("stored", lambda: _one_shot(NAME)), timed("host", lambda: _one_shot("host"))]
            samples = interleave(settings.one_shot_reps, thunks, settings.warmup)
        finally:
            if old is None:
                os.environ.pop("JAILBOX_CACHE_DIR", None)
            else:
                os.environ["JAILBOX_CACHE_DIR"] = old
            store.remove(NAME)
    stored, host = Summary.of(samples["stored"]), Summary.of(samples["host"])
    vs_host = ratio(stored, host)
    target = Target.check("ratio vs host <= 1.1", vs_host is not None and vs_host <= 1.1)
    return CaseResult([Row("one-shot on a stored rootfs", "ms", stored, "one-shot on host", host, target)])
