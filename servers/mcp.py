"""``jailbox mcp``: sandboxes as Model Context Protocol tools, over the official ``mcp`` SDK.

Runs in the host process that an MCP client starts (stdio, the default) or connects to (streamable
HTTP with ``--http``), never in a jail. A client creates sandboxes, runs commands in them, reads and
writes their files, branches them (checkpoint, rollback, fork), pauses, lists and kills them, and
keeps them as durable snapshots in the server's user's store, which every session of the server
shares. What a client sends is bounded here: sandboxes per session (children of a fork included),
checkpoints per sandbox, snapshots in the store, snapshots per listing, seconds per command, bytes
kept of each output stream, bytes per file read or written, the HTTP request body. A sandbox and
its checkpoints belong to the session that made them, are invisible to every other session, and
die with it: on stdio when the client closes the pipe or the process is stopped;
over HTTP when the client ends its session, when the session has had no request in flight for
``Options.idle_timeout`` seconds (a client that went without saying so), or when the server stops.
Over HTTP the server binds loopback unless told otherwise, refuses Host and Origin headers that are
not its own (DNS rebinding), and requires a bearer token from a private file (``keys``: made on
first start) even on loopback, where every other local user can connect too.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError

from ..sandbox import AsyncSandbox, Limits, NetworkPolicy, SandboxConfig, Snapshot, snapshots
from ..sandbox.errors import BranchError, SandboxError, SandboxPaused, SnapshotNotFound
from ..sandbox.serving import SNAPSHOT_ID, SNAPSHOT_NAME, Checkpoint, Store, stored
from . import keys
from .listen import BadFlag, bound
from .shield import to_the_end

SESSION_HEADER = "mcp-session-id"
STDIO = "stdio"  # the one session a stdio server has
T = TypeVar("T")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

EXAMPLES = {  # field -> a valid value, for the one-line errors
    "template": "'host' or 'default' (jailbox rootfs list shows the names)",
    "network": "'none', 'full' or 'allow:pypi,github'",
    "memory": "'512M'",
    "cpus": "1.5",
    "pids": "256",
    "disk": "'2G'",
    "sandbox_id": "an id from create_sandbox or list_sandboxes",
    "command": "'ls -la /tmp'",
    "timeout": "60",
    "cwd": "'/tmp'",
    "path": "'/tmp/notes.txt'",
    "content": "'hello'",
    "encoding": "'text' or 'base64'",
    "checkpoint_id": "an id from checkpoint, e.g. 'cp-1a2b3c4d'",
    "count": "2",
    "name": "'repo-ready'",
    "snapshot": "'snap-0123456789ab' or 'repo-ready' (list_snapshots shows them)",
    "ref": "'snap-0123456789ab' or 'repo-ready' (list_snapshots shows them)",
}


@dataclass(frozen=True)
class Options:
    """What one server allows its clients."""

    max_sandboxes: int = 8  # per session, a fork's children included
    # per sandbox: each holds a copy of what the sandbox had written, up to its disk bound, on the
    # host's disk outside that bound
    max_checkpoints: int = 8
    # in the user's store, which outlives the server: each holds up to a sandbox's disk bound; made
    # by anyone (the CLI, the library) but refused here past this many
    max_snapshots: int = 32
    max_listed: int = 1000  # snapshots in one list_snapshots reply (the newest)
    max_total: int = 64  # in all sessions together
    max_timeout: float = 3600.0  # seconds per command
    output_limit: int = 64 << 10  # bytes kept per stream per command (head and tail)
    max_file: int = 1 << 20  # bytes per read_file or write_file
    allow_host_network: bool = False  # network "host" reaches the server's own loopback services
    idle_timeout: float = 1800.0  # HTTP: a session with no request in flight for this long is ended


def _bad(tool: str, name: str, problem: str) -> ToolError:
    return ToolError(f"{tool}: {name}: {problem}; e.g. {name}={EXAMPLES.get(name, '...')}")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _validation_error(tool: str, error: ValidationError) -> ToolError:
    first = error.errors()[0]
    name = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return _bad(tool, name, _one_line(message))


# --- what the tools return ----------------------------------------------------------------------


class SandboxInfo(BaseModel):
    sandbox_id: str
    template: str
    network: str
    workdir: str
    created: str = Field(description="UTC, ISO 8601")
    snapshot: str | None = Field(None, description="the id of the snapshot it started from, if one")
    paused: bool = False
    checkpoints: list[str] = Field(default_factory=list, description="its checkpoint ids, oldest first")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class CommandResult(BaseModel):
    exit_code: int
    signal: int | None = Field(description="the signal that ended the command, if one did")
    stdout: str
    stderr: str
    timed_out: bool
    stdout_dropped: int = Field(description="bytes left out of the middle of stdout (only head and tail are kept)")
    stderr_dropped: int = Field(description="bytes left out of the middle of stderr")


class FileContent(BaseModel):
    path: str
    encoding: Literal["text", "base64"]
    content: str
    size: int


class Written(BaseModel):
    path: str
    size: int


class Killed(BaseModel):
    sandbox_id: str
    killed: bool


class CheckpointMade(BaseModel):
    sandbox_id: str
    checkpoint_id: str


class RolledBack(BaseModel):
    sandbox_id: str
    checkpoint_id: str
    dropped: list[str] = Field(description="the newer checkpoint ids, dropped by the rollback")


class CheckpointDropped(BaseModel):
    sandbox_id: str
    checkpoint_id: str
    dropped: bool


class Forked(BaseModel):
    sandbox_id: str = Field(description="the sandbox forked, which keeps running")
    sandbox_ids: list[str] = Field(description="the new sandboxes, each held by this session")


class PauseState(BaseModel):
    sandbox_id: str
    paused: bool


class SnapshotInfo(BaseModel):
    id: str = Field(description="snap- and 12 hex digits")
    name: str | None = Field(description="its name, unless a newer snapshot was given it")
    created: str = Field(description="UTC, ISO 8601")
    size: int = Field(description="bytes it holds on the host's disk")
    image: str = Field(description="the template it was made over, which a sandbox from it runs over")
    source: str = Field(description="the id of the sandbox's jail it was taken of (new after each rollback)")

    @classmethod
    def of(cls, snap: Snapshot) -> SnapshotInfo:
        created = datetime.fromtimestamp(snap.created, timezone.utc).isoformat(timespec="seconds")
        return cls(id=snap.id, name=snap.name, created=created, size=snap.size, image=snap.image, source=snap.source)


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo] = Field(description="newest first")
    left_out: int = Field(description="older snapshots not listed (past the server's limit per listing)")


# --- who holds which sandbox --------------------------------------------------------------------


@dataclass
class _Held:
    box: AsyncSandbox
    info: SandboxInfo
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)  # by id, oldest first
    # one branching call (checkpoint, rollback, drop, fork, snapshot, pause, resume) at a time, and the
    # close after them: each checks the bounds and the checkpoints it finds before it waits on the
    # sandbox, and a cut never reads a jail that is being closed
    branching: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Session:
    sandboxes: dict[str, _Held] = field(default_factory=dict)
    making: int = 0
    ended: bool = False
    last_seen: float = field(default_factory=time.monotonic)


async def _closed_after_branching(held: _Held) -> None:
    """``held`` closed once no checkpoint or fork of it is in flight: the library's ``close()`` ends
    the jail whose writable layer a cut reads. A branching call that comes after finds the sandbox
    gone from its session and undoes what it made."""
    async with held.branching:
        held.checkpoints.clear()  # close() drops them
        await held.box.close()


class Sandboxes:
    """Every sandbox this server holds, by the session that made it."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._sessions: dict[str, _Session] = {}
        self._making: set[asyncio.Task[Any]] = set()  # creations and branchings, which outlive a cancelled call
        self._in_flight: dict[str, int] = {}  # HTTP requests (an open event stream too) per session id
        self._snapshotting = asyncio.Lock()  # one snapshot at a time: the store's count is checked before each

    async def create(self, key: str, config: SandboxConfig, template: str, network: str) -> _Held:
        session = self._sessions.setdefault(key, _Session())
        if sum(len(s.sandboxes) + s.making for s in self._sessions.values()) >= self.options.max_total:
            raise ToolError(
                f"create_sandbox: this server holds {self.options.max_total} sandboxes, its limit; "
                "free one first, e.g. kill_sandbox(sandbox_id=...)"
            )
        if len(session.sandboxes) + session.making >= self.options.max_sandboxes:
            raise ToolError(
                f"create_sandbox: this session already holds {self.options.max_sandboxes} sandboxes (the server's "
                "--max-sandboxes); free one first, e.g. kill_sandbox(sandbox_id=...)"
            )
        session.making += 1
        return await self._shielded(self._make(session, config, template, network))

    def _shielded(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``work`` run to its end even if the client gives up on the call: it registers what it
        made (a jail, a checkpoint), or undoes it if the session ended meanwhile, so nothing is held
        that no one can see or free. ``close()`` waits for it."""
        task = asyncio.ensure_future(work)
        self._making.add(task)

        def done(task: asyncio.Task[T]) -> None:
            self._making.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved: a caller that gave up is not told

        task.add_done_callback(done)
        return asyncio.shield(task)

    async def _make(self, session: _Session, config: SandboxConfig, template: str, network: str) -> _Held:
        try:
            box = await AsyncSandbox(config).start()
        finally:
            session.making -= 1
        sb = box.sandbox
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        held = _Held(
            box,
            SandboxInfo(
                sandbox_id=sb.id,
                template=template,
                network=network,
                workdir=sb.config.workdir,
                created=created,
                snapshot=config.snapshot,
            ),
        )
        if session.ended:
            await box.close()
            raise ToolError("create_sandbox: the session ended while its sandbox was being made")
        session.sandboxes[sb.id] = held
        return held

    def get(self, tool: str, key: str, sandbox_id: str) -> _Held:
        session = self._sessions.get(key)
        held = session.sandboxes.get(sandbox_id) if session is not None else None
        if held is None:
            shown = repr(sandbox_id[:64]) + ("..." if len(sandbox_id) > 64 else "")
            raise ToolError(
                f"{tool}: sandbox_id: no sandbox {shown} in this session (killed, or never made here); "
                "list_sandboxes shows this session's, create_sandbox makes one"
            )
        return held

    def listed(self, key: str) -> list[SandboxInfo]:
        session = self._sessions.get(key)
        if session is None:
            return []
        return [
            h.info.model_copy(update={"paused": h.box.paused, "checkpoints": list(h.checkpoints)})
            for h in session.sandboxes.values()
        ]

    async def kill(self, key: str, sandbox_id: str) -> None:
        held = self.get("kill_sandbox", key, sandbox_id)
        async with held.branching:
            held = self.get("kill_sandbox", key, sandbox_id)  # not killed meanwhile
            self._sessions[key].sandboxes.pop(sandbox_id, None)
        await _closed_after_branching(held)

    # --- branching ------------------------------------------------------------------------------

    def _holds(self, key: str, sandbox_id: str, held: _Held) -> bool:
        session = self._sessions.get(key)
        return session is not None and not session.ended and session.sandboxes.get(sandbox_id) is held

    def _checkpoint_of(self, tool: str, key: str, sandbox_id: str, held: _Held, checkpoint_id: str) -> Checkpoint:
        found = held.checkpoints.get(checkpoint_id)
        if found is not None:
            return found
        shown = repr(checkpoint_id[:64]) + ("..." if len(checkpoint_id) > 64 else "")
        for other_id, other in self._sessions[key].sandboxes.items():
            if checkpoint_id in other.checkpoints:
                raise ToolError(
                    f"{tool}: checkpoint_id: {shown} is a checkpoint of sandbox {other_id!r}, not of {sandbox_id!r}; "
                    f"use it with that sandbox, or take one of this, e.g. checkpoint(sandbox_id={sandbox_id!r})"
                )
        raise ToolError(
            f"{tool}: checkpoint_id: no checkpoint {shown} of this sandbox (dropped, or never taken); "
            f"list_sandboxes shows its checkpoints, checkpoint(sandbox_id={sandbox_id!r}) takes one"
        )

    async def checkpoint(self, key: str, sandbox_id: str) -> str:
        held = self.get("checkpoint", key, sandbox_id)
        return await self._shielded(self._checkpoint(key, sandbox_id, held))

    async def _checkpoint(self, key: str, sandbox_id: str, held: _Held) -> str:
        tool = "checkpoint"
        async with held.branching:
            if len(held.checkpoints) >= self.options.max_checkpoints:
                raise ToolError(
                    f"{tool}: sandbox_id: {sandbox_id!r} already holds {self.options.max_checkpoints} checkpoints "
                    "(the server's --max-checkpoints); free one first, e.g. drop_checkpoint(sandbox_id=..., "
                    "checkpoint_id=...)"
                )
            cp: Checkpoint = await _sandbox_call(tool, held.box.checkpoint(), sandbox_id=sandbox_id)
            if not self._holds(key, sandbox_id, held):  # killed, or the session ended, during the cut
                cp.drop()
                raise ToolError(f"{tool}: sandbox_id: {sandbox_id!r} was killed while its checkpoint was taken")
            taken = {c for h in self._sessions[key].sandboxes.values() for c in h.checkpoints}
            checkpoint_id = f"cp-{secrets.token_hex(4)}"
            while checkpoint_id in taken:
                checkpoint_id = f"cp-{secrets.token_hex(4)}"
            held.checkpoints[checkpoint_id] = cp
            return checkpoint_id

    async def rollback(self, key: str, sandbox_id: str, checkpoint_id: str) -> list[str]:
        """Back to the checkpoint; the ids of the newer ones, which the rollback dropped."""
        tool = "rollback"
        held = self.get(tool, key, sandbox_id)
        self._checkpoint_of(tool, key, sandbox_id, held, checkpoint_id)
        return await self._shielded(self._rollback(key, sandbox_id, held, checkpoint_id))

    async def _rollback(self, key: str, sandbox_id: str, held: _Held, checkpoint_id: str) -> list[str]:
        tool = "rollback"
        async with held.branching:
            cp = self._checkpoint_of(tool, key, sandbox_id, held, checkpoint_id)  # a drop may have come first
            await _sandbox_call(tool, held.box.rollback(cp), sandbox_id=sandbox_id)
            dropped = [c for c, handle in held.checkpoints.items() if not handle.valid]
            for c in dropped:
                del held.checkpoints[c]
            return dropped

    async def drop_checkpoint(self, key: str, sandbox_id: str, checkpoint_id: str) -> None:
        tool = "drop_checkpoint"
        held = self.get(tool, key, sandbox_id)
        async with held.branching:
            cp = self._checkpoint_of(tool, key, sandbox_id, held, checkpoint_id)
            del held.checkpoints[checkpoint_id]
            await asyncio.to_thread(cp.drop)  # removes its layers from disk when nothing else holds them

    async def fork(self, key: str, sandbox_id: str, count: int) -> list[str]:
        tool = "fork_sandbox"
        held = self.get(tool, key, sandbox_id)
        session = self._sessions[key]
        holds = len(session.sandboxes) + session.making
        everywhere = sum(len(s.sandboxes) + s.making for s in self._sessions.values())
        if count < 1:
            raise _bad(tool, "count", f"{count} is not a positive number of new sandboxes")
        refusal = None
        if holds + count > self.options.max_sandboxes:
            room = self.options.max_sandboxes - holds
            refusal = f"this session holds {holds} of its {self.options.max_sandboxes} (the server's --max-sandboxes)"
        elif everywhere + count > self.options.max_total:
            room = self.options.max_total - everywhere
            refusal = f"this server holds {everywhere} of its {self.options.max_total} in all sessions"
        if refusal is not None:
            raise ToolError(
                f"{tool}: count: {count} more sandboxes than there is room for: {refusal}; "
                + (f"e.g. count={room}" if room > 0 else "free one first, e.g. kill_sandbox(sandbox_id=...)")
            )
        session.making += count  # counted before the fork, so concurrent calls cannot pass the cap together
        return await self._shielded(self._fork(session, sandbox_id, held, count))

    async def _fork(self, session: _Session, sandbox_id: str, held: _Held, count: int) -> list[str]:
        tool = "fork_sandbox"
        try:
            async with held.branching:
                children: list[AsyncSandbox] = await _sandbox_call(tool, held.box.fork(count), sandbox_id=sandbox_id)
        finally:
            session.making -= count
        if session.ended:
            await asyncio.gather(*(child.close() for child in children), return_exceptions=True)
            raise ToolError(f"{tool}: the session ended while its sandboxes were being made")
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        made = []
        for child in children:
            sb = child.sandbox
            info = held.info.model_copy(update={"sandbox_id": sb.id, "created": created})
            session.sandboxes[sb.id] = _Held(child, info)
            made.append(sb.id)
        return made

    async def snapshot(self, key: str, sandbox_id: str, name: str | None) -> Snapshot:
        held = self.get("snapshot_sandbox", key, sandbox_id)
        return await self._shielded(self._snapshot(key, sandbox_id, held, name))

    async def _snapshot(self, key: str, sandbox_id: str, held: _Held, name: str | None) -> Snapshot:
        tool = "snapshot_sandbox"
        async with self._snapshotting, held.branching:
            if not self._holds(key, sandbox_id, held):
                raise ToolError(f"{tool}: sandbox_id: {sandbox_id!r} was killed before its snapshot was taken")
            there = len(await _store_call(tool, "sandbox_id", snapshots.list))
            if there >= self.options.max_snapshots:
                raise ToolError(
                    f"{tool}: the store holds {there} snapshots, this server's limit (--max-snapshots); "
                    "delete one first, e.g. delete_snapshot(ref=...)"
                )
            snap: Snapshot = await _sandbox_call(tool, held.box.snapshot(name), sandbox_id=sandbox_id)
            return snap

    async def pause(self, tool: str, key: str, sandbox_id: str, paused: bool) -> None:
        held = self.get(tool, key, sandbox_id)
        async with held.branching:
            await _sandbox_call(tool, held.box.pause() if paused else held.box.resume(), sandbox_id=sandbox_id)

    async def end(self, key: str) -> None:
        """The session is over: close its sandboxes, and any still being made once they are."""
        session = self._sessions.pop(key, None)
        if session is None:
            return
        session.ended = True
        held = list(session.sandboxes.values())
        session.sandboxes.clear()
        await asyncio.gather(*(_closed_after_branching(h) for h in held), return_exceptions=True)

    async def close(self) -> None:
        """The server stops: every session ends, and nothing being made outlives it."""
        for key in list(self._sessions):
            await self.end(key)
        if self._making:
            await asyncio.gather(*self._making, return_exceptions=True)
        for key in list(self._sessions):
            await self.end(key)

    # HTTP sessions: the gate counts each session's requests in flight, as the SDK does to expire
    # sessions, so one that has had none for the idle time can be ended here too.

    def began(self, key: str) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def finished(self, key: str) -> None:
        left = self._in_flight.pop(key) - 1
        if left:
            self._in_flight[key] = left
        session = self._sessions.get(key)
        if session is not None:
            session.last_seen = time.monotonic()

    async def reap_idle(self, idle: float) -> None:
        while True:
            await asyncio.sleep(max(1.0, idle / 4))
            now = time.monotonic()
            for key, session in list(self._sessions.items()):
                if key not in self._in_flight and session.making == 0 and now - session.last_seen > idle:
                    await self.end(key)


# --- the tools ----------------------------------------------------------------------------------


class _Server(MCPServer[Any]):
    """MCPServer whose errors are one line, starting with the tool and the field at fault."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise _validation_error(name, exc.__cause__) from None
            if isinstance(exc.__cause__, ToolError):  # ours, already naming the tool: without the SDK's prefix
                raise ToolError(str(exc.__cause__)) from None
            raise


def _session_key(ctx: Context[Any, Any], http: bool) -> str:
    if not http:
        return STDIO
    headers = ctx.headers
    key = headers.get(SESSION_HEADER) if headers is not None else None
    if not key:
        raise ToolError(
            "this server keeps sandboxes per session and this request belongs to none: connect with a client "
            "that opens a session (the initialize handshake, e.g. the mcp SDK's ClientSession)"
        )
    return key


def _check_template(tool: str, template: str) -> None:
    """``host`` or a stored root filesystem: never a directory of the server's, which a name that is
    not stored would otherwise be taken for (relative to the server's working directory)."""
    if template == "host":
        return
    try:
        if stored(template) is not None:
            return
        names = ", ".join(sorted(e.name for e in Store().list())) or "none yet"
    except SandboxError as exc:
        raise _bad(tool, "template", _one_line(exc)) from None
    raise _bad(tool, "template", f"{template[:80]!r} is not 'host' or a stored root filesystem (stored: {names})")


def _network(tool: str, text: str, options: Options) -> NetworkPolicy:
    try:
        policy = NetworkPolicy.parse(text)
    except ValidationError as exc:
        raise _bad(tool, "network", _one_line(exc.errors()[0].get("msg", "invalid"))) from None
    except ValueError as exc:
        raise _bad(tool, "network", _one_line(exc)) from None
    if policy.mode == "host" and not options.allow_host_network:
        raise _bad(tool, "network", "'host' is off on this server (it reaches the host's own services)")
    return policy


def _limits(tool: str, given: dict[str, Any]) -> Limits:
    try:
        return Limits(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise _validation_error(tool, exc) from None


def _decode(tool: str, content: str, encoding: str, limit: int) -> bytes:
    if encoding == "base64":
        if len(content) > (limit + 2) // 3 * 4:
            raise _bad(tool, "content", f"more than {limit} bytes; this server's limit per file")
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(tool, "content", "not valid base64") from None
    else:
        data = content.encode("utf-8", "surrogatepass")
    if len(data) > limit:
        raise _bad(tool, "content", f"{len(data)} bytes, more than this server's limit of {limit} per file")
    return data


def _snapshot_ref(tool: str, field: str, ref: str) -> str:
    if not (SNAPSHOT_ID.fullmatch(ref) or SNAPSHOT_NAME.fullmatch(ref)):
        raise _bad(tool, field, f"{ref[:80]!r} is not a snapshot id or name")
    return ref


async def _store_call(tool: str, field: str, call: Callable[..., T], *args: Any) -> T:
    """A call of the snapshot store, run off the loop; its refusals as one line naming ``field``."""
    try:
        return await asyncio.to_thread(call, *args)
    except SnapshotNotFound:
        raise _bad(tool, field, f"no snapshot {args[0]!r} in the store") from None
    except BranchError:  # removal only: a jail runs over it, which holds it
        raise ToolError(
            f"{tool}: {field}: {args[0]!r} is in use by a running sandbox started from it (of a session, or of "
            "the jailbox command); kill those first, e.g. kill_sandbox(sandbox_id=...)"
        ) from None
    except SandboxError as exc:
        raise ToolError(f"{tool}: {_one_line(exc)}") from None


async def _from_snapshot(tool: str, ref: str, template: str | None) -> Snapshot:
    """The snapshot a new sandbox starts from: found now (so a name that moves later does not change
    it), made over ``template`` if given, and over a template this server serves: never a directory."""
    snap = await _store_call(tool, "snapshot", snapshots.get, _snapshot_ref(tool, "snapshot", ref))
    if template is not None and template != snap.image:
        raise _bad(tool, "template", f"{template[:80]!r}, but {snap.id} was made over {snap.image!r}: leave it out")
    if snap.image != "host" and await asyncio.to_thread(stored, snap.image) is None:
        raise _bad(
            tool,
            "snapshot",
            f"{snap.id} was made over {snap.image[:80]!r}, which is not 'host' or a stored root filesystem, "
            "the only templates this server starts sandboxes over",
        )
    return snap


async def _sandbox_call(tool: str, call: Awaitable[Any], path_field: str = "path", sandbox_id: str = "") -> Any:
    try:
        return await call
    except SandboxPaused:  # the library's text names its own resume(), and the jail's id, not this server's
        raise ToolError(
            f"{tool}: sandbox_id: {sandbox_id!r} is paused; resume it first, "
            f"e.g. resume_sandbox(sandbox_id={sandbox_id!r})"
        ) from None
    except SandboxError as exc:
        raise ToolError(f"{tool}: {_one_line(exc)}") from None
    except ValueError as exc:  # a path the jail cannot hold ('..', a NUL byte)
        raise _bad(tool, path_field, _one_line(exc)) from None


def build(options: Options, held: Sandboxes, http: bool) -> MCPServer[Any]:
    """The MCP server and its tools, over ``held``."""
    from .. import __version__

    server = _Server(
        "jailbox",
        version=__version__,
        instructions=(
            "Linux sandboxes for running untrusted commands. create_sandbox first, then run_command, "
            "read_file and write_file with its sandbox_id; kill_sandbox when done. checkpoint and rollback keep and "
            "restore a sandbox's files, fork_sandbox copies one, snapshot_sandbox keeps one past the session. "
            "Sandboxes end with the session."
        ),
        log_level="WARNING",
    )

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    async def create_sandbox(
        ctx: Context[Any, Any],
        template: Annotated[
            str | None,
            Field(
                description="'host' (this machine's system, read-only, the default) or a stored root filesystem's "
                "name; with a snapshot, the one it was made over"
            ),
        ] = None,
        network: Annotated[
            str, Field(description="'none' (loopback only), 'full', or 'allow:RULES' through a proxy")
        ] = "none",
        memory: Annotated[str | None, Field(description="memory cap, e.g. '512M' (default 2G)")] = None,
        cpus: Annotated[float | None, Field(description="CPU time per wall second, e.g. 1.5")] = None,
        pids: Annotated[int | None, Field(description="processes and threads at once (default 512)")] = None,
        disk: Annotated[str | None, Field(description="bytes the sandbox may write, e.g. '2G' (default 4G)")] = None,
        snapshot: Annotated[
            str | None, Field(description="a snapshot's id or name (list_snapshots) to start from, e.g. 'repo-ready'")
        ] = None,
    ) -> SandboxInfo:
        """Create a sandbox and return its sandbox_id. It lives until kill_sandbox or the end of the session."""
        tool = "create_sandbox"
        key = _session_key(ctx, http)
        if snapshot is not None:
            snap = await _from_snapshot(tool, snapshot, template)
            template, snapshot = snap.image, snap.id
        else:
            template = template if template is not None else "host"
            await asyncio.to_thread(_check_template, tool, template)
        policy = _network(tool, network, options)
        limits = _limits(tool, {"memory": memory, "cpus": cpus, "pids": pids, "disk": disk})
        try:
            config = SandboxConfig(
                rootfs=template, snapshot=snapshot, network=policy, limits=limits, output_limit=options.output_limit
            )
        except ValidationError as exc:
            raise _validation_error(tool, exc) from None
        made: _Held = await _sandbox_call(tool, held.create(key, config, template, network.strip()))
        return made.info

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def run_command(
        ctx: Context[Any, Any],
        sandbox_id: str,
        command: Annotated[str, Field(description="a shell command line (run by sh -c)")],
        timeout: Annotated[
            float, Field(description="seconds before the command's whole process tree is killed")
        ] = 60.0,
        cwd: Annotated[str | None, Field(description="working directory (default the sandbox's)")] = None,
    ) -> CommandResult:
        """Run a command in a sandbox; returns its exit code, stdout, stderr and whether it timed out."""
        tool = "run_command"
        target = held.get(tool, _session_key(ctx, http), sandbox_id)
        if not 0 < timeout <= options.max_timeout:
            raise _bad(tool, "timeout", f"{timeout} is outside 0 < timeout <= {options.max_timeout:g}")
        if not command.strip():
            raise _bad(tool, "command", "empty")
        result = await _sandbox_call(tool, target.box.exec(command, timeout=timeout, cwd=cwd), "cwd", sandbox_id)
        return CommandResult(
            exit_code=result.exit_code,
            signal=result.signal,
            stdout=result.stdout,
            stderr=result.stderr,
            timed_out=result.timed_out,
            stdout_dropped=result.stdout_dropped,
            stderr_dropped=result.stderr_dropped,
        )

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def read_file(
        ctx: Context[Any, Any],
        sandbox_id: str,
        path: Annotated[str, Field(description="absolute, or relative to the sandbox's working directory")],
        encoding: Annotated[Literal["text", "base64"], Field(description="'text' (UTF-8) or 'base64'")] = "text",
    ) -> FileContent:
        """Read a regular file from a sandbox (up to the server's limit, 1 MiB by default)."""
        tool = "read_file"
        target = held.get(tool, _session_key(ctx, http), sandbox_id)
        data: bytes = await _sandbox_call(tool, target.box.read_file(path, options.max_file), sandbox_id=sandbox_id)
        if encoding == "base64":
            return FileContent(path=path, encoding="base64", content=base64.b64encode(data).decode(), size=len(data))
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise _bad(tool, "encoding", "the file is not UTF-8 text; read it as 'base64'") from None
        return FileContent(path=path, encoding="text", content=text, size=len(data))

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False))
    async def write_file(
        ctx: Context[Any, Any],
        sandbox_id: str,
        path: Annotated[str, Field(description="absolute, or relative to the sandbox's working directory")],
        content: str,
        encoding: Annotated[Literal["text", "base64"], Field(description="how content is given")] = "text",
    ) -> Written:
        """Create or replace a file in a sandbox (parent directories are made; up to the server's limit)."""
        tool = "write_file"
        target = held.get(tool, _session_key(ctx, http), sandbox_id)
        data = _decode(tool, content, encoding, options.max_file)
        await _sandbox_call(tool, target.box.write_file(path, data), sandbox_id=sandbox_id)
        return Written(path=path, size=len(data))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def list_sandboxes(ctx: Context[Any, Any]) -> SandboxList:
        """The sandboxes this session holds."""
        return SandboxList(sandboxes=held.listed(_session_key(ctx, http)))

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def kill_sandbox(ctx: Context[Any, Any], sandbox_id: str) -> Killed:
        """Kill a sandbox: its processes end and its files are removed."""
        await held.kill(_session_key(ctx, http), sandbox_id)
        return Killed(sandbox_id=sandbox_id, killed=True)

    @server.tool(
        annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=False),
        description=(
            "Keep a sandbox's files as they are now, to roll back to later; returns a checkpoint_id. Processes "
            f"are not kept. At most {options.max_checkpoints} per sandbox; each holds a copy of what the sandbox "
            "wrote. The sandbox is paused only while its files are copied."
        ),
    )
    async def checkpoint(ctx: Context[Any, Any], sandbox_id: str) -> CheckpointMade:
        made = await held.checkpoint(_session_key(ctx, http), sandbox_id)
        return CheckpointMade(sandbox_id=sandbox_id, checkpoint_id=made)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def rollback(ctx: Context[Any, Any], sandbox_id: str, checkpoint_id: str) -> RolledBack:
        """Put a sandbox's files back as they were at a checkpoint. Every process running in it is ended
        (processes are not part of a checkpoint); later commands start fresh, with the same sandbox_id.
        Checkpoints taken after this one are dropped; this one stays, to roll back to again."""
        dropped = await held.rollback(_session_key(ctx, http), sandbox_id, checkpoint_id)
        return RolledBack(sandbox_id=sandbox_id, checkpoint_id=checkpoint_id, dropped=dropped)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def drop_checkpoint(ctx: Context[Any, Any], sandbox_id: str, checkpoint_id: str) -> CheckpointDropped:
        """Drop a checkpoint of a sandbox, freeing the disk it holds; the sandbox is untouched."""
        await held.drop_checkpoint(_session_key(ctx, http), sandbox_id, checkpoint_id)
        return CheckpointDropped(sandbox_id=sandbox_id, checkpoint_id=checkpoint_id, dropped=True)

    @server.tool(
        annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=False),
        description=(
            "Make count new sandboxes, each starting from a copy of this sandbox's files now, with its template, "
            "network and limits; returns their sandbox_ids. Each is separate (what one writes no other sees), "
            "counts in this session's sandboxes as one made by create_sandbox, and is killed on its own. "
            f"Processes are not copied; the sandbox forked keeps running. At most {options.max_sandboxes} "
            "sandboxes per session in all."
        ),
    )
    async def fork_sandbox(
        ctx: Context[Any, Any],
        sandbox_id: str,
        count: Annotated[int, Field(description="how many new sandboxes, e.g. 2")] = 1,
    ) -> Forked:
        made = await held.fork(_session_key(ctx, http), sandbox_id, count)
        return Forked(sandbox_id=sandbox_id, sandbox_ids=made)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False))
    async def pause_sandbox(ctx: Context[Any, Any], sandbox_id: str) -> PauseState:
        """Stop every process of a sandbox where it is, using no CPU, until resume_sandbox; its files and
        memory stay. Meanwhile run_command, read_file and write_file are refused, and a command already
        running waits without its timeout counting."""
        await held.pause("pause_sandbox", _session_key(ctx, http), sandbox_id, True)
        return PauseState(sandbox_id=sandbox_id, paused=True)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False))
    async def resume_sandbox(ctx: Context[Any, Any], sandbox_id: str) -> PauseState:
        """Continue a sandbox's processes where pause_sandbox stopped them."""
        await held.pause("resume_sandbox", _session_key(ctx, http), sandbox_id, False)
        return PauseState(sandbox_id=sandbox_id, paused=False)

    @server.tool(
        annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=False),
        description=(
            "Keep a sandbox's files as a durable snapshot, which outlives the sandbox, the session and the server; "
            "create_sandbox(snapshot=...) starts new sandboxes from it. Processes and /tmp are not kept. The "
            "snapshots are the server's user's, shared with every session of this server and the jailbox command; "
            "a name already given to one moves to the new one. The sandbox is paused only while its files are "
            f"copied. Refused while the store holds {options.max_snapshots}."
        ),
    )
    async def snapshot_sandbox(
        ctx: Context[Any, Any],
        sandbox_id: str,
        name: Annotated[
            str | None,
            Field(description="a name to start sandboxes from it by, e.g. 'repo-ready' (letters, digits, ._:/+@-)"),
        ] = None,
    ) -> SnapshotInfo:
        tool = "snapshot_sandbox"
        key = _session_key(ctx, http)
        if name is not None and (not SNAPSHOT_NAME.fullmatch(name) or SNAPSHOT_ID.fullmatch(name)):
            raise _bad(
                tool, "name", f"{name[:80]!r} is not a name: letters, digits and ._:/+@- up to 128, not a snapshot id"
            )
        return SnapshotInfo.of(await held.snapshot(key, sandbox_id, name))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def list_snapshots(ctx: Context[Any, Any]) -> SnapshotList:
        """The durable snapshots in the store, newest first (the server's user's, shared by every session)."""
        _session_key(ctx, http)
        found = await _store_call("list_snapshots", "ref", snapshots.list)
        kept = found[: options.max_listed]
        return SnapshotList(snapshots=[SnapshotInfo.of(s) for s in kept], left_out=len(found) - len(kept))

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def delete_snapshot(
        ctx: Context[Any, Any],
        ref: Annotated[str, Field(description="the snapshot's id or name, e.g. 'snap-0123456789ab' or 'repo-ready'")],
    ) -> SnapshotInfo:
        """Remove a durable snapshot from the store, for every session and the jailbox command; refused while a
        sandbox started from it runs."""
        tool = "delete_snapshot"
        _session_key(ctx, http)
        return SnapshotInfo.of(await _store_call(tool, "ref", snapshots.remove, _snapshot_ref(tool, "ref", ref)))

    return server


# --- transports ---------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    start = [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": text.encode() + b"\n"})


class Gate:
    """The HTTP server's outer layer: checks the token, turns the sessionless protocol era away, counts
    each session's requests (so an idle session can be ended), and ends a session's sandboxes once
    the client has ended it."""

    def __init__(self, app: App, held: Sandboxes, tokens: keys.Keys) -> None:
        self.app = app
        self.held = held
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme != "Bearer" or self.tokens.owner(token) is None:
            await _plain(
                send, 401, "jailbox mcp: send Authorization: Bearer <token>", [(b"www-authenticate", b"Bearer")]
            )
            return
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
        if version and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # The sessionless (2026) era has nothing for a sandbox to live and die with; refused at
            # the HTTP layer, a client falls back to the handshake, which opens a session.
            await _plain(send, 400, f"jailbox mcp serves sessions: use one of {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}")
            return
        key = headers.get(SESSION_HEADER.encode(), b"").decode("latin-1") or None
        status = 0

        async def watched(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        if key is None:
            await self.app(scope, receive, watched)
            return
        self.held.began(key)
        try:
            await self.app(scope, receive, watched)
        finally:
            self.held.finished(key)
        if scope.get("method") == "DELETE" and 200 <= status < 300:
            await self.held.end(key)


def _security(host: str) -> TransportSecuritySettings:
    """Host and Origin headers this server answers to: its own address (and localhost's names on loopback)."""
    shown = f"[{host}]" if ":" in host else host
    hosts = {f"{shown}:*"}
    if _is_loopback(host):
        hosts |= {"127.0.0.1:*", "localhost:*", "[::1]:*"}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(hosts),
        allowed_origins=sorted(f"http://{h}" for h in hosts),
    )


async def _closed(held: Sandboxes) -> None:
    """``held.close()`` run to the end even if the server is cancelled meanwhile (a second signal, the
    client's SIGTERM after closing the pipe): the cancellation is passed on once nothing is left."""
    closing, cancelled = await to_the_end(held.close())
    if cancelled:
        raise asyncio.CancelledError
    closing.result()


async def _die_of(held: Sandboxes, sig: int) -> None:
    await _closed(held)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


async def _serve_stdio(options: Options) -> None:
    held = Sandboxes(options)
    server = build(options, held, http=False)
    # The SDK reads stdin in a thread that no cancellation reaches while the client keeps the pipe
    # open, so a signal is not turned into a cancellation: the sandboxes are closed, then the
    # process dies of the signal it got.
    stopping: set[asyncio.Task[None]] = set()  # held here: the loop keeps only weak references to tasks

    def stop(sig: int) -> None:
        stopping.add(asyncio.ensure_future(_die_of(held, sig)))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await server.run_stdio_async()
    finally:
        await _closed(held)


async def _serve_http(
    options: Options, host: str, port: int, tokens: keys.Keys, token_path: Path, made: str | None
) -> None:
    import uvicorn

    held = Sandboxes(options)
    server = build(options, held, http=True)
    app = server.streamable_http_app(
        host=host,
        transport_security=_security(host),
        session_idle_timeout=options.idle_timeout,
        max_request_body_size=options.max_file * 4 // 3 + (64 << 10),  # a base64 write_file and its envelope
    )
    sock = bound(host, port)
    config = uvicorn.Config(Gate(app, held, tokens), log_level="warning", lifespan="on")
    # uvicorn stops gracefully on SIGINT and SIGTERM while it serves, then raises the signal again for
    # the handler it found: this one, which ends the serving task; before and after, the same handler
    # stops it. Either way the sandboxes are closed below.
    serving = asyncio.current_task()
    assert serving is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, serving.cancel)
    # Listening and stoppable before the URL is shown (the last line: a launcher waits for it): a client
    # that connects at once is queued until uvicorn accepts, and a stop at once is a clean one.
    sock.listen(2048)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/mcp"
    bearer = f"Bearer {made or f'<a token from {token_path}>'}"
    entry = {"mcpServers": {"jailbox": {"url": url, "headers": {"Authorization": bearer}}}}
    print(f"jailbox mcp: client config: {json.dumps(entry)}", file=sys.stderr)
    print(f"jailbox mcp: streamable HTTP at {url}", file=sys.stderr, flush=True)
    reaper = asyncio.ensure_future(held.reap_idle(options.idle_timeout))
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        sock.close()
        await _closed(held)


def main(
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8000,
    token_file: str | None = None,
    options: Options | None = None,
) -> None:
    """Serve until the client goes (stdio) or the process is stopped (SIGINT, SIGTERM; uvicorn stops
    the HTTP server gracefully, the stdio server dies of the signal); every sandbox is closed first."""
    options = options or Options()
    if not http:
        if token_file is not None or host != "127.0.0.1" or port != 8000:
            raise BadFlag("--http", "--host, --port and --token-file are for HTTP: add --http, e.g. jailbox mcp --http")
        asyncio.run(_serve_stdio(options))
    else:
        # A token even on loopback: any local user can connect there, and would run commands as this one.
        path, made = keys.given_or_made(Path(token_file) if token_file is not None else None, keys.MCP_TOKENS)
        if made is not None:  # now, not once listening: a start that cannot listen must not hide it
            print(f"jailbox mcp: made a token in {path} (shown only now): {made}", file=sys.stderr)
        tokens = keys.Keys(keys.load(path, "--token-file"))
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(_serve_http(options, host, port, tokens, path, made))
