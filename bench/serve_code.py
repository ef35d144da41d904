"""The code interpreter through ``jailbox serve``: the unmodified ``e2b-code-interpreter`` SDK's
``run_code("1+1")`` on a warm context against the same SDK's ``commands.run("true")`` in the same
sandbox, and its ``Sandbox.create()`` to the first result of ``run_code("1+1")``, from a warm pool
(``--warm 2``, kernels started ahead) and cold (``--warm 0``), against a cold ``Sandbox.create()`` and
``commands.run("true")``; all over loopback HTTP.

Runs in the bench's process (the SDK) and starts two ``jailbox serve`` subprocesses. A warm sample is
taken once the pool refilled: its kernels' processes exist and had ``SETTLE`` seconds to answer
(untimed). Skipped, with the reason, without the SDK (the ``test`` extra, Python 3.11+) or without a
Jupyter kernel in the host's python3 (the sandbox runs on the host rootfs).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench.code_interpreter import PACKAGES, WARM_TARGET
from bench.results import CaseResult, Row, Target
from bench.serve import KEY, Server, _pointed_at, _start
from bench.settings import Settings
from bench.timing import Summary, Thunk, interleave, timed

WARM = 2  # sandboxes the warm server keeps per template
SETTLE = 2.0  # seconds a refilled pool's kernels get to answer before a warm sample (a start takes ~1.3 s)


def _run_code(sb: Any) -> None:
    if sb.run_code("1+1").text != "2":
        raise RuntimeError("run_code('1+1') through the server did not give 2")


def _command(sb: Any) -> None:
    if sb.commands.run("true").exit_code != 0:
        raise RuntimeError("`true` through the server failed")


def _kernels(server: Server) -> int:
    """Kernels the server's jails run: below the server, or below a launcher of it (whose command line
    ends in the server's pid)."""
    found = 0
    for proc in psutil.process_iter(["cmdline"]):
        if "ipykernel_launcher" not in (proc.info["cmdline"] or []):
            continue
        try:
            for parent in proc.parents():
                cmd = parent.cmdline()
                if parent.pid == server.proc.pid or (cmd and cmd[-1] == str(server.proc.pid)):
                    found += 1
                    break
        except psutil.Error:
            continue
    return found


def _first(sdk: Any, name: str, template: str | None, then: Any, server: Server | None = None) -> Thunk:
    """``Sandbox.create()`` to ``then(sb)``'s end, the sandbox killed after (untimed); with ``server``,
    first waiting (untimed) for its pool to hold ``WARM`` kernels."""

    def run() -> dict[str, float]:
        if server is not None:
            deadline = time.monotonic() + 120
            while _kernels(server) < WARM:
                if time.monotonic() > deadline:
                    raise RuntimeError("the warm pool did not refill its kernels in 120 s")
                time.sleep(0.05)
            time.sleep(SETTLE)
        start = time.perf_counter_ns()
        sb = sdk.create() if template is None else sdk.create(template=template)
        then(sb)
        took = (time.perf_counter_ns() - start) / 1e6
        sb.kill()
        return {name: took}

    return run


def _creates(keys: Path, warm: int, settings: Settings) -> dict[str, list[float]]:
    """Create-to-first-result (the SDK's default template); cold, also create-to-``true`` (``host``)."""
    from e2b_code_interpreter import Sandbox as E2BSandbox

    server = _start(keys, "--warm", str(warm))
    try:
        with _pointed_at(server):
            if warm:
                E2BSandbox.create().kill()  # a template's pool starts with its first sandbox
                first = _first(E2BSandbox, "first", None, _run_code, server)
                return interleave(settings.code_warm_starts, [first], settings.warmup)
            first = _first(E2BSandbox, "first", None, _run_code)
            cold = _first(E2BSandbox, "cold", "host", _command)
            return interleave(settings.code_starts, [first, cold])
    finally:
        server.stop()


def serve_code(settings: Settings) -> CaseResult:
    if importlib.util.find_spec("e2b_code_interpreter") is None:
        return CaseResult(skipped=["the e2b-code-interpreter SDK is not installed (pip install -e '.[test]')"])
    probe = subprocess.run(["/usr/bin/python3", "-c", "import ipykernel, jupyter_client"], capture_output=True)
    if probe.returncode != 0:
        return CaseResult(skipped=[f"no Jupyter kernel in the host's python3: apt-get install {PACKAGES}"])
    from e2b_code_interpreter import Sandbox as E2BSandbox

    with tempfile.TemporaryDirectory(prefix="jailbox-bench-serve-code-") as tmp:
        keys = Path(tmp) / "keys"
        fd = os.open(keys, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(KEY + "\n")
        server = _start(keys, "--warm", "0")
        try:
            with _pointed_at(server):
                sb = E2BSandbox.create(template="host")
                try:
                    _run_code(sb)  # the gateway and the default kernel started
                    samples = interleave(
                        settings.code_reps,
                        [timed("run_code", partial(_run_code, sb)), timed("command", partial(_command, sb))],
                        settings.warmup,
                    )
                finally:
                    sb.kill()
        finally:
            server.stop()
        warm = _creates(keys, WARM, settings)
        cold = _creates(keys, 0, settings)
    code, bare = Summary.of(samples["run_code"]), Summary.of(samples["command"])
    ahead, plain = Summary.of(warm["first"]), Summary.of(cold["cold"])
    started = Summary.of(cold["first"])
    baseline = "SDK create() and commands.run('true'), --warm 0"
    return CaseResult(
        [
            Row('SDK run_code("1+1") via serve, warm context', "ms", code, "SDK commands.run('true') via serve",
                bare, Target.check("<= 5 ms over the command", code.median - bare.median <= 5)),
            Row(f"SDK create() to first run_code result, --warm {WARM}", "ms", ahead, baseline, plain,
                Target.check(f"<= {WARM_TARGET} ms", ahead.median <= WARM_TARGET)),
            Row("SDK create() to first run_code result, --warm 0", "ms", started, baseline, plain,
                Target.check(f"<= {WARM_TARGET} ms", started.median <= WARM_TARGET)),
        ]
    )  # fmt: skip
