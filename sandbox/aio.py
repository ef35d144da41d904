"""``AsyncSandbox``: the same jail for asyncio, never blocking the event loop.

Commands are driven by the loop itself (``add_reader`` on the command's pipes and reply socket),
so thousands can be in flight without a thread each; creation, teardown and file copies, which
are bursts of blocking calls, run in the default executor.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .child.requests import MAX_WALK_ENTRIES
from .config import SandboxConfig
from .errors import SandboxClosed
from .execution import Stdin, run_async
from .layers import Checkpoint
from .net.policy import NetworkPolicy
from .net.proxy import NetworkLogEntry
from .results import ExecResult, SandboxStats
from .sandbox import Command, Sandbox
from .snapshots import Snapshot

if TYPE_CHECKING:
    from .interpreter import CodeContext, Execution, ExecutionError, OutputMessage, Result

T = TypeVar("T")


class AsyncSandbox:
    """``async with AsyncSandbox() as sb: await sb.exec("echo hi")``."""

    def __init__(self, config: SandboxConfig | None = None, **options: Any) -> None:
        self._config = config
        self._options = options
        self._sb: Sandbox | None = None

    async def start(self) -> AsyncSandbox:
        if self._sb is None:
            self._sb = await asyncio.to_thread(Sandbox, self._config, **self._options)
        return self

    @property
    def sandbox(self) -> Sandbox:
        if self._sb is None:
            raise SandboxClosed("the sandbox is not started; use 'async with' or await start()")
        return self._sb

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | Stdin | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        return await run_async(self.sandbox.begin_exec(cmd, cwd, env, stdin, on_stdout, on_stderr, user), timeout)

    async def run_code(
        self,
        code: str,
        language: str | None = None,
        context: CodeContext | str | None = None,
        on_stdout: Callable[[OutputMessage], Any] | None = None,
        on_stderr: Callable[[OutputMessage], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """As ``Sandbox.run_code``. The wait is a worker thread's; the callbacks run on this event
        loop, in order, all before the call returns. Cancelling the call interrupts the code."""
        loop = asyncio.get_running_loop()
        call = asyncio.to_thread(
            self.sandbox.run_code,
            code,
            language,
            context,
            _on_loop(loop, on_stdout),
            _on_loop(loop, on_stderr),
            _on_loop(loop, on_result),
            _on_loop(loop, on_error),
            envs,
            timeout,
        )
        try:
            return await call
        except asyncio.CancelledError:
            await asyncio.to_thread(self.sandbox.interrupt_code, context)
            raise

    async def start_interpreter(self) -> None:
        """As ``Sandbox.start_interpreter``: returns once the gateway's process is started."""
        await asyncio.to_thread(self.sandbox.start_interpreter)

    async def interrupt_code(self, context: CodeContext | str | None = None) -> None:
        await asyncio.to_thread(self.sandbox.interrupt_code, context)

    async def create_code_context(self, cwd: str | None = None, language: str | None = None) -> CodeContext:
        return await asyncio.to_thread(self.sandbox.create_code_context, cwd, language)

    async def list_code_contexts(self) -> list[CodeContext]:
        return await asyncio.to_thread(self.sandbox.list_code_contexts)

    async def restart_code_context(self, context: CodeContext | str) -> None:
        await asyncio.to_thread(self.sandbox.restart_code_context, context)

    async def remove_code_context(self, context: CodeContext | str) -> None:
        await asyncio.to_thread(self.sandbox.remove_code_context, context)

    def stats(self) -> SandboxStats:
        return self.sandbox.stats()

    def network_log(self) -> list[NetworkLogEntry]:
        return self.sandbox.network_log()

    async def set_network(self, policy: NetworkPolicy | str) -> None:
        await asyncio.to_thread(self.sandbox.set_network, policy)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return await asyncio.to_thread(self.sandbox.read_file, path, max_bytes)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        await asyncio.to_thread(self.sandbox.write_file, path, data, mode)

    async def put(
        self, src: str | os.PathLike[str], dst: str, max_entries: int = MAX_WALK_ENTRIES, max_bytes: int | None = None
    ) -> None:
        await asyncio.to_thread(self.sandbox.put, src, dst, max_entries, max_bytes)

    async def get(self, src: str, dst: str | os.PathLike[str]) -> None:
        await asyncio.to_thread(self.sandbox.get, src, dst)

    @property
    def paused(self) -> bool:
        return self.sandbox.paused

    async def pause(self) -> bool:
        """As ``Sandbox.pause()``."""
        return await asyncio.to_thread(self.sandbox.pause)

    async def resume(self) -> bool:
        """As ``Sandbox.resume()``."""
        return await asyncio.to_thread(self.sandbox.resume)

    async def reset(self) -> None:
        await asyncio.to_thread(self.sandbox.reset)

    async def checkpoint(self) -> Checkpoint:
        return await asyncio.to_thread(self.sandbox.checkpoint)

    async def rollback(self, checkpoint: Checkpoint) -> None:
        await asyncio.to_thread(self.sandbox.rollback, checkpoint)

    async def fork(self, n: int) -> list[AsyncSandbox]:
        """``Sandbox.fork``: each child started, to be closed on its own."""
        children = []
        for child in await asyncio.to_thread(self.sandbox.fork, n):
            wrapped = AsyncSandbox(child.config)
            wrapped._sb = child
            children.append(wrapped)
        return children

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """As ``Sandbox.snapshot()``."""
        return await asyncio.to_thread(self.sandbox.snapshot, name)

    async def close(self) -> None:
        if self._sb is not None:
            await asyncio.to_thread(self._sb.close)

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[T], Any] | None) -> Callable[[T], None] | None:
    """``callback`` run on ``loop`` rather than the worker thread calling it, in call order."""
    if callback is None:
        return None

    def hand_over(value: T) -> None:
        loop.call_soon_threadsafe(callback, value)

    return hand_over
