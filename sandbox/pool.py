"""``SandboxPool``: sandboxes built ahead of time, handed out in microseconds.

RL trainers and batch runners need a fresh jail per task, many per second. A background thread
keeps ``size`` jails ready and tears returned ones down, so ``acquire()`` and ``reset()`` cost a
queue operation instead of a jail build, and ``close()`` of a pooled sandbox does not wait for the
teardown.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from .config import SandboxConfig
from .errors import SandboxClosed
from .jail import Jail
from .sandbox import JailSource, Sandbox


class SandboxPool(JailSource):
    """``with SandboxPool(size=8) as pool: sb = pool.acquire(); ...; sb.close()``."""

    def __init__(self, size: int = 4, config: SandboxConfig | None = None, **options: Any) -> None:
        if size < 1:
            raise ValueError("a pool needs size >= 1")
        if config is not None and options:
            config = SandboxConfig.model_validate({**config.model_dump(), **options})
        self.config = config if config is not None else SandboxConfig(**options)
        self.size = size
        self._ready: queue.Queue[Jail] = queue.Queue()
        self._retired: queue.Queue[Jail] = queue.Queue()
        self._wake = threading.Event()
        self._closed = False
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._work, name="jailbox-pool", daemon=True)
        self._thread.start()

    def acquire(self) -> Sandbox:
        """A ready sandbox; built on the spot when the pool is momentarily empty."""
        return Sandbox.adopt(self.take_jail(), self)

    def take_jail(self) -> Jail:
        """A ready jail (``JailSource``: what an acquired sandbox's ``reset()`` swaps in)."""
        if self._closed:
            raise SandboxClosed("the pool is closed")
        try:
            jail = self._ready.get_nowait()
        except queue.Empty:
            jail = Jail(self.config)
        self._wake.set()
        return jail

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
                    self._ready.put(Jail(self.config))
                except Exception as exc:  # keep serving; acquire() will raise the error itself
                    self.errors.append(exc)
                    self._wake.wait(1.0)
                continue
            self._wake.wait()

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
                self._ready.get_nowait().close()
            except queue.Empty:
                return

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
