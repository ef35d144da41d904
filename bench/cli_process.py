"""The whole ``jailbox`` process as a user times it from a shell: ``jailbox exec -- true`` (through a warm
per-user service, which is the console script's fast path; in-process, with the service turned off; and
the first call, when no service runs yet) and ``jailbox --help``, against ``python3 -I -c pass`` (the
interpreter's own start) and bwrap running ``true``. Runs in the bench's process; each sample is one
spawned process, start to exit, with stdin from /dev/null (a terminal would send exec to the full CLI).
The service lives in a state directory of the bench's own and is stopped at the end.

``python -m bench.cli_process [REPS]`` prints the rows; ``measure(reps)`` returns them.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from bench.baselines import ENV, bwrap_argv, spawn_wait
from bench.timing import interleave

EXEC, IN_PROCESS, FIRST = "jailbox exec -- true", "jailbox exec -- true, in-process", "jailbox exec -- true, first call"
ROWS = (EXEC, IN_PROCESS, FIRST, "jailbox --help", "python3 -I -c pass", "bwrap true")
FIRST_REPS = 3  # each stops the service it started: a few are enough to show the cost
HANG = 120.0  # seconds: a hang guard only
_QUIET = [
    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
]


def jailbox_argv() -> list[str]:
    """The console script beside this interpreter (a venv's), else the module it calls: both are what a
    user runs, the script adds only its two-line shim."""
    script = Path(sys.executable).with_name("jailbox")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from jailbox.console import main; main()"]


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 in ms (p99 of a few dozen runs is close to their worst: it is meant to show the tail)."""
    if len(samples) == 1:
        return {"p50": samples[0], "p99": samples[0], "n": 1}
    return {
        "p50": statistics.median(samples),
        "p99": statistics.quantiles(samples, n=100, method="inclusive")[98],
        "n": len(samples),
    }


def _timed(argv: list[str], env: Mapping[str, str]) -> float:
    start = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=_QUIET)
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter_ns() - start) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed")
    return elapsed


def _service_pid(state: str) -> int | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        try:
            sock.connect(os.path.join(state, "service.sock"))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])


def _wait_service(state: str) -> int:
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        pid = _service_pid(state)
        if pid is not None:
            return pid
        time.sleep(0.02)
    raise RuntimeError(f"the jailbox service did not start (see {state}/service.log)")


def _stop_service(pid: int) -> None:
    os.kill(pid, 15)
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        try:  # ended once a zombie: its parent is the host's init, which reaps when it likes
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise RuntimeError(f"the jailbox service (pid {pid}) did not stop")


def measure(reps: int = 30, warmup: int = 3) -> dict[str, dict[str, float]]:
    """Per row of ``ROWS`` (bwrap's only where it is installed and works): ``{"p50": ms, "p99": ms,
    "n": runs}``, every contender but the first call run once per repetition, interleaved."""
    jailbox = jailbox_argv()
    with tempfile.TemporaryDirectory(prefix="jbb-", dir="/tmp") as tmp:  # short: a socket path's limit
        state = os.path.join(tmp, "state")
        os.mkdir(state, 0o700)
        env = {
            **ENV,
            "HOME": os.environ.get("HOME", "/root"),  # jailbox reads ~/.config/jailbox
            "JAILBOX_STATE_DIR": state,
            "JAILBOX_SERVICE_IDLE": "600",
        }
        exec_true = [*jailbox, "exec", "--", "true"]
        _timed(exec_true, {**env, "JAILBOX_NO_SERVICE": "1"})  # the state directory, the host's skeleton
        first = []
        for n in range(FIRST_REPS):
            first.append(_timed(exec_true, env))  # in-process, and starts the service
            pid = _wait_service(state)
            if n < FIRST_REPS - 1:
                _stop_service(pid)
        try:
            samples = _interleaved(jailbox, env, reps, warmup)
        finally:
            _stop_service(pid)
    samples[FIRST] = first
    return {name: percentiles(samples[name]) for name in ROWS if name in samples}


def _interleaved(jailbox: list[str], env: dict[str, str], reps: int, warmup: int) -> dict[str, list[float]]:
    python = os.path.realpath(sys.executable)  # the interpreter itself: no venv, no pyenv shim script
    contenders = {
        EXEC: ([*jailbox, "exec", "--", "true"], env),
        IN_PROCESS: ([*jailbox, "exec", "--", "true"], {**env, "JAILBOX_NO_SERVICE": "1"}),
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
    thunks = [lambda n=name, a=argv, e=run_env: {n: _timed(a, e)} for name, (argv, run_env) in contenders.items()]
    return interleave(reps, thunks, warmup=warmup)


if __name__ == "__main__":
    for row, stats in measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30).items():
        print(f"{row:34} p50 {stats['p50']:7.1f} ms   p99 {stats['p99']:7.1f} ms   (n={stats['n']:.0f})")
