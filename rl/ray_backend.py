"""jailbox behind Ray's sandbox interface (``ray.experimental.sandbox``, Ray 2.60).

Ray defines ``BaseSandboxBackend`` (create, delete, exec, write, read, status of sandboxes by id) and a
``SandboxRuntime`` over it, but the runtime builds its gVisor backend in ``__init__`` and takes none as
an argument, and Ray's ``Sandbox`` actor builds that runtime: a backend can be neither passed nor
registered. So this module gives the three layers again over jailbox: ``JailboxBackend`` (the
interface, implemented), ``JailboxRuntime`` (Ray's runtime with this backend and jailbox's root
filesystems as images, nothing else changed) and ``JailboxSandbox``, the actor, made by ``create``
with the sandbox's CPU and memory as the actor's Ray resources and as the jail's bounds.

Images: ``"host"``, a stored root filesystem's name or a directory (``SandboxConfig.rootfs``), or
``"snapshot:<id or name>"`` (a durable snapshot in the node's store). Branching where the interface
has room: ``fork(n)`` on the actor makes n jails from the sandbox's filesystem in the same actor (they
share its resources, as forks share its layers), ``snapshot()`` keeps it in the node's store.

Failures are typed (``jailbox.agent.outcomes``): a jail that does not start or dies raises
``SandboxInfraError`` (both Ray's ``SandboxExecError``/``SandboxCreationError`` and jailbox's
``InfraError``); ``RaySandbox``, the four-method view of an actor, reports a dead actor (its worker or
node gone) as ``failure="infra"``. A dead actor's jails go with its process: jailbox's launcher
removes a jail whose owner died.

The backend and runtime run in the actor's worker process, on whichever node Ray placed it;
``create``, ``RaySandbox`` in the driver. Bounds: ``rl.READ_LIMIT`` per read (and per append's read),
the jail's limits from ``cpu``/``memory``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError
from ray.experimental.sandbox import (
    BaseSandboxBackend,
    ExecResult,
    SandboxCreationError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxRuntime,
    SandboxStatus,
)
from ray.experimental.sandbox.config import SandboxConfig as RayConfig
from ray.experimental.sandbox.config import parse_memory_bytes

from ..agent.outcomes import Failure, InfraError, is_infra
from ..sandbox import Sandbox, SandboxConfig
from ..sandbox.errors import SandboxError
from . import INFRA_EXIT, READ_LIMIT, ExecOutcome

SNAPSHOT_IMAGE = "snapshot:"


class SandboxInfraError(SandboxExecError, SandboxCreationError, InfraError):
    """The jail failed, not the command: it did not start, or it died. Ray's errors and jailbox's at once."""


@dataclass
class JailboxExecResult(ExecResult):
    """Ray's ``ExecResult`` with whose failure it was: ``"task"`` for a non-zero exit or a timeout."""

    timed_out: bool = False
    failure: Failure | None = None


class JailboxImages:
    """Ray's image manager, for jailbox: an image is a root filesystem already on the node (nothing is pulled)."""

    def pull_image(self, image: str, timeout_seconds: float = 120.0, instance_id: str | None = None) -> str:
        return image


def jail_config(config: RayConfig, base: SandboxConfig | None = None) -> SandboxConfig:
    """The jail for Ray's config: image as root filesystem or snapshot, cpu and memory as bounds. What
    jailbox cannot give is refused in one line naming the field."""
    if config.network != "none":
        raise SandboxCreationError(f"network={config.network!r}: jailbox's Ray backend runs jails offline; use 'none'")
    if config.capabilities:
        raise SandboxCreationError("capabilities: a jail's commands hold none; leave it unset, e.g. capabilities=None")
    base = base or SandboxConfig()
    update: dict[str, Any] = {"env": {**base.env, **config.env}}
    image = config.image.strip()
    if image.startswith(SNAPSHOT_IMAGE):
        update["snapshot"] = image[len(SNAPSHOT_IMAGE) :]
    else:
        update["rootfs"] = image
    if config.workdir:
        update["workdir"] = config.workdir
    memory = parse_memory_bytes(config.memory)
    update["limits"] = {
        **base.limits.model_dump(),
        **({"cpus": float(config.cpu)} if config.cpu and config.cpu > 0 else {}),
        **({"memory": memory} if memory else {}),
    }
    try:  # validated whole, as Sandbox(config, **options) does: a bad image or bound is one line
        return SandboxConfig.model_validate({**base.model_dump(), **update})
    except ValueError as exc:
        raise SandboxCreationError(f"image {config.image!r}: {exc}") from None


class JailboxBackend(BaseSandboxBackend):
    """Ray's sandbox backend interface over jailbox jails, in one process; thread-safe."""

    def __init__(self, base: SandboxConfig | None = None, image_manager: Any = None) -> None:
        super().__init__(image_manager=image_manager or JailboxImages())
        self.base = base
        self._boxes: dict[str, Sandbox] = {}
        self._lock = threading.Lock()

    def _box(self, sandbox_id: str) -> Sandbox:
        with self._lock:
            box = self._boxes.get(sandbox_id)
        if box is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} here (deleted, or made by another backend)")
        return box

    def _add(self, box: Sandbox) -> str:
        with self._lock:
            self._boxes[box.id] = box
        return box.id

    def create_sandbox(self, config: RayConfig) -> str:
        jail = jail_config(config, self.base)
        try:
            return self._add(Sandbox(jail))
        except SandboxError as exc:
            if is_infra(exc):
                raise SandboxInfraError(f"the jail did not start: {type(exc).__name__}: {exc}") from exc
            raise SandboxCreationError(f"{type(exc).__name__}: {exc}") from None

    def delete_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            box = self._boxes.pop(sandbox_id, None)
        if box is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r} here (deleted, or made by another backend)")
        box.close()

    def exec_command(
        self,
        sandbox_id: str,
        command: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        shell: str | None = None,
        user: str | None = None,
    ) -> JailboxExecResult:
        if user is not None:
            raise SandboxExecError(f"user={user!r}: jailbox runs commands as the jail's root; leave user unset")
        box = self._box(sandbox_id)
        cmd: str | list[str] = [shell, "-c", command] if shell and isinstance(command, str) else command
        started = time.monotonic()
        try:
            r = box.exec(cmd, timeout=timeout, cwd=cwd, env=env)
        except SandboxError as exc:
            if is_infra(exc):
                raise SandboxInfraError(f"the jail failed: {type(exc).__name__}: {exc}") from exc
            raise SandboxExecError(f"{type(exc).__name__}: {exc}") from None
        return JailboxExecResult(
            exit_code=r.exit_code,
            stdout=r.stdout,
            stderr=r.stderr,
            duration_seconds=time.monotonic() - started,
            timed_out=r.timed_out,
            failure="task" if r.exit_code != 0 or r.timed_out else None,
        )

    def write_file(self, sandbox_id: str, path: str, content: str | bytes, append: bool = False) -> None:
        box = self._box(sandbox_id)
        data = content.encode() if isinstance(content, str) else content
        try:
            if append and box.exec(["test", "-e", path], timeout=30).exit_code == 0:
                data = box.read_file(path, max_bytes=READ_LIMIT) + data
            box.write_file(path, data)
        except SandboxError as exc:
            if is_infra(exc):
                raise SandboxInfraError(f"the jail failed: {type(exc).__name__}: {exc}") from exc
            raise

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        box = self._box(sandbox_id)
        try:
            return box.read_file(path, max_bytes=READ_LIMIT)
        except SandboxError as exc:
            if is_infra(exc):
                raise SandboxInfraError(f"the jail failed: {type(exc).__name__}: {exc}") from exc
            raise

    def get_status(self, sandbox_id: str) -> SandboxStatus:
        box = self._box(sandbox_id)
        if box.closed:
            return SandboxStatus.TERMINATED
        try:
            return SandboxStatus.RUNNING if box.exec(["true"], timeout=10).exit_code == 0 else SandboxStatus.ERROR
        except SandboxError:
            return SandboxStatus.ERROR

    def fork_sandbox(self, sandbox_id: str, n: int) -> list[str]:
        """``n`` sandboxes from this one's filesystem now (``Sandbox.fork``); their ids."""
        try:
            children = self._box(sandbox_id).fork(n)
        except SandboxError as exc:
            if is_infra(exc):
                raise SandboxInfraError(f"the fork did not start: {type(exc).__name__}: {exc}") from exc
            raise SandboxExecError(f"{type(exc).__name__}: {exc}") from None
        return [self._add(child) for child in children]

    def snapshot_sandbox(self, sandbox_id: str, name: str | None = None) -> str:
        """The sandbox's filesystem kept in this node's store; the snapshot's id (image ``snapshot:<id>``)."""
        return self._box(sandbox_id).snapshot(name).id

    def init_pid(self, sandbox_id: str) -> int:
        return self._box(sandbox_id).init_pid

    def close(self) -> None:
        with self._lock:
            boxes, self._boxes = list(self._boxes.values()), {}
        for box in boxes:
            box.close()


class JailboxRuntime(SandboxRuntime):
    """Ray's ``SandboxRuntime`` with the jailbox backend: the same methods (create, exec, upload_file,
    download_file, read/write_file, get_status, delete), with jailbox root filesystems as images."""

    def __init__(self, base: SandboxConfig | None = None) -> None:
        # not super().__init__(): it builds the gVisor backend this runtime replaces
        self._image_manager = JailboxImages()  # type: ignore[assignment]
        self._backend = JailboxBackend(base, self._image_manager)  # type: ignore[assignment]
        self._ttl_timers: dict[str, threading.Timer] = {}

    @property
    def backend(self) -> JailboxBackend:  # type: ignore[override]
        return self._backend  # type: ignore[return-value]


class JailboxSandbox:
    """The actor (``create`` makes it ``ray.remote``): one jail made at start, its forks, their calls.
    Each method takes the sandbox's id, None for the one the actor was made with."""

    def __init__(self, image: str, cpu: float, memory: int | None, env: dict[str, str], workdir: str | None) -> None:
        self.runtime = JailboxRuntime()
        self.instance_id = self.runtime.create(image=image, cpu=cpu, memory=memory or 0, env=env, workdir=workdir)

    def _id(self, sandbox_id: str | None) -> str:
        return sandbox_id or self.instance_id

    def get_instance_id(self) -> str:
        return self.instance_id

    def exec(self, command: str | list[str], timeout: float | None = None, sandbox_id: str | None = None) -> ExecResult:
        return self.runtime.exec(self._id(sandbox_id), command, timeout=timeout)

    def write_file(self, path: str, content: str | bytes, sandbox_id: str | None = None) -> None:
        self.runtime.write_file(self._id(sandbox_id), path, content)

    def read_file(self, path: str, sandbox_id: str | None = None) -> bytes:
        return self.runtime.read_file(self._id(sandbox_id), path)

    def get_status(self, sandbox_id: str | None = None) -> SandboxStatus:
        return self.runtime.get_status(self._id(sandbox_id))

    def fork(self, n: int, sandbox_id: str | None = None) -> list[str]:
        return self.runtime.backend.fork_sandbox(self._id(sandbox_id), n)

    def snapshot(self, name: str | None = None, sandbox_id: str | None = None) -> str:
        return self.runtime.backend.snapshot_sandbox(self._id(sandbox_id), name)

    def init_pid(self, sandbox_id: str | None = None) -> int:
        return self.runtime.backend.init_pid(self._id(sandbox_id))

    def delete(self, sandbox_id: str | None = None) -> None:
        self.runtime.delete(self._id(sandbox_id))

    def close(self) -> None:
        self.runtime.backend.close()


def create(
    image: str = "host",
    cpu: float = 1.0,
    memory: str | int | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    **options: Any,
) -> Any:
    """A ``JailboxSandbox`` actor on the cluster, as ``ray.experimental.sandbox.create`` makes its own:
    ``cpu`` and ``memory`` are both the actor's Ray resources and the jail's bounds. ``options`` go to
    ``.options()`` (a scheduling strategy, say). Never restarted: a dead actor is an infra failure."""
    opts: dict[str, Any] = {"num_cpus": cpu, "max_restarts": 0, **options}
    memory_bytes = parse_memory_bytes(memory) if memory is not None else None
    if memory_bytes:
        opts["memory"] = memory_bytes
    actor = ray.remote(JailboxSandbox).options(**opts)
    return actor.remote(image, cpu, memory_bytes, env or {}, workdir)


class RaySandbox:
    """The four-method view (``jailbox.rl.RLSandbox``) of one sandbox in a ``JailboxSandbox`` actor.
    A dead actor or jail is ``failure="infra"`` (exec) or ``InfraError`` (the file calls)."""

    def __init__(self, actor: Any, sandbox_id: str | None = None, timeout: float = 600.0) -> None:
        self.actor = actor
        self.sandbox_id = sandbox_id
        self.timeout = timeout

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.timeout)
        except InfraError:
            raise
        except RayError as exc:  # the actor's worker or node died, or the call outlived its timeout
            cause = getattr(exc, "cause", None)
            if isinstance(cause, InfraError):
                raise InfraError(str(cause)) from exc
            if isinstance(cause, OSError):
                raise cause from None  # a file the task did or did not make: the task's
            raise InfraError(f"the sandbox's Ray worker failed: {type(exc).__name__}: {str(exc)[:500]}") from exc

    def exec(self, command: str | list[str], timeout: float | None = None) -> ExecOutcome:
        cmd = command if isinstance(command, str) else list(command)
        started = time.monotonic()
        try:
            r = self._get(self.actor.exec.remote(cmd, timeout, self.sandbox_id))
        except InfraError as exc:
            return ExecOutcome(
                exit_code=INFRA_EXIT, wall_time=time.monotonic() - started, failure="infra", error=str(exc)
            )
        return ExecOutcome(
            exit_code=r.exit_code,
            stdout=r.stdout,
            stderr=r.stderr,
            timed_out=getattr(r, "timed_out", False),
            wall_time=r.duration_seconds,
            failure=getattr(r, "failure", None if r.exit_code == 0 else "task"),
        )

    def write_file(self, path: str, content: str | bytes) -> None:
        self._get(self.actor.write_file.remote(path, content, self.sandbox_id))

    def read_file(self, path: str) -> bytes:
        data: bytes = self._get(self.actor.read_file.remote(path, self.sandbox_id))
        return data

    def fork(self, n: int) -> list[RaySandbox]:
        ids: list[str] = self._get(self.actor.fork.remote(n, self.sandbox_id))
        return [RaySandbox(self.actor, child, self.timeout) for child in ids]

    def close(self) -> None:
        """Delete this sandbox; the actor's own sandbox ends the actor. A dead actor has nothing left to close."""
        try:
            if self.sandbox_id is None:
                ray.get(self.actor.close.remote(), timeout=self.timeout)
                ray.kill(self.actor)
            else:
                ray.get(self.actor.delete.remote(self.sandbox_id), timeout=self.timeout)
        except RayError:
            pass
