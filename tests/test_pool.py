"""reset() and SandboxPool: a fresh jail per task without paying for a build each time."""

from __future__ import annotations

import asyncio
import time

from conftest import host_tree, jail_processes, run_threads

from jailbox.sandbox import AsyncSandbox, Sandbox, SandboxPool
from jailbox.sandbox.errors import SandboxClosed
from jailbox.sandbox.launcher import LAUNCHER


def _state(sb: Sandbox) -> str:
    return sb.exec("cat /testbed/mark 2>/dev/null; for p in /proc/[0-9]*; do cat $p/comm; done | grep -c sleep").stdout


def _settled_state(sb: Sandbox, want: str) -> str:
    """``_state`` once background commands have started: a ``cmd &`` may still be a shell, not yet
    exec'd, when the command that started it returns (bounded: 5 s)."""
    for _ in range(100):
        state = _state(sb)
        if state == want:
            break
        time.sleep(0.05)
    return state


def test_reset_gives_a_fresh_writable_layer_and_kills_everything():
    with Sandbox() as sb:
        sb.write_file("/testbed/mark", "old\n")
        sb.exec("sleep 1000 & setsid sleep 1001 &")
        ns = sb.exec("readlink /proc/self/ns/pid").stdout.strip()
        old_dir = sb.dir
        assert _settled_state(sb, "old\n2\n") == "old\n2\n"
        # the old jail's processes, not its namespace's number: once it is gone, a namespace made
        # anywhere (another worker's jail) may take that number
        old = jail_processes(ns)
        assert len(old) >= 2
        sb.reset()
        assert _state(sb) == "0\n"
        assert [p for p in jail_processes(ns) if p in old] == []  # a psutil.Process is its pid and start
        assert not old_dir.exists()
        assert sb.exec("echo works").stdout == "works\n"


def test_pool_hands_out_ready_sandboxes_and_cleans_up(_state_dir):
    with Sandbox():
        pass
    baseline = sorted(p.pid for p in host_tree())
    with SandboxPool(size=3, hostname="pooled") as pool:
        assert pool.wait_ready(120)
        boxes = [pool.acquire() for _ in range(5)]  # more than the pool holds: built on demand
        for i, sb in enumerate(boxes):
            assert sb.exec("hostname").stdout == "pooled\n"
            sb.write_file("/testbed/mark", f"{i}\n")
        sb = boxes[0]
        sb.exec("sleep 1000 &")
        sb.reset()
        assert _state(sb) == "0\n"
        for box in boxes:
            box.close()
        try:
            sb.exec("true")
            raise AssertionError("a closed pooled sandbox must refuse work")
        except SandboxClosed:
            pass
        assert pool.wait_ready(120)
        assert pool.errors == []
    assert sorted(p.pid for p in host_tree()) == baseline
    assert sorted(p.name for p in (_state_dir / "sandboxes").iterdir()) == []
    assert LAUNCHER.pid in baseline


def test_pool_from_many_threads():
    with SandboxPool(size=4) as pool:

        def work(n: int) -> None:
            for _ in range(3):
                sb = pool.acquire()
                assert sb.exec(f"echo {n}").stdout == f"{n}\n"
                sb.close()

        assert run_threads(work, 8) == []


def test_async_reset():
    async def main() -> str:
        async with AsyncSandbox() as sb:
            await sb.write_file("/testbed/mark", "x")
            await sb.reset()
            r = await sb.exec("ls /testbed")
            return r.stdout

    assert asyncio.run(main()) == ""
