"""``python -m bench [--quick] [--only CASE] [--json PATH]``: run every case (or those named), print the
table, optionally keep JSON."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench import (
    agent_loop,
    branching,
    burst,
    cases,
    cli_rows,
    code_interpreter,
    cold_steps,
    density,
    epoll,
    ray_rollouts,
    report,
    secrets,
    serve,
    serve_code,
    stored_rootfs,
    view,
)
from bench.machine import machine_info
from bench.results import CaseResult
from bench.settings import FULL, QUICK, Settings

CASES: dict[str, Callable[[Settings], CaseResult]] = {
    "cli_process": cli_rows.cli_process,
    "one_shot": cases.one_shot,
    "cold_steps": cold_steps.cold_steps,
    "stored_rootfs": stored_rootfs.stored_rootfs,
    "create_close": cases.create_close,
    "exec": cases.exec_round_trip,
    "pause": cases.pause_resume,
    "epoll": epoll.epoll,
    "throughput": cases.throughput,
    "burst": burst.burst,
    "network": cases.network_create,
    "density": density.density,
    "containers": cases.containers,
    "agent_loop": agent_loop.agent_loop,
    "serve": serve.serve,
    "branching": branching.branching,
    "secrets": secrets.secrets,
    "code_interpreter": code_interpreter.code_interpreter,
    "view": view.view,
    "serve_code": serve_code.serve_code,
    "ray_rollouts": ray_rollouts.ray_rollouts,
}


def raise_fd_limit() -> None:
    """Hundreds of live sandboxes hold descriptors here and in the launcher, which inherits this limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_case(key: str, case: Callable[[Settings], CaseResult], settings: Settings) -> CaseResult:
    """Run one case; a failure is reported and the remaining cases still run."""
    print(f"bench: {key} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        result = case(settings)
    except Exception as exc:  # reported in the table and JSON, and in the exit status
        traceback.print_exc()
        result = CaseResult(error=f"{type(exc).__name__}: {exc}")
    print(f"bench: {key} done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts for a CI smoke run")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--image", default=FULL.image, help="image for the docker/podman comparison")
    parser.add_argument(
        "--only", action="append", choices=list(CASES), metavar="CASE", help="run only this case (repeatable)"
    )
    args = parser.parse_args(argv)
    settings = replace(QUICK if args.quick else FULL, image=args.image)
    raise_fd_limit()
    machine = machine_info()
    print(report.machine_lines(machine), flush=True)
    chosen = {key: case for key, case in CASES.items() if not args.only or key in args.only}
    results = {key: run_case(key, case, settings) for key, case in chosen.items()}
    print()
    print(report.table(results))
    for note in report.notes(results):
        print(f"note: {note}")
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_json(machine, settings.as_dict(), results), indent=2) + "\n")
    return 1 if any(result.error for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
