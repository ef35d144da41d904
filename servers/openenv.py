"""``jailbox openenv``: jailbox's sandboxes as an OpenEnv environment, for openenv-core's ``GenericEnvClient``.

Runs in the serving host process, never in a jail. OpenEnv (meta-pytorch/OpenEnv, PyPI ``openenv-core``)
holds an episode over one WebSocket at ``BASE/ws``: the client sends ``{"type": "reset"|"step"|"state"|
"close", "data": {...}}`` and gets ``{"type": "observation"|"state"|"error", "data": {...}}`` back, one answer
per message. Here ``reset`` starts a sandbox through ``jailbox.rl.SandboxFactory`` (fresh, or over the
snapshot the server was given) and ends the connection's previous one; ``step`` runs a command in it or
writes a file (the fields of OpenEnv's terminal environment, ``tbench2_env``) and answers with the
output fields of its coding environment (``stdout``, ``stderr``, ``exit_code``); ``state`` is the episode
id and its count of steps; ``close``, a dropped connection, an idle one, and the server's stop end the
sandbox. The reward is None but for an ``evaluate`` step (``tbench2_env``'s too), which runs the server's
``--reward-command`` in the sandbox: 1.0 when it exits 0, else 0.0, and the episode is done. A sandbox the
infrastructure broke answers ``failure: "infra"`` (``jailbox.agent.outcomes``) and ends the episode; one
that never started is an ``error`` of code ``FACTORY_ERROR``: neither is ever a task's result or scored.

The client sends no headers of its own, so the token is the URL's first segment (``/TOKEN/ws``), checked
in constant time (``keys.Keys``); the server binds loopback unless told otherwise, and refuses a browser's
request (one with an ``Origin``). What a peer sends is bounded here: connections, live episodes, episodes
started a minute, bytes per message, its JSON's depth and element count (checked before it is parsed),
seconds per step, bytes kept of each output stream, seconds between messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .. import __version__
from ..agent.outcomes import InfraError
from ..rl import RolloutSandbox, SandboxFactory
from ..sandbox import SandboxConfig
from ..sandbox.errors import SandboxError
from . import keys
from .jsonshape import excess
from .listen import bound
from .shield import to_the_end

T = TypeVar("T")

MAX_DEPTH = 8
MAX_ELEMENTS = 4096
"""A message's nesting and its JSON elements (``jsonshape``), checked before it is parsed: the protocol's
messages are two levels deep and hold a handful of fields."""
MAX_PATH = 4096
MAX_EPISODE_ID = 128
CLOSE_WAIT = 60.0  # seconds a sandbox's close may take before the server stops waiting on it at exit

ACTION_EXAMPLE = (
    '{"command": "ls -la /tmp"} or {"action_type": "write_file", "file_path": "/tmp/a.py", "content": "..."}'
)


@dataclass(frozen=True)
class Options:
    """What one server allows its peers."""

    max_episodes: int = 8  # live sandboxes, over every connection
    max_connections: int = 32  # open WebSockets, with or without an episode
    episodes_per_minute: int = 60  # resets accepted a minute (a burst of that many, then that rate)
    step_timeout: float = 300.0  # seconds a step's command may run (a client's timeout_s may ask less)
    idle_timeout: float = 900.0  # seconds without a message before the connection and its sandbox end
    max_message: int = 1 << 20  # bytes of one message the peer sends (a write_file's content included)
    output_limit: int = 64 << 10  # bytes kept per stream per step (head and tail)
    reward_command: str | None = None  # what an 'evaluate' step runs in the sandbox: exit 0 is reward 1, else 0


class _Refused(Exception):
    """What this message gets instead of an answer: an ``error`` of ``code``."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


class _Gone(Exception):
    """The peer went away while its step ran: the sandbox is closed, nothing is answered."""


def _bad_field(field: str, problem: str, example: str) -> _Refused:
    return _Refused("VALIDATION_ERROR", f"{field}: {problem}; e.g. {example}")


def _parse(data: bytes) -> tuple[str, dict[str, Any]]:
    """A message's type and data, or ``_Refused`` naming what is wrong with it."""
    over = excess(data, MAX_DEPTH, MAX_ELEMENTS)
    if over == "elements":
        raise _Refused("INVALID_JSON", f"a message holds at most {MAX_ELEMENTS} JSON elements")
    if over == "depth":
        raise _Refused("INVALID_JSON", f"a message is nested at most {MAX_DEPTH} deep")
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _Refused("INVALID_JSON", f'not JSON ({" ".join(str(exc).split())}); e.g. {{"type": "reset"}}') from None
    if not isinstance(message, dict):
        raise _Refused("INVALID_JSON", 'a message is a JSON object; e.g. {"type": "reset", "data": {}}')
    kind = message.get("type")
    if kind not in ("reset", "step", "state", "close"):
        raise _Refused(
            "UNKNOWN_TYPE", f'type: {str(kind)[:64]!r} is not a message type; e.g. "reset", "step", "state", "close"'
        )
    extra = sorted(set(message) - {"type", "data"})
    if extra:
        raise _bad_field(extra[0][:64], "not a field of a message", '{"type": "step", "data": {"command": "ls"}}')
    data_ = message.get("data", {})
    if not isinstance(data_, dict):
        raise _bad_field("data", "an object", '{"type": "step", "data": {"command": "ls"}}')
    return kind, data_


def _text(data: dict[str, Any], field: str, example: str, limit: int, required: bool = False) -> str | None:
    value = data.get(field)
    if value is None:
        if required:
            raise _bad_field(field, "missing", example)
        return None
    if not isinstance(value, str):
        raise _bad_field(field, f"a string, not {type(value).__name__}", example)
    if len(value) > limit:
        raise _bad_field(field, f"at most {limit} characters", example)
    if "\0" in value:
        raise _bad_field(field, "holds a NUL character", example)
    return value


@dataclass(frozen=True)
class _Action:
    kind: str  # "exec" or "write_file"
    command: str = ""
    file_path: str = ""
    content: str = ""
    timeout: float = 0.0


def _action(data: dict[str, Any], options: Options) -> _Action:
    """A step's action: ``tbench2_env``'s ``action_type`` (``exec``, ``write_file``, ``evaluate``), ``command``,
    ``file_path``, ``content``; ``timeout_s`` (OpenEnv's step field) lowers the server's per-step timeout;
    ``metadata`` (every OpenEnv action's) is accepted and not used."""
    allowed = {"action_type", "command", "file_path", "content", "timeout_s", "metadata"}
    extra = sorted(set(data) - allowed)
    if extra:
        raise _bad_field(extra[0][:64], "not a field of an action", ACTION_EXAMPLE)
    kind = data.get("action_type", "exec")
    if kind not in ("exec", "write_file", "evaluate"):
        raise _bad_field("action_type", f"{str(kind)[:64]!r} is not 'exec', 'write_file' or 'evaluate'", ACTION_EXAMPLE)
    timeout = data.get("timeout_s", options.step_timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise _bad_field("timeout_s", "a positive number of seconds", '{"command": "make", "timeout_s": 60}')
    if not isinstance(data.get("metadata", {}), dict):
        raise _bad_field("metadata", "an object", '{"command": "ls", "metadata": {}}')
    timeout = min(float(timeout), options.step_timeout)
    if kind == "evaluate":
        used = sorted(set(data) & {"command", "file_path", "content"})
        if used:
            raise _bad_field(used[0], "not for action_type 'evaluate'", '{"action_type": "evaluate"}')
        if options.reward_command is None:
            raise _bad_field(
                "action_type",
                "'evaluate' needs a server started with --reward-command",
                "jailbox openenv --reward-command 'pytest -q /opt/task/tests'",
            )
        return _Action("evaluate", command=options.reward_command, timeout=timeout)
    if kind == "exec":
        for field in ("file_path", "content"):
            if field in data:
                raise _bad_field(field, "only for action_type 'write_file'", ACTION_EXAMPLE)
        command = _text(data, "command", '{"command": "ls -la /tmp"}', options.max_message, required=True)
        assert command is not None
        if not command.strip():
            raise _bad_field("command", "empty", '{"command": "ls -la /tmp"}')
        return _Action("exec", command=command, timeout=timeout)
    if "command" in data:
        raise _bad_field("command", "only for action_type 'exec'", ACTION_EXAMPLE)
    example = '{"action_type": "write_file", "file_path": "/tmp/a.py", "content": "print(1)"}'
    path = _text(data, "file_path", example, MAX_PATH, required=True)
    assert path is not None
    if not path.startswith("/"):
        raise _bad_field("file_path", "an absolute path", example)
    content = _text(data, "content", example, options.max_message) or ""
    return _Action("write_file", file_path=path, content=content, timeout=timeout)


def _observation(
    stdout: str = "",
    stderr: str = "",
    exit_code: int = 0,
    timed_out: bool = False,
    failure: str | None = None,
    error: str | None = None,
    done: bool = False,
    reward: float | None = None,
) -> dict[str, Any]:
    """An ``observation`` message's data as OpenEnv serialises one: the observation's own fields, the reward,
    whether the episode is over. ``failure`` says whose failure a step was (``"task"``, ``"infra"``)."""
    fields = {"stdout": stdout, "stderr": stderr, "exit_code": exit_code, "timed_out": timed_out}
    return {"observation": {**fields, "failure": failure, "error": error}, "reward": reward, "done": done}


class _Rate:
    """A bucket of ``per_minute`` episode starts, refilled at that rate: a burst of that many, then a steady flow."""

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.rate = per_minute / 60.0
        self.at = time.monotonic()

    def take(self) -> float:
        """0 when a start is allowed now (and counted), else the seconds until one is."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Episodes:
    """Every connection's sandbox, capped at ``max_episodes`` alive; what the tests count."""

    def __init__(self, config: SandboxConfig, options: Options) -> None:
        self.options = options
        # A thread per live episode's call and one for its close, and a few for closes past the cap.
        self.pool = ThreadPoolExecutor(options.max_episodes * 2 + 4, thread_name_prefix="openenv")
        self.factory = SandboxFactory(config, max_live=options.max_episodes, wait=0.0)
        self.rate = _Rate(options.episodes_per_minute)
        self.live: set[RolloutSandbox] = set()  # on the event loop's thread only
        self.starting = 0
        self.connections = 0

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    async def start(self) -> RolloutSandbox:
        """A new sandbox, or ``_Refused``: over the cap, over the rate, or the jail did not start."""
        if len(self.live) + self.starting >= self.options.max_episodes:
            raise _Refused(
                "CAPACITY_REACHED",
                f"{self.options.max_episodes} episodes are live, the server's --max-episodes: close one first",
                active_sessions=len(self.live) + self.starting,
                max_sessions=self.options.max_episodes,
            )
        wait = self.rate.take()
        if wait:
            raise _Refused(
                "CAPACITY_REACHED",
                f"at most {self.options.episodes_per_minute} episodes a minute (--episodes-per-minute): "
                f"retry in {wait:.1f} s",
            )
        self.starting += 1
        try:
            making, cancelled = await to_the_end(self.call(self.factory.create))
        finally:
            self.starting -= 1
        try:
            box = making.result()
        except InfraError as exc:
            raise _Refused("FACTORY_ERROR", f"the sandbox did not start: {exc}", failure="infra") from None
        except SandboxError as exc:  # the server's configuration: the same for every episode
            raise _Refused("FACTORY_ERROR", f"the sandbox did not start: {type(exc).__name__}: {exc}") from None
        self.live.add(box)
        if cancelled:  # nobody is left to hand it to
            await self.end(box)
            raise asyncio.CancelledError
        return box

    async def end(self, box: RolloutSandbox) -> None:
        """Close ``box`` to the end, even when the caller is cancelled meanwhile (the cancellation follows). It
        counts as live until closed: the factory frees its slot only then."""
        closing, cancelled = await to_the_end(self.call(box.close))
        self.live.discard(box)
        with contextlib.suppress(SandboxError):
            closing.result()
        if cancelled:
            raise asyncio.CancelledError

    def close_all(self) -> None:
        """At exit, from a thread of its own: whatever is still live (a handler stopped before its end)."""
        for box in list(self.live):
            self.live.discard(box)
            with contextlib.suppress(SandboxError):
                box.close()
        self.pool.shutdown(wait=True, cancel_futures=True)


class _Episode:
    """One connection's episode: its sandbox, id and count of steps."""

    def __init__(self, held: Episodes, conn: ServerConnection) -> None:
        self.held = held
        self.conn = conn
        self.box: RolloutSandbox | None = None
        self.episode_id: str | None = None
        self.step_count = 0
        self.over = False

    async def answer(self, kind: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        if kind == "reset":
            return "observation", await self.reset(data)
        if kind == "step":
            return "observation", await self.step(data)
        if kind == "state":
            return "state", {"episode_id": self.episode_id, "step_count": self.step_count}
        return None  # close

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        extra = sorted(set(data) - {"seed", "episode_id"})
        if extra:
            raise _bad_field(extra[0][:64], "not a field of reset", '{"type": "reset", "data": {"episode_id": "ep-1"}}')
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _bad_field("seed", "an integer (not used: a sandbox has no randomness to seed)", '{"seed": 42}')
        wanted = _text(data, "episode_id", '{"episode_id": "ep-1"}', MAX_EPISODE_ID)
        await self.finish()
        self.box = await self.held.start()
        self.episode_id = wanted or str(uuid.uuid4())
        self.step_count = 0
        self.over = False
        return _observation()

    async def step(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.box is None:
            what = "the episode is over" if self.over else "no episode yet"
            raise _Refused("EXECUTION_ERROR", f'step: {what}; send {{"type": "reset"}} first')
        action = _action(data, self.held.options)
        box = self.box
        self.step_count += 1
        if action.kind in ("exec", "evaluate"):
            try:
                out = await self._watched(lambda: box.exec(action.command, timeout=action.timeout))
            except SandboxError as exc:  # the jail refused the command itself (no infrastructure failed)
                raise _Refused("EXECUTION_ERROR", f"step: {' '.join(str(exc).split())}") from None
            result = _observation(out.stdout, out.stderr, out.exit_code, out.timed_out, out.failure, out.error)
            if out.failure == "infra":  # never scored: the reward stays None
                return await self._broken(result)
            if action.kind == "evaluate":  # the server's check of the sandbox: 1 when it passed, else 0
                return {**result, "reward": 1.0 if out.ok else 0.0, "done": True}
            return result
        try:
            await self._watched(lambda: box.write_file(action.file_path, action.content))
        except InfraError as exc:
            return await self._broken(_observation(exit_code=-1, failure="infra", error=str(exc)))
        except SandboxError as exc:  # the task's: a directory in the way, the disk full (SandboxFileError)
            return _observation(stderr=f"{' '.join(str(exc).split())}\n", exit_code=1, failure="task")
        return _observation()

    async def _watched(self, call: Callable[[], T]) -> T:
        """``call`` on a thread; when the peer goes first, the sandbox is closed (which ends the call) and
        ``_Gone`` is raised."""
        work = asyncio.ensure_future(self.held.call(call))
        gone = asyncio.ensure_future(self.conn.wait_closed())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():
            await self.finish()
            with contextlib.suppress(Exception):
                await work
            raise _Gone
        return work.result()

    async def _broken(self, result: dict[str, Any]) -> dict[str, Any]:
        """The infrastructure failed the step: the episode is over and its sandbox closed."""
        await self.finish()
        self.over = True
        return {**result, "done": True}

    async def finish(self) -> None:
        box, self.box = self.box, None
        if box is not None:
            await self.held.end(box)


def _reply(kind: str, data: dict[str, Any]) -> str:
    return json.dumps({"type": kind, "data": data})


def _error(refusal: _Refused) -> str:
    return _reply("error", {"message": str(refusal), "code": refusal.code, **refusal.extra})


class OpenEnvServer:
    """The WebSocket endpoint and its three HTTP companions (``health``, ``schema``, ``metadata``), all
    under ``/TOKEN/``."""

    def __init__(self, config: SandboxConfig, options: Options, tokens: keys.Keys) -> None:
        self.options = options
        self.tokens = tokens
        self.held = Episodes(config.model_copy(update={"output_limit": options.output_limit}), options)

    def _route(self, path: str) -> str | None:
        """What ``path`` asks for (``ws``, ``health``, ...) when its first segment is a token, else None."""
        token, _, rest = path.partition("?")[0].removeprefix("/").partition("/")
        return rest if self.tokens.owner(token) is not None else None

    def process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        where = self._route(request.path)
        if where is None:
            return _http(http.HTTPStatus.UNAUTHORIZED, "jailbox openenv: the URL is http://HOST:PORT/TOKEN\n")
        if where == "ws":
            if self.held.connections >= self.options.max_connections:
                text = f"jailbox openenv: {self.options.max_connections} connections are open (--max-connections)\n"
                return _http(http.HTTPStatus.SERVICE_UNAVAILABLE, text)
            return None
        body = self._info(where)
        if body is None:
            return _http(http.HTTPStatus.NOT_FOUND, "jailbox openenv: serves ws, health, schema and metadata\n")
        return _http(http.HTTPStatus.OK, json.dumps(body), "application/json")

    def _info(self, where: str) -> dict[str, Any] | None:
        if where == "health":  # OpenEnv's HealthResponse, and what this server holds now
            return {"status": "healthy", "episodes": len(self.held.live), "connections": self.held.connections}
        if where == "metadata":
            return {
                "name": "jailbox",
                "description": "a jailbox sandbox: run commands and write files in it",
                "version": __version__,
                "readme_content": None,
                "author": None,
                "documentation_url": None,
            }
        if where == "schema":
            return SCHEMA
        return None

    async def handle(self, conn: ServerConnection) -> None:
        if self._route(conn.request.path if conn.request else "") != "ws":
            await conn.close(1008, "not the ws endpoint")
            return
        # Counted here, with no await since the check: handshakes that passed process_request at once
        # cannot all stay (the 503 there spares most of them the handshake).
        if self.held.connections >= self.options.max_connections:
            await conn.close(1013, f"{self.options.max_connections} connections are open (--max-connections)")
            return
        self.held.connections += 1
        episode = _Episode(self.held, conn)
        try:
            await self._serve(conn, episode)
        except (ConnectionClosed, _Gone):
            pass
        finally:
            self.held.connections -= 1
            await episode.finish()

    async def _serve(self, conn: ServerConnection, episode: _Episode) -> None:
        while True:
            try:
                raw = await asyncio.wait_for(conn.recv(decode=False), self.options.idle_timeout)
            except asyncio.TimeoutError:
                await conn.close(1000, f"idle for {self.options.idle_timeout:g} s")
                return
            try:
                if isinstance(raw, str):
                    raw = raw.encode()
                kind, data = _parse(raw)
                answer = await episode.answer(kind, data)
            except _Refused as refusal:
                await conn.send(_error(refusal))
                continue
            except (ConnectionClosed, _Gone):
                raise
            except Exception as exc:  # a bug of ours: the episode ends, the peer learns it in one line
                await episode.finish()
                episode.over = True
                text = f"the episode ended: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                await conn.send(_error(_Refused("SESSION_ERROR", text)))
                continue
            if answer is None:
                await conn.close(1000, "closed")
                return
            await conn.send(_reply(*answer))


def _http(status: http.HTTPStatus, text: str, kind: str = "text/plain; charset=utf-8") -> Response:
    body = text.encode()
    headers = Headers([("Content-Type", kind), ("Content-Length", str(len(body))), ("Connection", "close")])
    return Response(status.value, status.phrase, headers, body)


def _schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


SCHEMA = {  # what /schema answers: OpenEnv's SchemaResponse (the action, the observation, the state)
    "action": _schema(
        {
            "action_type": {"type": "string", "enum": ["exec", "write_file", "evaluate"], "default": "exec"},
            "command": {"type": "string", "description": "a shell command (action_type exec)"},
            "file_path": {"type": "string", "description": "an absolute path (action_type write_file)"},
            "content": {"type": "string", "description": "the file's text (action_type write_file)"},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0},
            "metadata": {"type": "object"},
        }
    ),
    "observation": _schema(
        {
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "exit_code": {"type": "integer"},
            "timed_out": {"type": "boolean"},
            "failure": {"enum": ["task", "infra", None]},
            "error": {"type": ["string", "null"]},
        }
    ),
    "state": _schema({"episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer", "minimum": 0}}),
}


async def _serve(server: OpenEnvServer, host: str, port: int, token_path: Path, made: str | None) -> None:
    sock = bound(host, port)
    sock.listen(512)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running: Server | None = None
    try:
        running = await serve(
            server.handle,
            sock=sock,
            process_request=server.process_request,
            origins=[None],  # a browser's page (it sends an Origin) is refused: only programs connect
            compression=None,
            max_size=server.options.max_message,
            max_queue=2,  # messages read ahead of the one being answered: 2 x max_message a connection
            server_header=None,
            logger=_QUIET,
        )
        shown = f"[{host}]" if ":" in host else host
        base = f"http://{shown}:{sock.getsockname()[1]}/{made or '<a token from ' + str(token_path) + '>'}"
        print(f'jailbox openenv: GenericEnvClient(base_url="{base}")', file=sys.stderr)
        print(f"jailbox openenv: serving at http://{shown}:{sock.getsockname()[1]}/", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        if running is not None:
            running.close()  # every connection closed (1001): each handler ends its sandbox
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(running.wait_closed(), CLOSE_WAIT)
        sock.close()
        closing = threading.Thread(target=server.held.close_all, name="openenv-close")
        closing.start()
        await asyncio.to_thread(closing.join)


_QUIET = logging.getLogger("jailbox.servers.openenv.websockets")
_QUIET.disabled = True  # nothing of the wire is logged, not even a failed handshake (its request line holds the token)
_QUIET.propagate = False


def main(config: SandboxConfig, host: str, port: int, token_file: Path | None, options: Options) -> None:
    """Serve until SIGINT or SIGTERM; every sandbox is closed before it returns."""
    path, made = keys.given_or_made(token_file, keys.OPENENV_TOKENS)
    if made is not None:
        print(f"jailbox openenv: made a token in {path} (shown only now): {made}", file=sys.stderr)
    tokens = keys.Keys(keys.load(path, "--token-file"))
    asyncio.run(_serve(OpenEnvServer(config, options, tokens), host, port, path, made))
