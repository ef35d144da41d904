"""``python -m bench --quick`` runs every case end to end and writes its JSON.

No timing thresholds: machines are noisy, so only the shape of the results is checked.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    "cli_process",
    "one_shot",
    "create_close",
    "exec",
    "pause",
    "epoll",
    "throughput",
    "burst",
    "network",
    "density",
    "containers",
    "agent_loop",
    "serve",
    "branching",
    "secrets",
    "code_interpreter",
    "serve_code",
    "ray_rollouts",
)


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
def test_quick_bench_reports_every_case(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio" in proc.stdout
    cases = json.loads(out.read_text())["cases"]
    for name in CASES:
        case = cases[name]
        assert case["error"] is None, case["error"]
        if name in ("containers", "cli_process", "serve", "code_interpreter", "serve_code") and not case["rows"]:
            assert case["skipped"], f"{name}: neither measured nor skipped with a reason"
            continue
        assert case["rows"], f"{name}: no rows"
        for row in case["rows"]:
            assert all(_numeric(row[key]) for key in ("median", "p99")), row
            assert all(row[key] is None or _numeric(row[key]) for key in ("p10", "p90")), row  # the CLI's: p50, p99
            if row["baseline"] is not None:
                assert _numeric(row["baseline"]["median"]) and _numeric(row["baseline"]["p99"]), row
