"""``jailbox openenv``: OpenEnv's own client (openenv-core's ``GenericEnvClient``, unmodified) runs episodes
against ``jailbox openenv`` started as a subprocess; a raw ``websockets`` client sends what a hostile peer
would (a wrong token, oversize and malformed messages, steps out of turn, episodes past the caps, a
connection dropped mid-step, one gone idle). After each, the server's live sandboxes (its ``health``), the
sandboxes' directories and the jails' processes on the host are counted: none is left."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from conftest import require
from support.cli import JAILBOX
from support.waits import wait_until
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from jailbox import snapshots
from jailbox.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
CI_INSTALL = re.search(r'^OPENENV_CLIENT_INSTALL="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def need_client() -> None:
    """The unmodified client, installed as CI installs it (the fix names .ci/run's own command)."""
    assert CI_INSTALL, ".ci/run no longer sets OPENENV_CLIENT_INSTALL"
    fix = CI_INSTALL.group(1).replace(".venv/bin/pip", "pip")
    require(importlib.util.find_spec("openenv") is not None, "openenv-core's GenericEnvClient", fix)


class Server:
    """``jailbox openenv --port 0`` with ``config`` as its user's config directory: ``base`` is the URL a
    client is given (``http://127.0.0.1:PORT/TOKEN``), ``log`` what it printed on starting."""

    def __init__(self, config: Path, *flags: str) -> None:
        env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
        self.proc = subprocess.Popen(
            [*JAILBOX, "openenv", "--port", "0", *flags], stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stderr is not None
        self.log: list[str] = []
        while not self.log or "serving at" not in self.log[-1]:
            self.log.append(self.proc.stderr.readline())
            assert self.log[-1], self.log  # it exited
        found = re.search(r"serving at (http://\S+)/$", self.log[-1].strip())
        assert found, self.log
        self.url = found.group(1)
        self.token = (config / "jailbox" / "openenv-token").read_text().strip()
        self.base = f"{self.url}/{self.token}"
        self.ws = self.base.replace("http://", "ws://") + "/ws"

    def health(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.base}/health", timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Its exit status; what it printed after starting is then in ``log`` too."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=90)
        finally:
            self.proc.kill()
            self.proc.wait()
            assert self.proc.stderr is not None
            self.log.append(self.proc.stderr.read())
            self.proc.stderr.close()


@pytest.fixture
def serve(tmp_path: Path, _state_dir: Path) -> Iterator[Callable[..., Server]]:
    """Starts a server with the flags given; each is stopped after the test, which it must survive."""
    started: list[Server] = []

    def start(*flags: str) -> Server:
        started.append(Server(tmp_path / f"config-{len(started)}", *flags))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            assert server.stop() == 0
    assert _sandbox_dirs(_state_dir) == []


def _sandbox_dirs(state: Path) -> list[str]:
    top = state / "sandboxes"
    return sorted(p.name for p in top.iterdir()) if top.is_dir() else []


Jail = list[psutil.Process]  # a jail's processes on the host, taken while it lived (its init among them)


def _ended(jail: Jail) -> bool:
    """Whether every process of ``jail`` is gone (``is_running`` knows a reused pid from its own: a pid
    namespace's id may be reused at once, so a jail is held by its processes, not by that id)."""
    return not any(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE for proc in jail)


def _nothing_left(server: Server, state: Path, jails: list[Jail]) -> None:
    """No live episode in the server, no sandbox directory, no process of the given jails on the host."""
    wait_until(lambda: server.health()["episodes"] == 0, lambda: f"no live episode: {server.health()}", 30)
    wait_until(lambda: _sandbox_dirs(state) == [], lambda: f"no sandbox left: {_sandbox_dirs(state)}", 30)
    for jail in jails:
        wait_until(lambda jail=jail: _ended(jail), f"the jail of {jail} to end", 30)


@asynccontextmanager
async def _peer(server: Server, **kw: Any) -> AsyncIterator[ClientConnection]:
    async with connect(server.ws, open_timeout=30, max_size=None, **kw) as ws:
        yield ws


async def _ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    await ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    answer = json.loads(await asyncio.wait_for(ws.recv(), 120))
    assert set(answer) == {"type", "data"}, answer
    return answer


async def _refused(ws: ClientConnection, message: Any, code: str, *said: str) -> str:
    answer = await _ask(ws, message)
    assert answer["type"] == "error" and answer["data"]["code"] == code, (message, answer)
    text = answer["data"]["message"]
    assert "\n" not in text and "Traceback" not in text and all(s in text for s in said), (message, text)
    return text


async def _step(ws: ClientConnection, **action: Any) -> dict[str, Any]:
    answer = await _ask(ws, {"type": "step", "data": action})
    assert answer["type"] == "observation", answer
    return answer["data"]


def _is_init(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a jail's pid 1 (its status, readable for every user's processes, lists its pid in
    each namespace: the last is the jail's)."""
    with contextlib.suppress(OSError):
        return re.search(r"^NSpid:.*\s1$", Path(f"/proc/{proc.pid}/status").read_text(), re.MULTILINE) is not None
    return False


def _found(mark: str, count: int = 1) -> Jail:
    """The host's processes of ``count`` sleeps of ``mark`` seconds (a number no other test uses) and of every
    ancestor up to their jail's init: a jail is found by what runs in it, the same way as root and rootless
    (where its processes belong to subordinate ids and their namespaces cannot be read)."""

    def look() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if proc.info["cmdline"] == ["sleep", mark]:
                found.append(proc)
        return found if len(found) >= count else []

    sleeps = wait_until(look, f"{count} 'sleep {mark}' in the jail", 30)
    jail = list(sleeps)
    here: psutil.Process | None = sleeps[0]
    while here is not None and not _is_init(here):
        here = here.parent()
        if here is not None:
            jail.append(here)
    assert here is not None, f"no init above {sleeps}"
    return jail


def _mark() -> str:
    return f"{86400 + secrets.randbelow(10**6) / 1000:.3f}"


async def _jail(ws: ClientConnection) -> Jail:
    """The jail of ``ws``'s episode, found by a sleep it leaves running there (it ends with the jail)."""
    mark = _mark()
    out = await _step(ws, command=f"sleep {mark} >/dev/null 2>&1 &")
    assert out["observation"]["exit_code"] == 0, out
    return _found(mark)


# --- the client's episode -----------------------------------------------------------------------------


def test_openenvs_own_client_runs_an_episode(serve: Callable[..., Server], _state_dir: Path) -> None:
    """Reset, steps that keep their files in the sandbox, a task's failure, a file written by an action, a
    step's own timeout, the state, then a second reset (a new sandbox) and close: nothing left after."""
    server = serve()
    need_client()
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=server.base).sync() as env:
        first = env.reset()
        assert (first.reward, first.done) == (None, False)
        assert first.observation == {
            **{"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False, "failure": None, "error": None}
        }
        mark = _mark()
        assert env.step({"command": f"sleep {mark} >/dev/null 2>&1 &"}).observation["exit_code"] == 0
        jail = _found(mark)
        assert env.step({"command": "mkdir -p /opt/work && echo 6 > /opt/work/a"}).observation["exit_code"] == 0
        wrote = env.step({"action_type": "write_file", "file_path": "/opt/work/b.py", "content": "print(6 * 7)\n"})
        assert wrote.observation["failure"] is None
        ran = env.step({"command": "cat /opt/work/a && python3 /opt/work/b.py"})
        assert (ran.observation["stdout"], ran.observation["exit_code"], ran.reward, ran.done) == (
            "6\n42\n",
            0,
            None,
            False,
        )
        failed = env.step({"command": "echo no >&2; exit 3"}).observation
        assert (failed["exit_code"], failed["stderr"], failed["failure"]) == (3, "no\n", "task")
        slow = env.step({"command": "sleep 30", "timeout_s": 0.5}).observation
        assert (slow["timed_out"], slow["failure"]) == (True, "task")
        state = env.state()
        assert state["step_count"] == 6 and isinstance(state["episode_id"], str)
        assert server.health()["episodes"] == 1

        again = env.reset(episode_id="ep-2")
        assert again.observation["exit_code"] == 0
        assert env.state() == {"episode_id": "ep-2", "step_count": 0}
        gone = env.step({"command": "cat /opt/work/a"}).observation  # a new sandbox: the old one's files are not here
        assert gone["exit_code"] != 0 and gone["failure"] == "task"
        wait_until(lambda: _ended(jail), "the first episode's jail to end at the second reset", 30)
        assert server.health()["episodes"] == 1
    _nothing_left(server, _state_dir, [jail])


def test_an_evaluate_step_scores_the_sandbox_with_the_reward_command(serve: Callable[..., Server]) -> None:
    """``--reward-command``: an ``evaluate`` step runs it in the sandbox; the client reads reward 1.0 when it
    exits 0, 0.0 otherwise, and ``done``. Every other step's reward stays None."""
    need_client()
    from openenv.core import GenericEnvClient

    server = serve("--reward-command", 'test "$(cat /opt/answer)" = 42')
    with GenericEnvClient(base_url=server.base).sync() as env:
        env.reset()
        wrote = env.step({"action_type": "write_file", "file_path": "/opt/answer", "content": "41"})
        assert (wrote.reward, wrote.done) == (None, False)
        wrong = env.step({"action_type": "evaluate"})
        assert (wrong.reward, wrong.done, wrong.observation["failure"]) == (0.0, True, "task")
        env.step({"command": "echo 42 > /opt/answer"})
        right = env.step({"action_type": "evaluate", "timeout_s": 30})
        assert (right.reward, right.done, right.observation["failure"]) == (1.0, True, None)
        assert env.state()["step_count"] == 4


def test_health_schema_and_metadata_are_served_under_the_token(serve: Callable[..., Server]) -> None:
    server = serve()
    assert server.health() == {"status": "healthy", "episodes": 0, "connections": 0}
    schema = httpx.get(f"{server.base}/schema", timeout=30).json()
    assert set(schema) == {"action", "observation", "state"}
    assert {"command", "action_type", "file_path", "content", "timeout_s"} <= set(schema["action"]["properties"])
    assert {"stdout", "stderr", "exit_code", "failure"} <= set(schema["observation"]["properties"])
    assert set(schema["state"]["properties"]) == {"episode_id", "step_count"}
    meta = httpx.get(f"{server.base}/metadata", timeout=30).json()
    assert meta["name"] == "jailbox" and meta["version"]
    assert httpx.get(f"{server.base}/nothing", timeout=30).status_code == 404


@pytest.mark.slow
def test_every_episode_starts_from_the_snapshot_given(tmp_path: Path, _state_dir: Path, monkeypatch) -> None:
    """``--snapshot``: each reset's sandbox holds the snapshot's files, and none of the previous episode's."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    with Sandbox() as setup:
        setup.write_file("/opt/task/numbers", "6 7\n")
        snap = setup.snapshot("openenv-task").id
    started = Server(tmp_path / "config", "--snapshot", "openenv-task")
    try:

        async def episodes() -> None:
            async with _peer(started) as ws:
                for n in range(2):
                    assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
                    out = (await _step(ws, command="cat /opt/task/numbers; ls /opt/task"))["observation"]
                    assert out["stdout"] == "6 7\nnumbers\n", (n, out)
                    await _step(ws, command="echo scribble > /opt/task/mine")

        asyncio.run(episodes())
        _nothing_left(started, _state_dir, [])
    finally:
        assert started.stop() == 0
        snapshots.remove(snap)
    assert _sandbox_dirs(_state_dir) == []


# --- what a hostile peer sends --------------------------------------------------------------------------


def _status(url: str) -> int:
    async def attempt() -> int:
        try:
            async with connect(url, open_timeout=30):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    return asyncio.run(attempt())


@pytest.mark.slow
def test_a_wrong_token_is_refused_however_it_is_sent(serve: Callable[..., Server], tmp_path: Path) -> None:
    server = serve()
    token, port = server.token, server.url.rsplit(":", 1)[1]
    other = "jbx_" + "o" * 40
    for path in [
        "/ws",
        f"/{token}x/ws",
        f"/{token[:-1]}/ws",
        f"/{token.upper()}/ws",
        f"/x/{token}/ws",
        f"/ws?token={token}",
        f"/{other}/ws",
        f"//{token}/ws",
    ]:
        assert _status(f"ws://127.0.0.1:{port}{path}") == 401, path
        assert httpx.get(f"http://127.0.0.1:{port}{path.replace('/ws', '/health')}", timeout=30).status_code == 401
    assert _status(server.ws) == 101

    async def from_a_page() -> int:  # a browser's page on this host sends its Origin: refused
        try:
            async with connect(server.ws, origin="http://evil.example", open_timeout=30):  # type: ignore[arg-type]
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert asyncio.run(from_a_page()) == 403
    assert server.stop() == 0
    starting = server.log.index(next(line for line in server.log if "serving at" in line))
    assert token not in "".join(server.log[starting:]), server.log  # shown when made; never for a request


@pytest.mark.slow
def test_bad_messages_get_one_line_naming_the_field(serve: Callable[..., Server], _state_dir: Path) -> None:
    """Each is answered with an error naming what is wrong and a valid example; the connection stays
    usable; a message over ``--max-message`` ends the connection (1009) and its sandbox."""
    server = serve("--max-message", "65536")

    async def scenario() -> list[str]:
        async with _peer(server) as ws:
            await _refused(ws, "{not json", "INVALID_JSON", "not JSON", "e.g.")
            await _refused(ws, b"\xff\xfe{}", "INVALID_JSON", "not JSON")
            await _refused(ws, "[1, 2]", "INVALID_JSON", "JSON object", "e.g.")
            await _refused(ws, "[" * 5000 + "]" * 5000, "INVALID_JSON", "nested at most 8 deep")
            await _refused(ws, json.dumps({"type": "step", "data": {"command": "x", "metadata": {"a": [0] * 9000}}}),
                           "INVALID_JSON", "at most 4096 JSON elements")  # fmt: skip
            await _refused(ws, {"type": "launch"}, "UNKNOWN_TYPE", "'launch'", '"reset"')
            await _refused(ws, {"data": {}}, "UNKNOWN_TYPE", "type:")
            await _refused(ws, {"type": "reset", "extra": 1}, "VALIDATION_ERROR", "extra:", "e.g.")
            await _refused(ws, {"type": "reset", "data": [1]}, "VALIDATION_ERROR", "data:", "e.g.")
            await _refused(ws, {"type": "reset", "data": {"snapshot": "x"}}, "VALIDATION_ERROR", "snapshot:", "e.g.")
            await _refused(ws, {"type": "reset", "data": {"seed": "1"}}, "VALIDATION_ERROR", "seed:", "e.g.")
            await _refused(ws, {"type": "reset", "data": {"episode_id": "e" * 500}}, "VALIDATION_ERROR", "episode_id")
            await _refused(ws, {"type": "step", "data": {"command": "ls"}}, "EXECUTION_ERROR", "no episode", "reset")
            assert (await _ask(ws, {"type": "state"}))["data"] == {"episode_id": None, "step_count": 0}
            assert (await _ask(ws, {"type": "reset", "data": {"seed": 7}}))["type"] == "observation"
            jail = await _jail(ws)
            for action, field in [
                ({}, "command"),
                ({"command": 5}, "command"),
                ({"command": "  "}, "command"),
                ({"command": "echo a\0b"}, "command"),
                ({"cmd": "ls"}, "cmd"),
                ({"command": "ls", "timeout_s": -1}, "timeout_s"),
                ({"command": "ls", "timeout_s": "1"}, "timeout_s"),
                ({"command": "ls", "timeout_s": True}, "timeout_s"),
                ({"command": "ls", "file_path": "/a"}, "file_path"),
                ({"action_type": "rm"}, "action_type"),
                ({"action_type": "write_file", "file_path": "rel/a", "content": ""}, "file_path"),
                ({"action_type": "write_file", "content": "x"}, "file_path"),
                ({"action_type": "write_file", "file_path": "/a", "content": 1}, "content"),
                ({"action_type": "write_file", "file_path": "/a", "command": "ls"}, "command"),
                ({"command": "ls", "metadata": []}, "metadata"),
                ({"action_type": "evaluate"}, "action_type"),  # this server has no --reward-command
                ({"action_type": "evaluate", "command": "ls"}, "command"),
            ]:
                await _refused(ws, {"type": "step", "data": action}, "VALIDATION_ERROR", f"{field}:", "e.g.")
            assert (await _ask(ws, {"type": "state"}))["data"]["step_count"] == 1  # refused steps are not steps
            out = await _step(ws, action_type="write_file", file_path="/etc", content="x")  # a directory
            assert (out["observation"]["failure"], out["done"]) == ("task", False)  # the task's own failure
            assert (await _step(ws, command="echo still"))["observation"]["stdout"] == "still\n"
            await ws.send("x" * 70_000)  # over --max-message
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 60)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
            return [jail]

    _nothing_left(server, _state_dir, asyncio.run(scenario()))


@pytest.mark.slow
def test_episodes_past_the_cap_are_refused_until_one_ends(serve: Callable[..., Server], _state_dir: Path) -> None:
    server = serve("--max-episodes", "2", "--max-connections", "3")

    async def scenario() -> list[Jail]:
        async with _peer(server) as a, _peer(server) as b, _peer(server) as c:
            for ws in (a, b):
                assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            refused = await _ask(c, {"type": "reset"})
            assert refused["data"]["code"] == "CAPACITY_REACHED" and "--max-episodes" in refused["data"]["message"]
            assert (refused["data"]["active_sessions"], refused["data"]["max_sessions"]) == (2, 2)
            assert server.health()["episodes"] == 2
            jails = [await _jail(a), await _jail(b)]
            await a.send(json.dumps({"type": "close"}))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(a.recv(), 60)
            wait_until(lambda: server.health()["episodes"] == 1, "the closed episode's sandbox to end", 30)
            assert (await _ask(c, {"type": "reset"}))["type"] == "observation"
            jails.append(await _jail(c))
            async with _peer(server) as d:
                with pytest.raises(InvalidStatus) as full:  # a fifth connection: over --max-connections
                    async with _peer(server):
                        pass
                assert full.value.response.status_code == 503
                await d.close()
            return jails

    _nothing_left(server, _state_dir, asyncio.run(scenario()))


@pytest.mark.slow
def test_connections_opened_at_once_are_held_to_the_cap(serve: Callable[..., Server]) -> None:
    """Twelve handshakes at once against ``--max-connections 3``: three connections serve, the rest are
    refused (503) or closed at once (1013), however their handshakes interleave."""
    server = serve("--max-connections", "3")

    settled: list[str] = []

    async def one(everyone: asyncio.Event) -> str:
        def settle(outcome: str) -> str:
            settled.append(outcome)
            if len(settled) == 12:
                everyone.set()
            return outcome

        try:
            async with _peer(server) as ws:
                answer = await _ask(ws, {"type": "state"})
                settle(answer["type"])
                await asyncio.wait_for(everyone.wait(), 60)  # held open until every other one is settled
                return answer["type"]
        except InvalidStatus as exc:
            return settle(str(exc.response.status_code))
        except ConnectionClosed as exc:
            return settle(str(exc.rcvd.code if exc.rcvd else None))

    async def burst() -> list[str]:
        everyone = asyncio.Event()
        return await asyncio.gather(*(one(everyone) for _ in range(12)))

    outcomes = asyncio.run(burst())
    assert outcomes.count("state") == 3 and set(outcomes) <= {"state", "503", "1013"}, outcomes
    wait_until(lambda: server.health()["connections"] == 0, "every connection to end", 30)


@pytest.mark.slow
def test_episodes_are_started_at_most_at_the_rate_given(serve: Callable[..., Server], _state_dir: Path) -> None:
    server = serve("--episodes-per-minute", "3")

    async def scenario() -> None:
        async with _peer(server) as ws:
            for _ in range(3):  # each reset ends the previous episode and starts one
                assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            text = await _refused(ws, {"type": "reset"}, "CAPACITY_REACHED", "3 episodes a minute", "retry in")
            wait = float(re.search(r"retry in ([\d.]+) s", text).group(1))  # type: ignore[union-attr]
            assert 0 < wait <= 20.5  # one start every 20 s
            assert server.health()["episodes"] == 0  # the refused reset still ended the episode before it
            await _refused(ws, {"type": "step", "data": {"command": "ls"}}, "EXECUTION_ERROR", "reset")

    asyncio.run(scenario())
    _nothing_left(server, _state_dir, [])


def _drop(ws: ClientConnection) -> None:
    """Go without a closing handshake, as a crashed client does (the TCP connection is reset)."""
    sock = ws.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    ws.transport.abort()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_client_dropping_mid_step_ends_its_sandbox_at_once(
    serve: Callable[..., Server], _state_dir: Path, how: str
) -> None:
    """A step of 600 s in flight when the client goes (its TCP reset, or a closing handshake): the sandbox
    and the command's processes end within seconds, not when the command would have."""
    server = serve()

    async def scenario() -> Jail:
        async with _peer(server) as ws:
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            mark = _mark()
            await ws.send(json.dumps({"type": "step", "data": {"command": f"sleep {mark} & sleep {mark}"}}))
            jail = _found(mark, 2)
            if how == "reset":
                _drop(ws)
            else:
                await ws.close()
            return jail

    jail = asyncio.run(scenario())
    started = time.monotonic()
    _nothing_left(server, _state_dir, [jail])
    assert time.monotonic() - started < 30  # the hang guards' limit: the step had 600 s to go
    assert server.health() == {"status": "healthy", "episodes": 0, "connections": 0}


@pytest.mark.slow
def test_an_idle_or_vanished_client_loses_its_sandbox(serve: Callable[..., Server], _state_dir: Path) -> None:
    server = serve("--idle-timeout", "3")

    async def vanish() -> Jail:
        async with _peer(server) as ws:
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            jail = await _jail(ws)
            _drop(ws)
            return jail

    async def idle() -> Jail:
        async with _peer(server) as ws:
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            jail = await _jail(ws)
            out = await _step(ws, command="sleep 4; echo done")  # a step longer than the idle time is not idleness
            assert out["observation"]["stdout"] == "done\n"
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 60)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            return jail

    _nothing_left(server, _state_dir, [asyncio.run(vanish())])
    _nothing_left(server, _state_dir, [asyncio.run(idle())])


def _init_of(jail: Jail) -> psutil.Process:
    """The jail's pid 1, seen from the host."""
    return next(proc for proc in jail if _is_init(proc))


@pytest.mark.slow
def test_a_jail_that_dies_is_the_infrastructures_failure_and_ends_the_episode(
    serve: Callable[..., Server], _state_dir: Path
) -> None:
    server = serve()

    async def scenario() -> Jail:
        async with _peer(server) as ws:
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            jail = await _jail(ws)
            _init_of(jail).kill()
            wait_until(lambda: _ended(jail), "the jail to die", 30)
            broken = await _step(ws, command="echo hi")
            assert (broken["done"], broken["reward"]) == (True, None)
            assert (broken["observation"]["failure"], broken["observation"]["exit_code"]) == ("infra", -1)
            assert broken["observation"]["error"]
            assert server.health()["episodes"] == 0
            await _refused(ws, {"type": "step", "data": {"command": "ls"}}, "EXECUTION_ERROR", "episode is over")
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"  # a new episode starts
            return await _jail(ws)

    _nothing_left(server, _state_dir, [asyncio.run(scenario())])


@pytest.mark.slow
def test_a_sandbox_that_cannot_start_is_an_error_never_an_observation(
    serve: Callable[..., Server], tmp_path: Path, _state_dir: Path
) -> None:
    """The server's root filesystem gone under it: a reset is refused (``FACTORY_ERROR``, one line saying
    why), nothing is left, and the connection starts episodes again once the tree is back."""
    tree = tmp_path / "tree"
    tree.mkdir()
    server = serve("--rootfs", str(tree))
    tree.rmdir()

    async def scenario() -> None:
        async with _peer(server) as ws:
            await _refused(ws, {"type": "reset"}, "FACTORY_ERROR", "did not start", str(tree))
            assert server.health()["episodes"] == 0
            await _refused(ws, {"type": "step", "data": {"command": "ls"}}, "EXECUTION_ERROR", "reset")
            tree.mkdir()
            assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
            out = (await _step(ws, command="true"))["observation"]  # an empty tree: no such command
            assert (out["exit_code"], out["failure"]) == (127, "task")

    asyncio.run(scenario())
    _nothing_left(server, _state_dir, [])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_server_ends_every_episode(tmp_path: Path, _state_dir: Path, sig: int) -> None:
    started = Server(tmp_path / "config")

    async def scenario() -> list[Jail]:
        async with _peer(started) as a, _peer(started) as b:
            jails = []
            for ws in (a, b):
                assert (await _ask(ws, {"type": "reset"}))["type"] == "observation"
                jails.append(await _jail(ws))
            mark = _mark()
            await b.send(json.dumps({"type": "step", "data": {"command": f"sleep {mark}"}}))
            jails.append(_found(mark))
            assert started.stop(sig) == 0  # with both connections open, one mid-step
            return jails

    try:
        jails = asyncio.run(scenario())
    finally:
        if started.proc.returncode is None:
            started.stop(signal.SIGKILL)
    assert _sandbox_dirs(_state_dir) == []  # closed before it exited, not by the launcher afterwards
    for jail in jails:
        wait_until(lambda jail=jail: _ended(jail), "the jail to end", 30)


def test_the_command_line_refuses_what_it_cannot_serve_with(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def refused(*flags: str) -> str:
        done = subprocess.run([*JAILBOX, "openenv", *flags], capture_output=True, text=True, env=env, timeout=60)
        assert (done.returncode, done.stdout) == (2, ""), done
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("jailbox: "), done.stderr
        return done.stderr

    assert "--snapshot" in refused("--snapshot", "no-such-snapshot")
    assert "--max-episodes" in refused("--max-episodes", "0")
    assert "--reward-command: an empty command" in refused("--reward-command", " ")
    loose = tmp_path / "loose-token"
    loose.write_text("jbx_" + "t" * 40 + "\n")
    loose.chmod(0o644)
    assert "--token-file" in refused("--token-file", str(loose), "--port", "0")
    loose.chmod(0o600)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert "--port" in refused("--port", str(held.getsockname()[1]), "--token-file", str(loose))
