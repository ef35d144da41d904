"""The small sandbox interface RL trainers call: ``exec``, ``write_file``, ``read_file``, ``close``.

torchtitan's, tinker-cookbook's and rLLM's rollout code each hold a sandbox with these four methods (a
command in, exit code and output back; files in and out; done). ``RolloutSandbox`` is that shape over
one jailbox ``Sandbox``, and ``SandboxFactory`` makes them: fresh, from a durable snapshot
(``create(snapshot=...)``) or as forks of a live one (``fork(parent, n)``, the N rollouts of one
prompt), never more than ``max_live`` alive at once (a create waits for a slot, up to its timeout).

Every result says whose failure it was (``jailbox.agent.outcomes``): an ``ExecOutcome`` carries
``failure`` (``"task"``: a non-zero exit or a timeout; ``"infra"``: the jail did not answer), and a file
call or a create that the infrastructure failed raises ``InfraError``, so a reward is never computed
from one. A file the task did not make raises ``SandboxFileError`` (an ``OSError``: the task's).

Runs in the trainer's process (or a Ray worker's, ``jailbox.rl.ray_backend``). Uses the jail only
through its public API, as ``jailbox.agent`` does. Bounds: ``max_live`` jails per factory, ``READ_LIMIT``
bytes per ``read_file`` unless the caller gives less, the config's limits inside each jail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import NoReturn, Protocol, runtime_checkable

from pydantic import BaseModel

from ..agent.outcomes import Failure, InfraError, is_infra
from ..sandbox import Sandbox, SandboxConfig
from ..sandbox.errors import SandboxError

__all__ = ["ExecOutcome", "Failure", "InfraError", "RLSandbox", "RolloutSandbox", "SandboxFactory"]

READ_LIMIT = 64 << 20  # bytes one read_file may return: the sandbox's own default
INFRA_EXIT = -1  # the exit code of an ExecOutcome whose command never ran to an end


class ExecOutcome(BaseModel):
    """One command's end as a trainer reads it. ``failure`` is None when it exited 0 in time."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    wall_time: float = 0.0
    failure: Failure | None = None
    error: str | None = None  # why, when the infrastructure failed

    @property
    def ok(self) -> bool:
        return self.failure is None


@runtime_checkable
class RLSandbox(Protocol):
    """The four methods trainers call; ``RolloutSandbox`` and the Ray backend's handle implement it."""

    def exec(self, command: str | Sequence[str], timeout: float | None = None) -> ExecOutcome: ...

    def write_file(self, path: str, content: str | bytes) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def close(self) -> None: ...


class RolloutSandbox:
    """One jail behind the four methods. Thread-safe as ``Sandbox`` is; ``close()`` is idempotent and
    frees the factory's slot."""

    def __init__(self, sandbox: Sandbox, factory: SandboxFactory | None = None) -> None:
        self.sandbox = sandbox
        self._factory = factory
        self._closed = False
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return self.sandbox.id

    def exec(self, command: str | Sequence[str], timeout: float | None = None) -> ExecOutcome:
        """Run ``command`` (a shell string or an argv list); never raises for a failure of the command
        or of the jail: ``failure`` says whose it was."""
        cmd = command if isinstance(command, str) else list(command)
        started = time.monotonic()
        try:
            r = self.sandbox.exec(cmd, timeout=timeout)
        except SandboxError as exc:
            if not is_infra(exc):
                raise  # a bad argument is the caller's bug, not an outcome
            return ExecOutcome(
                exit_code=INFRA_EXIT,
                wall_time=time.monotonic() - started,
                failure="infra",
                error=f"{type(exc).__name__}: {exc}",
            )
        failed = r.exit_code != 0 or r.timed_out
        return ExecOutcome(
            exit_code=r.exit_code,
            stdout=r.stdout,
            stderr=r.stderr,
            timed_out=r.timed_out,
            wall_time=r.wall_time,
            failure="task" if failed else None,
        )

    def write_file(self, path: str, content: str | bytes) -> None:
        try:
            self.sandbox.write_file(path, content)
        except SandboxError as exc:
            _reraise(exc)

    def read_file(self, path: str, max_bytes: int = READ_LIMIT) -> bytes:
        """The file's bytes (at most ``max_bytes``: a larger file raises ``SandboxFileError``)."""
        try:
            return self.sandbox.read_file(path, max_bytes=min(max_bytes, READ_LIMIT))
        except SandboxError as exc:
            _reraise(exc)

    def snapshot(self, name: str | None = None) -> str:
        """Keep this jail's filesystem as a durable snapshot; its id, for ``SandboxFactory.create(snapshot=)``."""
        try:
            return self.sandbox.snapshot(name).id
        except SandboxError as exc:
            _reraise(exc)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.sandbox.close()
        finally:
            if self._factory is not None:
                self._factory._release(1)

    def __enter__(self) -> RolloutSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reraise(exc: SandboxError) -> NoReturn:
    if is_infra(exc):
        raise InfraError(f"{type(exc).__name__}: {exc}") from exc
    raise exc


class SandboxFactory:
    """Makes ``RolloutSandbox``es of one ``SandboxConfig``, at most ``max_live`` alive at once across
    every thread that uses it. A create or fork waits up to ``wait`` seconds for room, then raises
    ``InfraError`` (the cluster is full: nothing the task did)."""

    def __init__(self, config: SandboxConfig | None = None, max_live: int = 8, wait: float = 600.0) -> None:
        if not isinstance(max_live, int) or isinstance(max_live, bool) or max_live < 1:
            raise ValueError(f"max_live must be a positive count of jails, e.g. max_live=8, not {max_live!r}")
        self.config = config or SandboxConfig()
        self.max_live = max_live
        self.wait = wait
        self._live = 0
        self._room = threading.Condition()

    @property
    def live(self) -> int:
        with self._room:
            return self._live

    def _reserve(self, n: int) -> None:
        if n > self.max_live:
            raise ValueError(f"{n} jails at once is over max_live={self.max_live}: raise max_live, e.g. {n}")
        with self._room:
            if not self._room.wait_for(lambda: self._live + n <= self.max_live, self.wait):
                raise InfraError(f"no room for {n} more jails in {self.wait:g} s: {self._live} of {self.max_live} live")
            self._live += n

    def _release(self, n: int) -> None:
        with self._room:
            self._live -= n
            self._room.notify_all()

    def create(self, snapshot: str | None = None) -> RolloutSandbox:
        """A fresh jail, over ``snapshot`` (a durable snapshot's id or name) when given."""
        self._reserve(1)
        try:
            config = self.config if snapshot is None else self.config.model_copy(update={"snapshot": snapshot})
            sb = Sandbox(SandboxConfig.model_validate(config.model_dump()))
        except BaseException as exc:
            self._release(1)
            if isinstance(exc, SandboxError) and is_infra(exc):
                raise InfraError(f"the jail did not start: {type(exc).__name__}: {exc}") from exc
            raise
        return RolloutSandbox(sb, self)

    def fork(self, parent: RolloutSandbox, n: int) -> list[RolloutSandbox]:
        """``n`` jails each starting from ``parent``'s filesystem now (``Sandbox.fork``); all or none."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"fork: n must be a positive count of children, e.g. fork(parent, 4), not {n!r}")
        self._reserve(n)
        try:
            children = parent.sandbox.fork(n)
        except BaseException as exc:
            self._release(n)
            if isinstance(exc, SandboxError) and is_infra(exc):
                raise InfraError(f"the fork did not start: {type(exc).__name__}: {exc}") from exc
            raise
        return [RolloutSandbox(child, self) for child in children]
