"""The CLI as a user times it from a shell: rows built from ``bench/cli_process.py`` (whose
``measure()`` spawns whole ``jailbox`` processes and returns p50/p99 ms per contender), held to
issue 17's targets. Without that module in the tree the case is skipped with the reason."""

from __future__ import annotations

import importlib

from bench.results import CaseResult, Row, Target, ratio
from bench.settings import Settings
from bench.timing import Summary

EXEC_MS = 50.0
HELP_MS = 40.0
OVER_PYTHON = 2.5
EXEC, HELP, PYTHON, BWRAP = "jailbox exec -- true", "jailbox --help", "python3 -I -c pass", "bwrap true"
IN_PROCESS, FIRST = "jailbox exec -- true, in-process", "jailbox exec -- true, first call"


def cli_process(settings: Settings) -> CaseResult:
    try:
        whole = importlib.import_module("bench.cli_process")
    except ModuleNotFoundError as exc:
        if exc.name != "bench.cli_process":
            raise
        return CaseResult(skipped=["bench/cli_process.py is not in this tree (the import-light CLI brings it)"])
    stats = whole.measure(settings.cli_reps, settings.warmup)
    got = {name: Summary.of_percentiles(s["p50"], s["p99"], int(s["n"])) for name, s in stats.items()}
    run, python = got[EXEC], got[PYTHON]
    over = ratio(run, python)
    exec_target = Target.check(
        f"<= {EXEC_MS:g} ms, <= {OVER_PYTHON:g}x python's start",
        run.median <= EXEC_MS and over is not None and over <= OVER_PYTHON,
    )
    warm = "through the warm per-user service (the console script's fast path)"
    rows = [Row(f"CLI whole process: {EXEC}", "ms", run, PYTHON, python, exec_target, notes=[warm])]
    if BWRAP in got:
        rows.append(Row(f"CLI whole process: {EXEC}", "ms", run, BWRAP, got[BWRAP], notes=[warm]))
    if IN_PROCESS in got:
        off = "JAILBOX_NO_SERVICE=1: click, pydantic and a jail built in the process"
        rows.append(Row(f"CLI whole process: {IN_PROCESS}", "ms", got[IN_PROCESS], PYTHON, python, notes=[off]))
    if FIRST in got:
        cold = "no service yet: runs in-process and starts the service for the calls after it"
        rows.append(Row(f"CLI whole process: {FIRST}", "ms", got[FIRST], IN_PROCESS, got.get(IN_PROCESS), notes=[cold]))
    rows.append(
        Row(
            f"CLI whole process: {HELP}",
            "ms",
            got[HELP],
            target=Target.check(f"<= {HELP_MS:g} ms", got[HELP].median <= HELP_MS),
        )
    )
    return CaseResult(rows)
