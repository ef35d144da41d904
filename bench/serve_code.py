"""The code interpreter through ``jailbox serve``: the unmodified ``e2b-code-interpreter`` SDK's
``run_code("1+1")`` on a warm context against the same SDK's ``commands.run("true")`` in the same
sandbox, both over loopback HTTP to one server.

Runs in the bench's process (the SDK) and starts one ``jailbox serve`` subprocess (``--warm 0``: one
sandbox is used). Skipped, with the reason, without the SDK (the ``test`` extra, Python 3.11+) or
without a Jupyter kernel in the host's python3 (the sandbox runs on the host rootfs).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from bench.code_interpreter import PACKAGES
from bench.results import CaseResult, Row, Target
from bench.serve import KEY, _pointed_at, _start
from bench.settings import Settings
from bench.timing import Summary, interleave, timed


def _run_code(sb: Any) -> None:
    if sb.run_code("1+1").text != "2":
        raise RuntimeError("run_code('1+1') through the server did not give 2")


def _command(sb: Any) -> None:
    if sb.commands.run("true").exit_code != 0:
        raise RuntimeError("`true` through the server failed")


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
    code, bare = Summary.of(samples["run_code"]), Summary.of(samples["command"])
    return CaseResult(
        [
            Row('SDK run_code("1+1") via serve, warm context', "ms", code, "SDK commands.run('true') via serve",
                bare, Target.check("<= 5 ms over the command", code.median - bare.median <= 5)),
        ]
    )  # fmt: skip
