"""``jailbox serve`` as an E2B SDK user meets it: the unmodified ``e2b`` SDK's ``Sandbox.create()`` plus
``commands.run("true")`` against a server on loopback, side by side with the plain Python API doing the
same pair, and what an idle served sandbox costs the host.

Runs in the bench's process (the SDK and the Python API) and starts two ``jailbox serve`` subprocesses:
one as shipped (a warm pool of ``--warm 2`` per template) and one with ``--warm 0`` (every create builds
a jail). The SDK is pointed at each with environment variables only, as its users do. Without the SDK
(it is in the ``test`` extra, Python 3.11+) the case is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench.cases import exec_true
from bench.density import MB
from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary, Thunk, interleave
from jailbox.sandbox import Sandbox, SandboxPool

TARGET_MS = 30.0
SETTLE = 0.1
"""Seconds of quiet after each sample, outside its timing: what it left running in the background (a
pool refilling, a jail torn down) finishes before the next contender is timed, instead of being
billed to it."""
KEY = "jbx_bench_" + "k" * 32
START_TIMEOUT = 60.0
PRIME = 1.0
"""Seconds for the server's pool to fill after its first sandbox, before anything is timed."""
TEMPLATE = "host"  # what Sandbox() runs on, so both sides build the same jail
SDK = "E2B SDK create()+commands.run('true')"
PLAIN = "Sandbox()+exec(['true'])"
POOLED = "SandboxPool.acquire()+exec(['true'])"


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    log: list[str]

    def stop(self) -> None:
        """SIGTERM: the server closes every sandbox it holds before it exits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _start(keys: Path, *flags: str) -> Server:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jailbox.cli", "serve", "--port", "0", "--api-key-file", str(keys), *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=keys.parent,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    log: list[str] = []
    timer = threading.Timer(START_TIMEOUT, proc.kill)  # a server that never says where it listens
    timer.start()
    try:
        for line in stderr:
            log.append(line)
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                # keep reading its log, so a chatty server never blocks on a full pipe
                threading.Thread(target=lambda: log.extend(stderr), daemon=True).start()
                return Server(proc, found.group(1), log)
    finally:
        timer.cancel()
    proc.wait()
    raise RuntimeError(f"jailbox serve {' '.join(flags)} did not start: {''.join(log)[-2000:]}")


@contextmanager
def _servers(settings: Settings) -> Iterator[tuple[Server, Server]]:
    with tempfile.TemporaryDirectory(prefix="jailbox-bench-serve-") as tmp:
        keys = Path(tmp) / "keys"
        fd = os.open(keys, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(KEY + "\n")
        cap = str(settings.serve_idle + 8)
        started: list[Server] = []
        try:
            started.append(_start(keys, "--max-sandboxes", cap, "--max-per-key", cap))
            started.append(_start(keys, "--max-sandboxes", cap, "--max-per-key", cap, "--warm", "0"))
            yield started[0], started[1]
        finally:
            for server in started:
                server.stop()


@contextmanager
def _pointed_at(server: Server) -> Iterator[None]:
    """The SDK's environment variables, and nothing else, naming ``server``."""
    wanted = {"E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_HTTP_VERSION": "1.1", "E2B_API_KEY": KEY}
    old = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sdk_pair(server: Server, name: str) -> dict[str, float]:
    from e2b import Sandbox as E2BSandbox

    with _pointed_at(server):
        start = time.perf_counter_ns()
        sb = E2BSandbox.create(template=TEMPLATE)
        made = time.perf_counter_ns()
        try:
            result = sb.commands.run("true")
            ran = time.perf_counter_ns()
        finally:
            sb.kill()
    time.sleep(SETTLE)
    if result.exit_code != 0:
        raise RuntimeError(f"`true` through the SDK exited with {result.exit_code}")
    return {name: (ran - start) / 1e6, f"{name} create": (made - start) / 1e6, f"{name} run": (ran - made) / 1e6}


def _plain_pair() -> dict[str, float]:
    start = time.perf_counter_ns()
    sb = Sandbox()
    try:
        exec_true(sb)
        return {"plain": (time.perf_counter_ns() - start) / 1e6}
    finally:
        sb.close()
        time.sleep(SETTLE)


def _pooled_pair(pool: SandboxPool) -> dict[str, float]:
    pool.wait_ready(60)  # as the server's pool has refilled between its samples
    start = time.perf_counter_ns()
    sb = pool.acquire()
    try:
        exec_true(sb)
        return {"pooled": (time.perf_counter_ns() - start) / 1e6}
    finally:
        sb.close()
        time.sleep(SETTLE)


def _tree_pss(pid: int) -> tuple[int, int]:
    """(bytes of PSS, processes unreadable) of ``pid`` and every process under it."""
    root = psutil.Process(pid)
    total = unreadable = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.AccessDenied:
            unreadable += 1
        except psutil.NoSuchProcess:
            continue
    return total, unreadable


def _idle_memory(server: Server, count: int) -> tuple[float, float, int]:
    """Host memory per idle sandbox: (PSS of the server and every process under it, its launcher and
    jails, grown per sandbox; the server process's own RSS grown per sandbox; processes unreadable),
    with ``count`` sandboxes made through the SDK, each having run one command."""
    from e2b import Sandbox as E2BSandbox

    before, _ = _tree_pss(server.proc.pid)
    rss_before = psutil.Process(server.proc.pid).memory_info().rss
    made: list[Any] = []
    with _pointed_at(server):
        try:
            for _ in range(count):
                made.append(E2BSandbox.create(template=TEMPLATE))
                made[-1].commands.run("true")
            after, unreadable = _tree_pss(server.proc.pid)
            rss_after = psutil.Process(server.proc.pid).memory_info().rss
        finally:
            for sb in made:
                with suppress(Exception):  # the server closes what is left when it stops
                    sb.kill()
    return (after - before) / count / MB, (rss_after - rss_before) / count / MB, unreadable


def _missing() -> str | None:
    """Why the case cannot run here, if it cannot: the SDK, or the server's protobuf, is not installed."""
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed (pip install -e '.[test]' on Python 3.11+)"
    if importlib.util.find_spec("google") is None or importlib.util.find_spec("google.protobuf") is None:
        return "protobuf, which jailbox serve needs, is not installed (pip install -e '.[serve]')"
    return None


def serve(settings: Settings) -> CaseResult:
    missing = _missing()
    if missing is not None:
        return CaseResult(skipped=[missing])
    with _servers(settings) as (warm, cold), SandboxPool(size=2) as pool:
        thunks: list[Thunk] = [
            partial(_sdk_pair, warm, "warm"),
            partial(_sdk_pair, cold, "cold"),
            _plain_pair,
            partial(_pooled_pair, pool),
        ]
        for server in (warm, cold):  # a template gets its pool once it has built one sandbox: let it fill
            _sdk_pair(server, "first")
        time.sleep(PRIME)
        samples = interleave(settings.serve_reps, thunks, settings.warmup)
        per_sandbox, server_rss, unreadable = _idle_memory(cold, settings.serve_idle)
    got = {name: Summary.of(values) for name, values in samples.items()}
    plain, pooled = got["plain"], got["pooled"]

    def split(name: str) -> list[str]:
        return [
            f"{name}: create p50 {got[f'{name} create'].median:.1f} ms, commands.run p50 "
            f"{got[f'{name} run'].median:.1f} ms (the SDK runs bash -l -c true)"
        ]

    def parts(name: str) -> dict[str, object]:
        return {part: asdict(got[f"{name} {part}"]) for part in ("create", "run")}

    memory_notes = [f"the server process itself grows {server_rss * 1000:.0f} KB per idle sandbox (RSS)"]
    memory_notes += [f"{unreadable} processes unreadable, their memory is not counted"] if unreadable else []
    rows = [
        Row(f"serve: {SDK}", "ms", got["warm"], PLAIN, plain,
            Target.check(f"< {TARGET_MS:g} ms p50", got["warm"].median < TARGET_MS),
            notes=split("warm"), extra=parts("warm")),
        Row(f"serve: {SDK}", "ms", got["warm"], POOLED, pooled),
        Row(f"serve --warm 0: {SDK}", "ms", got["cold"], PLAIN, plain, notes=split("cold"), extra=parts("cold")),
        Row(f"serve: host PSS per idle sandbox (server+jail), {settings.serve_idle} made via the SDK", "MB",
            Summary.of([per_sandbox]), notes=memory_notes,
            extra={"server_process_rss_mb_per_sandbox": server_rss, "unreadable_processes": unreadable}),
    ]  # fmt: skip
    return CaseResult(rows)
