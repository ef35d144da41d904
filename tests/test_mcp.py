"""``jailbox mcp``: a real MCP client (the ``mcp`` SDK's stdio and streamable HTTP clients) drives
real jails through ``jailbox mcp`` started as a subprocess; sandboxes end with their session."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import jail_processes, pid_namespace_held, require
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from support.cli import JAILBOX
from support.waits import wait_until

from jailbox import snapshots
from jailbox.sandbox import Sandbox

TOOLS = {
    *("create_sandbox", "run_command", "read_file", "write_file", "list_sandboxes", "kill_sandbox"),
    *("checkpoint", "rollback", "drop_checkpoint", "fork_sandbox", "pause_sandbox", "resume_sandbox"),
    *("snapshot_sandbox", "list_snapshots", "delete_snapshot"),
}
SNAP_ID = re.compile(r"snap-[0-9a-f]{12}")
SERVER = [*JAILBOX, "mcp"]


@pytest.fixture
def shelf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store of the test's own, which the servers it starts inherit; its snapshots are removed after
    (they may hold subordinate ids)."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    yield snapshots.root()
    for snap in snapshots.list():
        snapshots.remove(snap.id)


def _sandbox_dirs(state: Path) -> list[str]:
    top = state / "sandboxes"
    return sorted(p.name for p in top.iterdir()) if top.is_dir() else []


def _layers(state: Path) -> int:
    """Read-only layers on disk, which checkpoints and forks hold."""
    return sum(name.startswith("layer-") for name in _sandbox_dirs(state))


async def _call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


async def _error(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    text = result.content[0].text
    assert "\n" not in text
    return text


@asynccontextmanager
async def _stdio(*flags: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], *flags], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


class HttpServer:
    """``jailbox mcp --http --port 0`` as a subprocess with ``config`` as its user's config directory;
    ``url`` is where it listens, ``log`` what it printed on starting, ``token`` the one in its default
    token file."""

    def __init__(self, config: Path, *flags: str) -> None:
        env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
        argv = [*SERVER, "--http", "--port", "0", *flags]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stderr is not None
        self.log: list[str] = []
        while not self.log or "streamable HTTP at" not in self.log[-1]:  # the last line it prints on starting
            self.log.append(self.proc.stderr.readline())
            assert self.log[-1], self.log  # it exited
        found = re.search(r"(http://\S+/mcp)", self.log[-1])
        assert found, self.log
        self.url = found.group(1)
        default = config / "jailbox" / "mcp-token"
        self.token = default.read_text().strip() if default.exists() else None  # none made with --token-file

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.proc.kill()
            self.proc.wait()
            assert self.proc.stderr is not None
            self.proc.stderr.close()


def _bearer(token: str | None) -> dict[str, str]:
    assert token is not None
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def _http(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=_bearer(token), timeout=httpx2.Timeout(60, read=120)) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _pid_ns(session: ClientSession, sandbox_id: str) -> str:
    out = await _call(session, "run_command", sandbox_id=sandbox_id, command="readlink /proc/self/ns/pid")
    assert out["exit_code"] == 0, out
    return out["stdout"].strip()


async def _exercise(session: ClientSession) -> None:
    """Every tool once, the way a client uses them."""
    tools = await session.list_tools()
    assert {t.name for t in tools.tools} == TOOLS
    made = await _call(session, "create_sandbox")
    sid = made["sandbox_id"]
    assert made["template"] == "host"
    ran = await _call(session, "run_command", sandbox_id=sid, command="echo out; echo err >&2; exit 3")
    assert (ran["exit_code"], ran["stdout"], ran["stderr"], ran["timed_out"]) == (3, "out\n", "err\n", False)
    slow = await _call(session, "run_command", sandbox_id=sid, command="sleep 60", timeout=1)
    assert slow["timed_out"] is True
    assert (await _call(session, "write_file", sandbox_id=sid, path="/tmp/a/note.txt", content="héllo\n"))["size"] == 7
    got = await _call(session, "read_file", sandbox_id=sid, path="/tmp/a/note.txt")
    assert (got["content"], got["encoding"]) == ("héllo\n", "text")
    ran = await _call(session, "run_command", sandbox_id=sid, command="cat note.txt", cwd="/tmp/a")
    assert ran["stdout"] == "héllo\n"
    blob = bytes(range(256))
    await _call(
        session, "write_file", sandbox_id=sid, path="b.bin", content=base64.b64encode(blob).decode(), encoding="base64"
    )
    got = await _call(session, "read_file", sandbox_id=sid, path="b.bin", encoding="base64")
    assert base64.b64decode(got["content"]) == blob
    assert "base64" in await _error(session, "read_file", sandbox_id=sid, path="b.bin")
    listed = await _call(session, "list_sandboxes")
    assert [s["sandbox_id"] for s in listed["sandboxes"]] == [sid]
    await _call(session, "write_file", sandbox_id=sid, path="state", content="v1")
    cp = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
    await _call(session, "write_file", sandbox_id=sid, path="state", content="v2")
    assert (await _call(session, "rollback", sandbox_id=sid, checkpoint_id=cp))["dropped"] == []
    assert (await _call(session, "read_file", sandbox_id=sid, path="state"))["content"] == "v1"
    assert (await _call(session, "drop_checkpoint", sandbox_id=sid, checkpoint_id=cp))["dropped"] is True
    [child] = (await _call(session, "fork_sandbox", sandbox_id=sid))["sandbox_ids"]
    assert (await _call(session, "read_file", sandbox_id=child, path="state"))["content"] == "v1"
    assert (await _call(session, "pause_sandbox", sandbox_id=child))["paused"] is True
    assert "resume_sandbox" in await _error(session, "read_file", sandbox_id=child, path="state")
    assert (await _call(session, "resume_sandbox", sandbox_id=child))["paused"] is False
    assert (await _call(session, "kill_sandbox", sandbox_id=child))["killed"] is True
    assert (await _call(session, "kill_sandbox", sandbox_id=sid))["killed"] is True
    assert "no sandbox" in await _error(session, "run_command", sandbox_id=sid, command="true")
    assert (await _call(session, "list_sandboxes"))["sandboxes"] == []


@pytest.mark.slow
def test_stdio_session_lists_tools_runs_commands_and_moves_files(_state_dir):
    asyncio.run(_exercise_stdio())
    assert _sandbox_dirs(_state_dir) == []


async def _exercise_stdio() -> None:
    async with _stdio() as session:
        await _exercise(session)


@pytest.mark.slow
def test_streamable_http_session_runs_the_same_tools(_state_dir, tmp_path):
    server = HttpServer(tmp_path / "config")
    try:
        assert server.url.startswith("http://127.0.0.1:")

        async def scenario() -> None:
            async with _http(server.url, server.token) as session:
                await _exercise(session)

        asyncio.run(scenario())
    finally:
        assert server.stop() == 0
    assert _sandbox_dirs(_state_dir) == []


def test_bad_arguments_get_one_line_naming_the_field_and_an_example():
    async def scenario() -> None:
        async with _stdio() as session:
            for tool, arguments, field in [
                ("create_sandbox", {"network": "bogus"}, "network"),
                ("create_sandbox", {"network": "host"}, "network"),  # off unless --allow-host-network
                ("create_sandbox", {"template": "/etc"}, "template"),
                ("create_sandbox", {"template": "../x"}, "template"),
                ("create_sandbox", {"template": "tests"}, "template"),  # a directory where the server runs
                ("create_sandbox", {"template": "~"}, "template"),
                ("create_sandbox", {"template": "no-such-image"}, "template"),
                ("create_sandbox", {"memory": "lots"}, "memory"),
                ("create_sandbox", {"pids": "many"}, "pids"),
                ("create_sandbox", {"cpus": -1}, "cpus"),
                ("run_command", {"sandbox_id": "nope", "command": "true"}, "sandbox_id"),
                ("read_file", {"sandbox_id": "../../etc", "path": "/x"}, "sandbox_id"),
                ("kill_sandbox", {"sandbox_id": "nope"}, "sandbox_id"),
                ("run_command", {"sandbox_id": "x"}, "command"),
            ]:
                text = await _error(session, tool, **arguments)
                assert text.startswith(f"{tool}: {field}"), text
                assert "e.g." in text or "list_sandboxes" in text, text
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            for arguments, field in [
                ({"command": "true", "timeout": "soon"}, "timeout"),
                ({"command": "true", "timeout": 0}, "timeout"),
                ({"command": "true", "timeout": 10**9}, "timeout"),
                ({"command": "   "}, "command"),
            ]:
                text = await _error(session, "run_command", sandbox_id=sid, **arguments)
                assert text.startswith(f"run_command: {field}"), text
            text = await _error(session, "read_file", sandbox_id=sid, path="/a/../../etc/passwd")
            assert text.startswith("read_file: path"), text
            text = await _error(session, "write_file", sandbox_id=sid, path="x", content="!!", encoding="base64")
            assert text.startswith("write_file: content"), text

    asyncio.run(scenario())


def test_outputs_and_files_are_bounded():
    async def scenario() -> None:
        async with _stdio() as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            big = await _call(session, "run_command", sandbox_id=sid, command="head -c 3000000 /dev/zero | tr '\\0' a")
            assert big["exit_code"] == 0
            assert len(big["stdout"]) <= (64 << 10) + 200 and big["stdout_dropped"] >= 3000000 - (64 << 10)
            await _call(session, "run_command", sandbox_id=sid, command="head -c 2000000 /dev/zero > /tmp/big")
            assert "read_file:" in await _error(session, "read_file", sandbox_id=sid, path="/tmp/big")
            too_big = "a" * ((1 << 20) + 1)
            assert (await _error(session, "write_file", sandbox_id=sid, path="/tmp/w", content=too_big)).startswith(
                "write_file: content"
            )
            encoded = base64.b64encode(b"a" * ((1 << 20) + 1)).decode()
            text = await _error(
                session, "write_file", sandbox_id=sid, path="/tmp/w", content=encoded, encoding="base64"
            )
            assert text.startswith("write_file: content")
            ran = await _call(session, "run_command", sandbox_id=sid, command="test -e /tmp/w || echo absent")
            assert ran["stdout"] == "absent\n"

    asyncio.run(scenario())


def test_sandboxes_per_session_are_capped():
    async def scenario() -> None:
        async with _stdio("--max-sandboxes", "2") as session:
            await _call(session, "create_sandbox")
            await _call(session, "create_sandbox")
            assert "--max-sandboxes" in await _error(session, "create_sandbox")

    asyncio.run(scenario())


def test_rollback_restores_files_ends_processes_and_drops_newer_checkpoints(_state_dir):
    async def scenario() -> None:
        async with _stdio() as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "run_command", sandbox_id=sid, command="echo v1 > s; mkdir d; ln -s s d/l")
            await _call(session, "run_command", sandbox_id=sid, command="sleep 1000 >/dev/null 2>&1 &")
            first = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
            await _call(session, "run_command", sandbox_id=sid, command="echo v2 > s; rm -r d; touch new")
            second = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
            await _call(session, "run_command", sandbox_id=sid, command="echo v3 > s")
            third = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
            assert len({first, second, third}) == 3
            [info] = (await _call(session, "list_sandboxes"))["sandboxes"]
            assert info["checkpoints"] == [first, second, third]

            back = await _call(session, "rollback", sandbox_id=sid, checkpoint_id=second)
            assert back["dropped"] == [third]
            ran = await _call(session, "run_command", sandbox_id=sid, command="cat s; ls; pgrep -c sleep")
            assert ran["stdout"] == "v2\nnew\ns\n0\n", ran  # the sleep of before the checkpoints is gone

            back = await _call(session, "rollback", sandbox_id=sid, checkpoint_id=first)
            assert back["dropped"] == [second]
            ran = await _call(
                session, "run_command", sandbox_id=sid, command="cat s; readlink d/l; test -e new || echo absent"
            )
            assert ran["stdout"] == "v1\ns\nabsent\n", ran
            for gone in (second, third):
                text = await _error(session, "rollback", sandbox_id=sid, checkpoint_id=gone)
                assert text.startswith("rollback: checkpoint_id: no checkpoint"), text
            [info] = (await _call(session, "list_sandboxes"))["sandboxes"]
            assert (info["sandbox_id"], info["checkpoints"]) == (sid, [first])  # the id outlives the rollback

            await _call(session, "run_command", sandbox_id=sid, command="echo v4 > s")  # again to the same one
            await _call(session, "rollback", sandbox_id=sid, checkpoint_id=first)
            assert (await _call(session, "read_file", sandbox_id=sid, path="s"))["content"] == "v1\n"

    asyncio.run(scenario())
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "the sandbox and its checkpoints to go", 30)


def test_checkpoints_are_bounded_per_sandbox_and_freed_with_it(_state_dir):
    async def scenario() -> None:
        async with _stdio("--max-checkpoints", "2") as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "write_file", sandbox_id=sid, path="f", content="x")
            kept = [(await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"] for _ in range(2)]
            assert _layers(_state_dir) == 2
            text = await _error(session, "checkpoint", sandbox_id=sid)
            assert text.startswith("checkpoint: sandbox_id:") and "--max-checkpoints" in text, text
            assert "drop_checkpoint" in text, text
            assert _layers(_state_dir) == 2  # the refusal cut nothing
            other = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "checkpoint", sandbox_id=other)  # the bound is per sandbox

            await _call(session, "drop_checkpoint", sandbox_id=sid, checkpoint_id=kept[0])
            assert _layers(_state_dir) == 2  # kept[0]'s layer is gone, other's is new
            text = await _error(session, "drop_checkpoint", sandbox_id=sid, checkpoint_id=kept[0])
            assert text.startswith("drop_checkpoint: checkpoint_id: no checkpoint"), text
            kept.append((await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"])

            await _call(session, "kill_sandbox", sandbox_id=sid)
            assert _layers(_state_dir) == 1  # other's checkpoint only
            text = await _error(session, "rollback", sandbox_id=sid, checkpoint_id=kept[-1])
            assert text.startswith("rollback: sandbox_id: no sandbox"), text

    asyncio.run(scenario())
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "the session's sandboxes and checkpoints to go", 30)


@pytest.mark.slow
def test_a_checkpoint_given_up_on_or_killed_under_is_held_or_freed_never_lost(_state_dir):
    """A client that cancels a checkpoint mid-copy still has it (listed, counted, freed with its
    sandbox); a kill during one waits for it and removes it with the sandbox."""

    async def scenario() -> None:
        async with _stdio("--max-checkpoints", "1") as session:
            many = "mkdir m; for i in $(seq 2000); do echo $i > m/$i; done"
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "run_command", sandbox_id=sid, command=many)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(session.call_tool("checkpoint", {"sandbox_id": sid}), 0.05)
            during = await _call(session, "run_command", sandbox_id=sid, command="echo during")
            assert during["stdout"] == "during\n"  # waits for the cut: not told to resume what it never paused

            async def listed() -> list[str]:
                [info] = (await _call(session, "list_sandboxes"))["sandboxes"]
                return list(info["checkpoints"])

            for _ in range(1200):  # the copy goes on after the cancel: minutes on a loaded machine
                if await listed():
                    break
                await asyncio.sleep(0.25)
            [kept] = await listed()
            assert _layers(_state_dir) == 1
            assert "--max-checkpoints" in await _error(session, "checkpoint", sandbox_id=sid)
            await _call(session, "rollback", sandbox_id=sid, checkpoint_id=kept)
            ran = await _call(session, "run_command", sandbox_id=sid, command="ls m | wc -l")
            assert ran["stdout"] == "2000\n"
            await _call(session, "kill_sandbox", sandbox_id=sid)
            assert _layers(_state_dir) == 0

            other = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "run_command", sandbox_id=other, command=many)
            cut = asyncio.ensure_future(session.call_tool("checkpoint", {"sandbox_id": other}))
            await asyncio.sleep(0.05)
            assert (await _call(session, "kill_sandbox", sandbox_id=other))["killed"] is True
            await cut  # taken before the kill, or refused: either way not left behind
            assert (await _call(session, "list_sandboxes"))["sandboxes"] == []
            assert _layers(_state_dir) == 0

    asyncio.run(scenario())
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "every sandbox and layer to go", 30)


def test_branching_refusals_name_the_tool_and_field():
    async def scenario() -> None:
        async with _stdio() as session:
            one = (await _call(session, "create_sandbox"))["sandbox_id"]
            two = (await _call(session, "create_sandbox"))["sandbox_id"]
            cp = (await _call(session, "checkpoint", sandbox_id=one))["checkpoint_id"]
            for tool, arguments, field in [
                ("checkpoint", {"sandbox_id": "nope"}, "sandbox_id"),
                ("rollback", {"sandbox_id": "nope", "checkpoint_id": cp}, "sandbox_id"),
                ("rollback", {"sandbox_id": one, "checkpoint_id": "cp-00000000"}, "checkpoint_id"),
                ("rollback", {"sandbox_id": one, "checkpoint_id": "x" * 10000}, "checkpoint_id"),
                ("rollback", {"sandbox_id": two, "checkpoint_id": cp}, "checkpoint_id"),  # of another sandbox
                ("rollback", {"sandbox_id": one}, "checkpoint_id"),
                ("drop_checkpoint", {"sandbox_id": two, "checkpoint_id": cp}, "checkpoint_id"),
                ("drop_checkpoint", {"sandbox_id": "nope", "checkpoint_id": cp}, "sandbox_id"),
                ("fork_sandbox", {"sandbox_id": "nope"}, "sandbox_id"),
                ("fork_sandbox", {"sandbox_id": one, "count": 0}, "count"),
                ("fork_sandbox", {"sandbox_id": one, "count": -3}, "count"),
                ("fork_sandbox", {"sandbox_id": one, "count": "many"}, "count"),
                ("fork_sandbox", {"sandbox_id": one, "count": 10**12}, "count"),
                ("pause_sandbox", {"sandbox_id": "nope"}, "sandbox_id"),
                ("resume_sandbox", {"sandbox_id": "nope"}, "sandbox_id"),
            ]:
                text = await _error(session, tool, **arguments)
                assert text.startswith(f"{tool}: {field}"), text
                assert "e.g." in text or "list_sandboxes" in text, text
                assert len(text) < 400, text  # an id sent is shown cut short
            text = await _error(session, "rollback", sandbox_id=two, checkpoint_id=cp)
            assert f"checkpoint of sandbox {one!r}" in text, text
            assert (await _call(session, "rollback", sandbox_id=one, checkpoint_id=cp))["dropped"] == []
            assert len((await _call(session, "list_sandboxes"))["sandboxes"]) == 2  # no refusal made one

    asyncio.run(scenario())


def test_fork_makes_separate_sandboxes_counted_in_the_session(_state_dir):
    async def scenario() -> None:
        async with _stdio("--max-sandboxes", "4") as session:
            parent = await _call(session, "create_sandbox")
            sid = parent["sandbox_id"]
            await _call(session, "run_command", sandbox_id=sid, command="echo base > s; sleep 1000 >/dev/null 2>&1 &")
            cp = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
            forked = await _call(session, "fork_sandbox", sandbox_id=sid, count=2)
            assert forked["sandbox_id"] == sid
            kids = forked["sandbox_ids"]
            assert len(set(kids) | {sid}) == 3
            listed = {s["sandbox_id"]: s for s in (await _call(session, "list_sandboxes"))["sandboxes"]}
            assert set(listed) == {sid, *kids}
            for kid in kids:
                assert (listed[kid]["template"], listed[kid]["network"]) == (parent["template"], parent["network"])
                assert listed[kid]["checkpoints"] == []  # the parent's stay its own
                ran = await _call(session, "run_command", sandbox_id=kid, command="cat s; pgrep -c sleep")
                assert ran["stdout"] == "base\n0\n", ran  # the files, not the processes
            await _call(session, "write_file", sandbox_id=kids[0], path="s", content="mine\n")
            for other in (sid, kids[1]):
                assert (await _call(session, "read_file", sandbox_id=other, path="s"))["content"] == "base\n"
            assert await _pid_ns(session, kids[0]) != await _pid_ns(session, kids[1])
            text = await _error(session, "rollback", sandbox_id=kids[0], checkpoint_id=cp)
            assert text.startswith("rollback: checkpoint_id:") and "checkpoint of sandbox" in text, text

            # three held of four: room for one more, counted before the fork
            text = await _error(session, "fork_sandbox", sandbox_id=sid, count=2)
            assert text.startswith("fork_sandbox: count:") and "--max-sandboxes" in text, text
            assert "count=1" in text, text
            assert len((await _call(session, "list_sandboxes"))["sandboxes"]) == 3
            one, two = await asyncio.gather(
                session.call_tool("fork_sandbox", {"sandbox_id": kids[0], "count": 1}),
                session.call_tool("fork_sandbox", {"sandbox_id": kids[1], "count": 1}),
            )
            assert sorted([one.is_error, two.is_error]) == [False, True], (one, two)
            assert len((await _call(session, "list_sandboxes"))["sandboxes"]) == 4
            assert "--max-sandboxes" in await _error(session, "create_sandbox")

            # a child is closed on its own; a fork of a fork reads what its parent wrote
            await _call(session, "kill_sandbox", sandbox_id=sid)
            [grandchild] = (await _call(session, "fork_sandbox", sandbox_id=kids[0]))["sandbox_ids"]
            assert (await _call(session, "read_file", sandbox_id=grandchild, path="s"))["content"] == "mine\n"

    asyncio.run(scenario())
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "every sandbox and layer to go", 30)


def test_a_paused_sandbox_refuses_its_tools_naming_resume_sandbox():
    async def scenario() -> None:
        async with _stdio() as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "write_file", sandbox_id=sid, path="s", content="before")
            await _call(session, "run_command", sandbox_id=sid, command="sleep 1000 >/dev/null 2>&1 &")
            assert (await _call(session, "pause_sandbox", sandbox_id=sid))["paused"] is True
            assert (await _call(session, "pause_sandbox", sandbox_id=sid))["paused"] is True  # again: no change
            [info] = (await _call(session, "list_sandboxes"))["sandboxes"]
            assert info["paused"] is True
            for tool, extra in [
                ("run_command", {"command": "true"}),
                ("read_file", {"path": "s"}),
                ("write_file", {"path": "s", "content": "during"}),
            ]:
                text = await _error(session, tool, sandbox_id=sid, **extra)
                assert text.startswith(f"{tool}: sandbox_id:") and f"resume_sandbox(sandbox_id={sid!r})" in text, text
            # what a paused sandbox still does: a checkpoint of it, which leaves it paused, and a fork
            cp = (await _call(session, "checkpoint", sandbox_id=sid))["checkpoint_id"]
            [kid] = (await _call(session, "fork_sandbox", sandbox_id=sid))["sandbox_ids"]
            assert (await _call(session, "read_file", sandbox_id=kid, path="s"))["content"] == "before"
            assert "resume_sandbox" in await _error(session, "run_command", sandbox_id=sid, command="true")

            assert (await _call(session, "resume_sandbox", sandbox_id=sid))["paused"] is False
            assert (await _call(session, "resume_sandbox", sandbox_id=sid))["paused"] is False
            ran = await _call(session, "run_command", sandbox_id=sid, command="cat s; echo; pgrep -cx sleep")
            assert ran["stdout"] == "before\n1\n", ran  # its processes were kept
            await _call(session, "pause_sandbox", sandbox_id=sid)
            await _call(session, "rollback", sandbox_id=sid, checkpoint_id=cp)  # a fresh jail: running
            [info] = [s for s in (await _call(session, "list_sandboxes"))["sandboxes"] if s["sandbox_id"] == sid]
            assert info["paused"] is False
            assert (await _call(session, "read_file", sandbox_id=sid, path="s"))["content"] == "before"

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_snapshot_outlives_its_session_and_server_and_starts_sandboxes(_state_dir, shelf, tmp_path):
    """Taken over stdio, listed, started from and deleted over HTTP by another server."""

    async def take() -> dict[str, Any]:
        async with _stdio() as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            await _call(session, "run_command", sandbox_id=sid, command="echo kept > s; mkdir d; ln -s ../s d/l")
            await _call(session, "run_command", sandbox_id=sid, command="sleep 1000 >/dev/null 2>&1 &")
            snap = await _call(session, "snapshot_sandbox", sandbox_id=sid, name="ready")
            assert SNAP_ID.fullmatch(snap["id"]), snap
            assert (snap["name"], snap["image"], snap["source"]) == ("ready", "host", sid)
            assert snap["size"] > 0 and snap["created"].endswith("+00:00"), snap
            ran = await _call(session, "run_command", sandbox_id=sid, command="cat s; pgrep -cx sleep")
            assert ran["stdout"] == "kept\n1\n"  # the sandbox taken goes on as it was
            return snap

    snap = asyncio.run(take())
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "the stdio server's sandbox to go", 30)
    server = HttpServer(tmp_path / "config")

    async def use() -> None:
        async with _http(server.url, server.token) as session:
            assert (await _call(session, "list_snapshots")) == {"snapshots": [snap], "left_out": 0}
            for ref in ("ready", snap["id"]):
                made = await _call(session, "create_sandbox", snapshot=ref)
                assert (made["template"], made["snapshot"]) == ("host", snap["id"])
                sid = made["sandbox_id"]
                ran = await _call(session, "run_command", sandbox_id=sid, command="cat d/l; pgrep -cx sleep")
                assert ran["stdout"] == "kept\n0\n", ran  # its files, none of its processes
                await _call(session, "write_file", sandbox_id=sid, path="s", content="mine")
            second = await _call(session, "snapshot_sandbox", sandbox_id=sid)  # of a sandbox started from one
            assert second["name"] is None and second["id"] != snap["id"]
            later = (await _call(session, "create_sandbox", snapshot=second["id"]))["sandbox_id"]
            assert (await _call(session, "read_file", sandbox_id=later, path="d/l"))["content"] == "mine"
            text = await _error(session, "delete_snapshot", ref="ready")
            assert text.startswith("delete_snapshot: ref:") and "in use" in text, text
            for s in (await _call(session, "list_sandboxes"))["sandboxes"]:
                await _call(session, "kill_sandbox", sandbox_id=s["sandbox_id"])
            assert await _call(session, "delete_snapshot", ref="ready") == snap
            assert (await _call(session, "list_snapshots")) == {"snapshots": [second], "left_out": 0}
            await _call(session, "delete_snapshot", ref=second["id"])
            text = await _error(session, "delete_snapshot", ref=snap["id"])
            assert text.startswith("delete_snapshot: ref: no snapshot"), text
            text = await _error(session, "create_sandbox", snapshot="ready")
            assert text.startswith("create_sandbox: snapshot: no snapshot"), text

    try:
        asyncio.run(use())
    finally:
        assert server.stop() == 0
    assert _sandbox_dirs(_state_dir) == []
    assert snapshots.list() == []


def test_snapshots_are_bounded_in_the_store_and_refusals_name_the_field(shelf, mini_rootfs):
    with Sandbox(rootfs=str(mini_rootfs)) as sb:  # a snapshot over a directory, as the library may take one
        over_a_dir = sb.snapshot(name="over-a-dir").id

    async def scenario() -> None:
        async with _stdio("--max-snapshots", "2") as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            for tool, arguments, field in [
                ("snapshot_sandbox", {"sandbox_id": "nope"}, "sandbox_id"),
                ("snapshot_sandbox", {"sandbox_id": sid, "name": "has space"}, "name"),
                ("snapshot_sandbox", {"sandbox_id": sid, "name": "../up"}, "name"),
                ("snapshot_sandbox", {"sandbox_id": sid, "name": "x" * 129}, "name"),
                ("snapshot_sandbox", {"sandbox_id": sid, "name": "snap-0123456789ab"}, "name"),  # an id's form
                ("create_sandbox", {"snapshot": "no-such"}, "snapshot"),
                ("create_sandbox", {"snapshot": "/etc"}, "snapshot"),
                ("create_sandbox", {"snapshot": "x" * 10000}, "snapshot"),
                ("create_sandbox", {"snapshot": over_a_dir}, "snapshot"),  # made over a host directory
                ("delete_snapshot", {"ref": "no-such"}, "ref"),
                ("delete_snapshot", {"ref": "../../x"}, "ref"),
                ("delete_snapshot", {}, "ref"),
            ]:
                text = await _error(session, tool, **arguments)
                assert text.startswith(f"{tool}: {field}"), text
                assert "e.g." in text or "list_sandboxes" in text, text
                assert len(text) < 400, text

            # the store holds one (over_a_dir): room for one more, taken by one of two at once
            other = (await _call(session, "create_sandbox"))["sandbox_id"]
            one, two = await asyncio.gather(
                session.call_tool("snapshot_sandbox", {"sandbox_id": sid, "name": "a"}),
                session.call_tool("snapshot_sandbox", {"sandbox_id": other, "name": "b"}),
            )
            assert sorted([one.is_error, two.is_error]) == [False, True], (one, two)
            refused = (one if one.is_error else two).content[0].text
            assert refused.startswith("snapshot_sandbox:") and "--max-snapshots" in refused, refused
            assert len(snapshots.list()) == 2
            made = (one if two.is_error else two).structured_content
            assert made is not None
            text = await _error(session, "create_sandbox", snapshot=made["id"], template="default")
            assert text.startswith("create_sandbox: template:"), text
            await _call(session, "delete_snapshot", ref=over_a_dir)
            again = await _call(session, "snapshot_sandbox", sandbox_id=sid, name=made["name"])  # the name moves
            listed = (await _call(session, "list_snapshots"))["snapshots"]
            assert [(s["id"], s["name"]) for s in listed] == [(again["id"], made["name"]), (made["id"], None)]

    asyncio.run(scenario())


@pytest.mark.slow
def test_stdio_client_going_away_ends_its_sandboxes(_state_dir):
    """Two ways a stdio client goes: it closes the session (pipe closed), or it is killed mid-command."""
    namespaces: list[str] = []
    held = ExitStack()

    async def closes() -> None:
        async with _stdio() as session:
            for _ in range(2):
                sid = (await _call(session, "create_sandbox"))["sandbox_id"]
                await _call(session, "run_command", sandbox_id=sid, command="sleep 1000 >/dev/null 2>&1 &")
                namespaces.append(await _pid_ns(session, sid))
                held.enter_context(pid_namespace_held(namespaces[-1]))
            assert len(_sandbox_dirs(_state_dir)) == 2

    with held:
        asyncio.run(closes())
        for ns in namespaces:
            wait_until(lambda ns=ns: jail_processes(ns) == [], f"the jail in {ns} to end", 30)
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "every sandbox directory to go", 30)

    async def cancelled_mid_command() -> None:
        async with _stdio() as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            namespaces.append(await _pid_ns(session, sid))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(2):
                    await session.call_tool("run_command", {"sandbox_id": sid, "command": "sleep 1000"})

    asyncio.run(cancelled_mid_command())
    wait_until(lambda: jail_processes(namespaces[-1]) == [], "the cancelled command's jail to end", 30)
    wait_until(lambda: _sandbox_dirs(_state_dir) == [], "every sandbox directory to go", 30)


def _rpc(proc: subprocess.Popen[str], message: dict[str, Any]) -> dict[str, Any] | None:
    """One JSON-RPC line to a stdio server; its answer, for a request."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    proc.stdin.flush()
    if "id" not in message:
        return None
    while True:
        answer = json.loads(proc.stdout.readline())
        if answer.get("id") == message["id"]:
            return answer


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stdio_server_stopped_by_a_signal_ends_its_sandboxes(_state_dir, sig):
    """The client still connected, the server is told to stop: it closes every sandbox, then dies of the signal."""
    proc = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        assert "result" in (_rpc(proc, {"id": 1, "method": "initialize", "params": hello}) or {})
        _rpc(proc, {"method": "notifications/initialized"})
        for n in (2, 3):
            made = _rpc(proc, {"id": n, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}})
            assert made is not None and not made["result"].get("isError"), made
        assert len(_sandbox_dirs(_state_dir)) == 2
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == -sig
        assert _sandbox_dirs(_state_dir) == []  # closed before it died, not by the launcher afterwards
    finally:
        proc.kill()
        proc.wait()


async def _two_sessions(server: HttpServer, state: Path, sig: int, held: ExitStack) -> str:
    """A keeper session and another: the other cannot see or touch the keeper's sandbox, and ending
    it ends its own sandbox only; then the server is stopped with ``sig``, the keeper still open.
    The keeper's pid namespace is held in ``held``."""
    async with _http(server.url, server.token) as keeper:
        kept_id = (await _call(keeper, "create_sandbox"))["sandbox_id"]
        await _call(keeper, "run_command", sandbox_id=kept_id, command="sleep 1000 >/dev/null 2>&1 &")
        kept_ns = await _pid_ns(keeper, kept_id)
        held.enter_context(pid_namespace_held(kept_ns))
        kept_cp = (await _call(keeper, "checkpoint", sandbox_id=kept_id))["checkpoint_id"]
        async with _http(server.url, server.token) as other:
            assert (await _call(other, "list_sandboxes"))["sandboxes"] == []
            for tool, extra in [
                ("run_command", {"command": "id"}),
                ("read_file", {"path": "/etc/hostname"}),
                ("checkpoint", {}),
                ("rollback", {"checkpoint_id": kept_cp}),
                ("drop_checkpoint", {"checkpoint_id": kept_cp}),
                ("fork_sandbox", {"count": 1}),
                ("pause_sandbox", {}),
                ("resume_sandbox", {}),
            ]:
                assert "no sandbox" in await _error(other, tool, sandbox_id=kept_id, **extra)
            assert "no sandbox" in await _error(other, "kill_sandbox", sandbox_id=kept_id)
            gone_ns = await _pid_ns(other, (await _call(other, "create_sandbox"))["sandbox_id"])
        wait_until(lambda: jail_processes(gone_ns) == [], "the killed session's jail to end", 30)
        wait_until(lambda: len(_sandbox_dirs(state)) == 2, "one sandbox and its checkpoint left", 30)
        alive = await _call(keeper, "run_command", sandbox_id=kept_id, command="echo alive")
        assert alive["stdout"] == "alive\n"
        assert server.stop(sig) == 0  # with the keeper's session still open
        assert _sandbox_dirs(state) == []  # closed before it exited, not by the launcher afterwards
    return kept_ns


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_http_sessions_own_their_sandboxes_and_end_them(_state_dir, tmp_path, sig):
    """Over HTTP: a sandbox is invisible to another session; ending a session (the client's DELETE)
    ends its sandboxes and no other's; stopping the server ends the rest."""
    server = HttpServer(tmp_path / "config")
    with ExitStack() as held:
        try:
            kept_ns = asyncio.run(_two_sessions(server, _state_dir, sig, held))
        finally:
            if server.proc.returncode is None:
                server.stop(signal.SIGKILL)
        wait_until(lambda: jail_processes(kept_ns) == [], "the kept jail to end", 30)
    assert _sandbox_dirs(_state_dir) == []


@pytest.mark.slow
def test_http_client_that_goes_without_ending_its_session_loses_its_sandboxes_when_idle(_state_dir, tmp_path):
    """A client that vanishes (no DELETE) loses its sandboxes once its session is idle; one whose
    command outlasts the idle time keeps its own."""
    server = HttpServer(tmp_path / "config", "--idle-timeout", "2")

    async def vanish() -> str:
        async with (
            httpx2.AsyncClient(headers=_bearer(server.token), timeout=60) as client,
            streamable_http_client(server.url, http_client=client, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await _pid_ns(session, (await _call(session, "create_sandbox"))["sandbox_id"])

    async def busy() -> None:
        async with _http(server.url, server.token) as session:
            sid = (await _call(session, "create_sandbox"))["sandbox_id"]
            slow = await _call(session, "run_command", sandbox_id=sid, command="sleep 5; echo done", timeout=30)
            assert slow["stdout"] == "done\n"  # a command in flight is not idleness
            assert (await _call(session, "run_command", sandbox_id=sid, command="echo still"))["stdout"] == "still\n"

    try:
        ns = asyncio.run(vanish())
        wait_until(lambda: jail_processes(ns) == [], "the jail to end", 30)
        wait_until(lambda: _sandbox_dirs(_state_dir) == [], "every sandbox directory to go", 30)
        asyncio.run(busy())
    finally:
        assert server.stop() == 0
    assert _sandbox_dirs(_state_dir) == []


def _hello(url: str, headers: dict[str, str]) -> int:
    """The status a session's first request gets, sent with ``headers``."""
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    return httpx2.post(url, content=json.dumps(hello), headers={**accept, **headers}, timeout=60).status_code


def _private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.mark.slow
def test_http_needs_a_token_even_on_loopback_and_checks_it(tmp_path):
    """On loopback too (any local user can connect there): no token, a wrong one, one of another file
    (another server's, jailbox serve's key beside it) or the right one sent otherwise are refused."""
    config = tmp_path / "config"
    other = _private(tmp_path / "other-token", "jbx_" + "o" * 40 + "\n")
    serve_key = "jbx_" + "s" * 40
    server = HttpServer(config)
    try:
        token = server.token
        assert token is not None
        _private(config / "jailbox" / "serve-api-keys", serve_key + "\n")
        for headers in [
            {},
            {"Authorization": "Bearer"},
            {"Authorization": "Bearer wrong-but-long-enough"},
            {"Authorization": token},
            {"Authorization": f"Basic {token}"},
            {"Authorization": f"Bearer  {token}"},
            {"Authorization": f"Bearer {token}x"},
            {"Authorization": f"Bearer {token[:-1]}"},
            {"Authorization": f"Bearer {token} {token}"},
            _bearer(other.read_text().strip()),
            _bearer(serve_key),
        ]:
            assert _hello(server.url, headers) == 401, headers
        assert _hello(server.url, _bearer(token)) == 200

        async def scenario() -> None:
            async with _http(server.url, token) as session:
                sid = (await _call(session, "create_sandbox"))["sandbox_id"]
                assert (await _call(session, "run_command", sandbox_id=sid, command="echo ok"))["stdout"] == "ok\n"

        asyncio.run(scenario())
    finally:
        assert server.stop() == 0
    given = HttpServer(config, "--token-file", str(other))  # its file's tokens, not the default file's
    try:
        assert _hello(given.url, _bearer(token)) == 401
        assert _hello(given.url, _bearer(other.read_text().strip())) == 200
    finally:
        assert given.stop() == 0


@pytest.mark.slow
def test_first_start_makes_a_private_token_and_shows_it_once(tmp_path):
    config = tmp_path / "config"
    first = HttpServer(config)
    assert first.stop() == 0
    path = config / "jailbox" / "mcp-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert first.token is not None and f"{path} (shown only now): {first.token}" in "".join(first.log)
    entry = json.loads(first.log[-2].split("client config: ", 1)[1])
    assert entry == {
        "mcpServers": {"jailbox": {"url": first.url, "headers": {"Authorization": f"Bearer {first.token}"}}}
    }
    second = HttpServer(config)
    try:
        assert second.token == first.token and first.token not in "".join(second.log)
        assert f"<a token from {path}>" in second.log[-2]
        assert _hello(second.url, _bearer(second.token)) == 200
    finally:
        assert second.stop() == 0
    busy = tmp_path / "busy"  # a first start that cannot listen still shows the token it made
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        argv = [*SERVER, "--http", "--port", str(held.getsockname()[1])]
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(busy)}
        )
    made = busy / "jailbox" / "mcp-token"
    assert r.returncode == 2 and f"{made} (shown only now): {made.read_text().strip()}\n" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_token_file_must_be_private_and_hold_tokens(tmp_path):
    config = tmp_path / "config"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config)}

    def refused(*flags: str) -> str:
        r = subprocess.run([*SERVER, *flags], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode != 0 and "streamable HTTP" not in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    assert HttpServer(config).stop() == 0  # makes the default file
    default = config / "jailbox" / "mcp-token"
    given = _private(tmp_path / "token", "jbx_" + "g" * 40 + "\n")
    for mode in (0o644, 0o640, 0o604):
        default.chmod(mode)
        assert f"--token-file {default}: " in refused("--http", "--port", "0") and "chmod 600" in refused("--http")
        given.chmod(mode)
        assert "chmod 600" in refused("--http", "--port", "0", "--token-file", str(given))
    given.chmod(0o600)
    (tmp_path / "link").symlink_to(given)
    assert "--token-file" in refused("--http", "--port", "0", "--token-file", str(tmp_path / "link"))
    for text in ("short\n", "", "\n\n"):
        weak = _private(tmp_path / "weak", text)
        assert "--token-file" in refused("--http", "--port", "0", "--token-file", str(weak))
    absent = tmp_path / "absent"
    assert refused("--http", "--port", "0", "--token-file", str(absent)).startswith(f"jailbox: --token-file {absent}: ")
    assert refused("--port", "9").startswith("jailbox: --http:")  # stdio takes no HTTP flags
    assert refused("--token-file", str(given)).startswith("jailbox: --http:")


ATTACKER = """
import json, sys, urllib.error, urllib.request
url, token_file = sys.argv[1:]
try:
    open(token_file).read()
    print("read the token")
except OSError as exc:
    print(type(exc).__name__)
hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}}
headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
request = urllib.request.Request(url, data=json.dumps(hello).encode(), headers=headers)
try:
    print(urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


@pytest.mark.root
def test_another_local_user_cannot_use_the_server_or_read_its_token(tmp_path):
    """Another local user, on the loopback the server listens on: it can neither read the token (its
    directory is 0700, the file 0600) nor start a session without it."""
    require(
        all(shutil.which(tool) for tool in ("useradd", "userdel", "runuser")),
        "useradd, userdel and runuser, to add a second local user to attack from",
        "sudo apt-get install passwd util-linux",
    )
    user = f"jbxmcp{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)
    home = Path(tempfile.mkdtemp(prefix="jailbox-mcp-"))  # one the other user may pass through
    server = None
    try:
        config = home / "config"
        config.mkdir()
        for step in (home, config):
            step.chmod(0o755)
        server = HttpServer(config)
        path = config / "jailbox" / "mcp-token"

        def attack() -> list[str]:
            argv = ["runuser", "-u", user, "--", "/usr/bin/python3", "-I", "-c", ATTACKER, server.url, str(path)]
            return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/").stdout.split()

        assert attack() == ["PermissionError", "401"]
        path.parent.chmod(0o711)  # past the directory: the file itself is private
        assert attack() == ["PermissionError", "401"]
        assert _hello(server.url, _bearer(server.token)) == 200  # its own user's client still gets in
    finally:
        if server is not None:
            assert server.stop() == 0
        subprocess.run(["userdel", user], check=True)
        shutil.rmtree(home)


def test_dns_rebinding_is_refused_on_loopback(tmp_path):
    server = HttpServer(tmp_path / "config")
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        accept = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **_bearer(server.token),  # a page that had the token would still be turned away
        }
        for headers in [{"Host": "evil.example"}, {"Origin": "http://evil.example"}]:
            response = httpx2.post(server.url, content=json.dumps(hello), headers={**accept, **headers})
            assert response.status_code in (403, 421), (headers, response.status_code)
    finally:
        assert server.stop() == 0
