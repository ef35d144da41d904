"""Many sandboxes from many threads, one sandbox from several threads, and asyncio (point 5)."""

from __future__ import annotations

import asyncio
import threading

from conftest import run_threads

from jailbox.sandbox import AsyncSandbox, Sandbox


def test_thirty_two_sandboxes_from_thirty_two_threads():
    outputs: dict[int, list[str]] = {}
    barrier = threading.Barrier(32)

    def work(n: int) -> None:
        barrier.wait()
        with Sandbox() as sb:
            sb.write_file("/testbed/n", str(n))
            outputs[n] = [sb.exec(f"echo {n}-{i} $(cat /testbed/n)").stdout for i in range(5)]
            assert sb.read_file("/testbed/n") == str(n).encode()

    assert run_threads(work, 32) == []
    assert outputs == {n: [f"{n}-{i} {n}\n" for i in range(5)] for n in range(32)}


def test_one_sandbox_from_several_threads(sb):
    results: dict[int, list[str]] = {}

    def work(n: int) -> None:
        results[n] = [sb.exec(f"sleep 0.0{i % 3}; echo {n}:{i}", timeout=60).stdout for i in range(20)]
        sb.write_file(f"/testbed/f{n}", f"file {n}")
        assert sb.read_file(f"/testbed/f{n}") == f"file {n}".encode()

    assert run_threads(work, 8) == []
    assert results == {n: [f"{n}:{i}\n" for i in range(20)] for n in range(8)}


def test_async_sandbox_runs_concurrently_without_blocking_the_loop():
    async def one(n: int) -> list[str]:
        async with AsyncSandbox() as sb:
            await sb.write_file("/testbed/n", str(n))
            outs = await asyncio.gather(*(sb.exec(f"echo {n}.{i}; cat /testbed/n") for i in range(10)))
            slow = await sb.exec("sleep 30", timeout=0.5)
            assert slow.timed_out
            assert await sb.read_file("/testbed/n") == str(n).encode()
            return [o.stdout for o in outs]

    async def main() -> tuple[list[list[str]], int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        async with AsyncSandbox() as sb:
            await sb.exec("sleep 1")
        results = await asyncio.gather(*(one(n) for n in range(8)))
        stop.set()
        await tick_task
        return results, ticks

    results, ticks = asyncio.run(main())
    assert results == [[f"{n}.{i}\n{n}" for i in range(10)] for n in range(8)]
    assert ticks >= 2  # the loop kept running while commands were in flight


def test_async_streaming_and_stdin():
    async def main() -> tuple[str, list[bytes]]:
        chunks: list[bytes] = []
        async with AsyncSandbox() as sb:
            r = await sb.exec("cat; echo done", stdin=b"x" * 300000, on_stdout=chunks.append)
            return r.stdout, chunks

    out, chunks = asyncio.run(main())
    assert out == "x" * 300000 + "done\n"
    assert b"".join(chunks) == out.encode()
