"""``SandboxPool``: sandboxes built ahead of time, handed out in microseconds.

RL trainers and batch runners need a fresh jail per task, many per second. A background thread
keeps ``size`` jails ready and tears returned ones down, so ``acquire()`` and ``reset()`` cost a
queue operation instead of a jail build, and ``close()`` of a pooled sandbox does not wait for the
teardown.

With ``interpreter=True`` each ready sandbox also has its code interpreter started (the gateway and
the default context's kernel, ``docs/code-interpreter.md``) as soon as its jail is built, so the
first ``run_code`` of an acquired sandbox waits for what is left of that start, not all of it. A
ready sandbox is handed out once; its kernel is its own and has run nothing.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import TYPE_CHECKING, Any

from .config import SandboxConfig
from .errors import InterpreterError, SandboxClosed
from .jail import Jail
from .sandbox import JailSource, Sandbox

if TYPE_CHECKING:
    from .interpreter import Gateway


class SandboxPool(JailSource):
    """``with SandboxPool(size=8) as pool: sb = pool.acquire(); ...; sb.close()``."""

    def __init__(
        self, size: int = 4, config: SandboxConfig | None = None, *, interpreter: bool = False, **options: Any
    ) -> None:
        """``interpreter``: start each ready sandbox's code interpreter ahead (a gateway and kernel
        each, about 100 MB resident, in the sandbox's own limits)."""
        if size < 1:
            raise ValueError("a pool needs size >= 1")
        if not isinstance(interpreter, bool):
            raise ValueError(
                f"interpreter must be True or False, e.g. SandboxPool(4, interpreter=True), not {interpreter!r}"
            )
        if config is not None and options:
            config = SandboxConfig.model_validate({**config.model_dump(), **options})
        self.config = config if config is not None else SandboxConfig(**options)
        self.size = size
        self.interpreter = interpreter
        self._ready: queue.Queue[Sandbox] = queue.Queue()
        self._retired: queue.Queue[Jail] = queue.Queue()
        self._wake = threading.Event()
        self._closed = False
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._work, name="jailbox-pool", daemon=True)
        self._thread.start()

    def acquire(self) -> Sandbox:
        """A ready sandbox; built on the spot (its interpreter not started) when the pool is
        momentarily empty (``JailSource``: an acquired sandbox's ``reset()`` takes over one's jail)."""
        if self._closed:
            raise SandboxClosed("the pool is closed")
        try:
            sb = self._ready.get_nowait()
        except queue.Empty:
            sb = Sandbox.adopt(Jail(self.config), self)
        self._wake.set()
        return sb

    def retire(self, jail: Jail) -> None:
        """Tear a jail down in the background (``JailSource``: an acquired sandbox's old jails)."""
        if self._closed:
            jail.close()
            return
        self._retired.put(jail)
        self._wake.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the pool holds ``size`` ready sandboxes (for benchmarks and warm starts)."""
        done = threading.Event()

        def check() -> None:
            while not self._closed and self._ready.qsize() < self.size:
                self._wake.set()
                if done.wait(0.005):
                    return
            with self._ready.mutex:
                ready = list(self._ready.queue)
            for sb in ready:  # their kernels answered (or failed: the first run_code starts another)
                gateway = _gateway(sb)
                if gateway is not None and not done.is_set():
                    with contextlib.suppress(InterpreterError):
                        gateway.wait_ready()
            done.set()

        waiter = threading.Thread(target=check, daemon=True)
        waiter.start()
        waiter.join(timeout)
        done.set()
        return self._ready.qsize() >= self.size

    def _work(self) -> None:
        while not self._closed:
            self._wake.clear()
            self._drain_retired()
            if self._ready.qsize() < self.size:
                try:
                    self._ready.put(self._build())
                except Exception as exc:  # keep serving; acquire() will raise the error itself
                    self.errors.append(exc)
                    self._wake.wait(1.0)
                continue
            self._wake.wait()

    def _build(self) -> Sandbox:
        """A ready sandbox: its jail, and with ``interpreter`` its gateway started (not waited for:
        the kernel starts in the jail while the pool builds the next one)."""
        sb = Sandbox.adopt(Jail(self.config), self)
        if self.interpreter:
            try:
                sb.start_interpreter()
            except BaseException:
                sb.close()
                raise
        return sb

    def _drain_retired(self) -> None:
        while True:
            try:
                self._retired.get_nowait().close()
            except queue.Empty:
                return

    def close(self) -> None:
        """Tear down every ready and retired jail; sandboxes still in use stay usable until closed."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join()
        self._drain_retired()
        while True:
            try:
                self._ready.get_nowait().close()  # its gateway with it
            except queue.Empty:
                return

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _gateway(sb: Sandbox) -> Gateway | None:
    interpreter = sb._interpreter
    return None if interpreter is None else interpreter.gateway
