"""The whole ``jailbox`` process as a user times it from a shell: ``jailbox exec -- true`` and
``jailbox --help`` against ``python3 -I -c pass`` (the interpreter's own start) and bwrap running
``true``. Runs in the bench's process; each sample is one spawned process, start to exit.

``python -m bench.cli_process [REPS]`` prints the rows; ``measure(reps)`` returns them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.baselines import ENV, bwrap_argv, spawn_wait
from bench.timing import interleave

ROWS = ("jailbox exec -- true", "jailbox --help", "python3 -I -c pass", "bwrap true")


def jailbox_argv() -> list[str]:
    """The console script beside this interpreter (a venv's), else ``python -m jailbox.cli``: both are
    what a user runs, the script adds only its two-line shim."""
    script = Path(sys.executable).with_name("jailbox")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "jailbox.cli"]


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 in ms (p99 of a few dozen runs is close to their worst: it is meant to show the tail)."""
    if len(samples) == 1:
        return {"p50": samples[0], "p99": samples[0], "n": 1}
    return {
        "p50": statistics.median(samples),
        "p99": statistics.quantiles(samples, n=100, method="inclusive")[98],
        "n": len(samples),
    }


def measure(reps: int = 30, warmup: int = 3) -> dict[str, dict[str, float]]:
    """Per row of ``ROWS`` (bwrap's only where it is installed and works): ``{"p50": ms, "p99": ms,
    "n": runs}``, every contender run once per repetition, interleaved."""
    jailbox = jailbox_argv()
    env = {**ENV, "HOME": os.environ.get("HOME", "/root")}  # jailbox reads ~/.config/jailbox
    python = os.path.realpath(sys.executable)  # the interpreter itself: no venv, no pyenv shim script
    contenders = {
        "jailbox exec -- true": ([*jailbox, "exec", "--", "true"], env),
        "jailbox --help": ([*jailbox, "--help"], env),
        "python3 -I -c pass": ([python, "-I", "-c", "pass"], ENV),
    }
    bwrap = bwrap_argv()
    if bwrap is not None:
        try:
            spawn_wait(bwrap, quiet=True)
            contenders["bwrap true"] = (bwrap, ENV)
        except (OSError, RuntimeError):  # installed but not allowed here (no user namespaces): no row
            pass

    def thunk(name: str, argv: list[str], run_env: dict[str, str]) -> dict[str, float]:
        start = time.perf_counter_ns()
        spawn_wait(argv, run_env, quiet=True)
        return {name: (time.perf_counter_ns() - start) / 1e6}

    thunks = [lambda n=name, a=argv, e=run_env: thunk(n, a, e) for name, (argv, run_env) in contenders.items()]
    samples = interleave(reps, thunks, warmup=warmup)
    return {name: percentiles(samples[name]) for name in ROWS if name in samples}


if __name__ == "__main__":
    for row, stats in measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30).items():
        print(f"{row:24} p50 {stats['p50']:7.1f} ms   p99 {stats['p99']:7.1f} ms   (n={stats['n']:.0f})")
