"""Tasks spread over a Ray cluster: each is a Ray task that makes its sandbox on whichever node runs it.

The driver keeps what the threads executor keeps: at most ``workers`` tasks in flight (so as many live
sandboxes), results recorded by the driver as they return (so ``--resume`` works the same), and one
cluster-wide gate on sandboxes starting at once, held by a small actor (the hub) that also carries each
task's step count back for the live display and the kill signal out to the workers. A killed task's
worker ends its sandbox and LLM request itself; a worker that does not within ``KILL_GRACE`` is
force-cancelled (its process dies, and jailbox's launcher removes the jail it leaves).

``RayExecutor`` runs in the driver process; ``_run`` and ``_probe`` run in Ray's worker processes, on
any node, and ``_Hub`` in an actor. What a task sends back is bounded by ``RETURN_LIMIT``, and the driver
writes it into the task's directory through ``hostfs``. A task's ``@path`` inputs are opened on the node
that runs it, beneath the batch's inputs root there, by the same rules as on the driver.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..sandbox import Sandbox, SandboxConfig, hostfs
from ..sandbox.errors import SandboxError
from .executors import Executor, ExecutorConfig, ExecutorError
from .tasks import Task, TaskResult, make_task_dir
from .worker import Guard, Job, Stepped, execute


def _token_auth_if_available() -> None:
    """Ray 2.59+ clusters started by ``ray start`` demand the token ``ray start`` wrote to
    ``~/.ray/auth_token``, but a driver joining one sends it only with ``RAY_AUTH_MODE=token`` set
    before Ray is imported; clusters without auth accept a token too. So send it whenever there is
    one and the user chose no mode. Not once Ray is imported: it has read the mode, and a cluster
    it starts would inherit a different one."""
    if os.environ.get("RAY_AUTH_MODE") or "ray" in sys.modules:
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


_token_auth_if_available()

# Ray is the 'ray' extra: without it this import fails, and find_executor says which extra to install
import ray  # noqa: E402 - after the auth mode is set, which Ray reads when imported
from ray.exceptions import RayError  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

KILL_GRACE = 10.0
RETURN_LIMIT = 256 << 20  # bytes of trajectory and output one task may send back to the driver
LOCAL_OBJECT_STORE = 100 << 20  # a local cluster only moves results: keep its shared memory small


class Returned(BaseModel):
    """What a Ray task sends back: its result, and its directory's files (trajectory, output) by relative path."""

    result: TaskResult | None
    files: dict[str, bytes]
    dropped: int = 0


class _Hub:
    """The batch's one actor: the cluster-wide start gate, step counts for the display, the kill signal."""

    def __init__(self, max_starting: int) -> None:
        self._gate = asyncio.Semaphore(max_starting)
        self._killed = asyncio.Event()
        self._steps: dict[str, tuple[int, int]] = {}

    async def acquire(self) -> None:
        await self._gate.acquire()

    async def release(self) -> None:
        self._gate.release()

    async def stepped(self, task_id: str, step: int, tokens: int) -> None:
        self._steps[task_id] = (step, tokens)

    async def steps(self) -> dict[str, tuple[int, int]]:
        steps, self._steps = self._steps, {}
        return steps

    async def kill(self) -> None:
        self._killed.set()

    async def killed(self) -> bool:
        await self._killed.wait()
        return True


class _HubGate:
    """The hub's semaphore as a context manager, for ``Guard.gate`` on a worker."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub

    def __enter__(self) -> None:
        ray.get(self.hub.acquire.remote())

    def __exit__(self, *exc_info: object) -> None:
        self.hub.release.remote()


def _run(task: Task, job: Job, hub: Any) -> Returned:
    """On a worker: the task in a scratch directory, then its files packed for the driver."""
    guard = Guard(_HubGate(hub))
    done = threading.Event()
    killed = hub.killed.remote()

    def watch() -> None:
        while not done.is_set():
            ready, _ = ray.wait([killed], timeout=0.5)
            if ready:
                guard.kill()
                return

    watcher = threading.Thread(target=watch, name="jailbox-kill-watch", daemon=True)
    watcher.start()
    try:
        with tempfile.TemporaryDirectory(prefix="jailbox-task-") as scratch:
            result = execute(
                task, job, Path(scratch), guard, lambda tid, step, tokens: hub.stepped.remote(tid, step, tokens)
            )
            files, dropped = _pack(Path(scratch))
    finally:
        done.set()
        watcher.join()
    return Returned(result=result, files=files, dropped=dropped)


def _pack(root: Path) -> tuple[dict[str, bytes], int]:
    """Regular files under ``root`` up to RETURN_LIMIT bytes in all; how many did not fit. Links are
    neither followed nor sent."""
    files: dict[str, bytes] = {}
    total = dropped = 0
    for here, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(here, name)
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if total + size > RETURN_LIMIT:
                dropped += 1
                continue
            files[path.relative_to(root).as_posix()] = path.read_bytes()
            total += size
    return files, dropped


def _unpack(directory: Path, files: dict[str, bytes]) -> None:
    """Write a task's returned files under ``directory`` through ``hostfs``: a name that would leave it is
    refused, and a link met there (left by an earlier run) is replaced, never followed."""
    with hostfs.Destination(directory) as out:
        for name, data in files.items():
            parts = hostfs.components(name)
            for depth in range(1, len(parts)):
                out.mkdir(b"/".join(parts[:depth]), 0o755)
            out.write(name, data)


def _probe(config: SandboxConfig) -> tuple[str, str | None]:
    """On one node: (its name, None) when a jail with this root filesystem starts there, else why not."""
    node = os.uname().nodename
    if config.rootfs != "host" and not Path(config.rootfs).is_dir():
        return node, f"the root filesystem {config.rootfs} does not exist there"
    try:
        with Sandbox(config) as sb:
            sb.exec(["true"], timeout=30)
    except SandboxError as exc:
        return node, f"a jail does not start there: {exc}"
    return node, None


class RayExecutor(Executor):
    """Tasks as Ray tasks; connects to ``ray_address`` (or ``$RAY_ADDRESS``), else starts a local cluster."""

    def __init__(self, job: Job, out_dir: Path, config: ExecutorConfig, stepped: Stepped) -> None:
        self.job = job
        self.out_dir = out_dir
        self.config = config
        self.stepped = stepped
        self._connected_here = False
        self.hub: Any = None
        if not ray.is_initialized():
            self._init(config)
        self._task = ray.remote(max_retries=0, num_cpus=config.task_cpus)(_run)
        self._refs: dict[Any, Task] = {}
        self._killed_at: float | None = None
        self._forced = False
        try:
            self.hub = ray.remote(num_cpus=0)(_Hub).remote(config.max_starting)
            self._check_nodes()
        except BaseException:
            self.close()
            raise

    def _init(self, config: ExecutorConfig) -> None:
        address = config.ray_address or os.environ.get("RAY_ADDRESS")
        if address:
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError) as exc:
                raise ExecutorError(f"cannot join the Ray cluster at {address}: {exc}") from None
        else:
            # Ray's default /tmp/ray belongs to whoever ran Ray first; $RAY_TMPDIR (Ray's own) still wins.
            temp = None if os.environ.get("RAY_TMPDIR") else f"{tempfile.gettempdir()}/ray-{os.getuid()}"
            ray.init(
                num_cpus=max(1, int(config.workers * config.task_cpus)),
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE,
                log_to_driver=False,
                _temp_dir=temp,
            )
        self._connected_here = True

    def _check_nodes(self) -> None:
        """Every alive node must start a jail with the batch's root filesystem, before any task runs."""
        probe = ray.remote(num_cpus=0, max_retries=0)(_probe)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [
            probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                self.job.sandbox
            )
            for n in nodes
        ]
        answers = zip(nodes, ray.get(refs), strict=True)
        failures = [f"{name} ({n['NodeManagerAddress']}): {why}" for n, (name, why) in answers if why]
        if failures:
            raise ExecutorError(
                f"rootfs {self.job.sandbox.rootfs!r} cannot be used on every Ray node: "
                + "; ".join(failures)
                + ". Build or copy it to the same path on each node (or use --rootfs host)."
            )

    @property
    def running(self) -> int:
        return len(self._refs)

    def submit(self, task: Task) -> None:
        self._refs[self._task.remote(task, self.job, self.hub)] = task

    def wait(self, timeout: float) -> list[TaskResult]:
        if not self._forced and self._killed_at is not None and time.monotonic() - self._killed_at > KILL_GRACE:
            self._forced = True
            for ref in self._refs:
                ray.cancel(ref, force=True)
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if ready:
            rest = [r for r in self._refs if r not in ready]
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
        for task_id, (step, tokens) in ray.get(self.hub.steps.remote()).items():
            self.stepped(task_id, step, tokens)
        results = []
        for ref in ready:
            task = self._refs.pop(ref)
            result = self._collect(ref, task)
            if result is not None:
                results.append(result)
        return results

    def _collect(self, ref: Any, task: Task) -> TaskResult | None:
        """The result, with its files written under the task's directory here on the driver."""
        try:
            returned: Returned = ray.get(ref)
        except RayError as exc:
            if self._killed_at is not None:
                return None
            return TaskResult(
                id=task.id,
                domain=task.domain,
                mode=self.job.mode,
                exit_status="worker_lost",  # the task's worker or node died under it: not the task's failure
                expected=task.answer,
                error=f"{type(exc).__name__}: {str(exc)[:2000]}",
            )
        result = returned.result
        try:
            _unpack(make_task_dir(self.out_dir, task.id), returned.files)
        except SandboxError as exc:
            if result is not None:
                result.error = (result.error or "") + f" (its files could not be written: {exc})"
        if result is not None and returned.dropped:
            result.error = (result.error or "") + f" ({returned.dropped} output files over the return limit dropped)"
        return result

    def kill(self) -> None:
        self._killed_at = time.monotonic()
        self.hub.kill.remote()

    def close(self) -> None:
        """Wait for the tasks in flight (after kill they end within the grace), then leave the cluster."""
        while self._refs:
            self.wait(0.5)
        if self.hub is not None:
            ray.kill(self.hub)  # on a cluster that outlives the batch, the actor must not
        if self._connected_here:
            ray.shutdown()  # a local cluster goes with it; a remote one stays
