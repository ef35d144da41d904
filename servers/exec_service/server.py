"""The per-user service that holds long-lived sandboxes, in its own detached process (``jailbox _service``).

It listens on a UNIX socket in the caller's state directory (0700, checked by ``state_dir()``) and
also refuses any peer whose uid or user namespace is not its own (a rootless jail runs as the same
uid). It holds ``Sandbox`` objects through their public API only, so each jail dies with this
process as any sandbox dies with its holder: after a crash,
``jailbox cleanup`` finds what is left (the state directory names this process as the owner).
It also keeps ``WARM`` sandboxes of the default configuration ready (a ``SandboxPool``) for
``jailbox exec -- CMD`` (``quick.py``): each runs one command and is closed, never reused; they do
not keep the service up.
It exits, closing every sandbox, once it has held no sandbox and served no client for ``idle``
seconds, and on SIGTERM or SIGINT. Every request is bounded and typed (``protocol.py``); a bad one
gets an error on its own connection and the service keeps serving the others.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from ...sandbox import Sandbox, SandboxConfig, SandboxPool
from ...sandbox.errors import SandboxError, ServerError
from ...sandbox.serving import ExecRun, start_ticks, state_dir
from . import protocol as p
from .quick import WARM, ServiceLock, context

POLL_MS = 200
LINGER = 5.0
BIND_LOCK = "service.bind"


@dataclass
class Held:
    sandbox: Sandbox
    name: str | None
    created: float = field(default_factory=time.time)

    def info(self) -> p.Info:
        alive = not self.sandbox.closed and start_ticks(self.sandbox.init_pid) is not None
        return p.Info(
            id=self.sandbox.id,
            name=self.name,
            rootfs=self.sandbox.config.rootfs,
            created=self.created,
            state=("paused" if self.sandbox.paused else "running") if alive else "dead",
            limits=self.sandbox.config.limits.model_dump(),
        )


class Refused(ServerError):
    """A request the service understood and turns down; the message is for the user."""


def default_config() -> SandboxConfig:
    """What ``jailbox exec`` with no option builds (``tests/test_cli_fast.py`` holds the two equal)."""
    return SandboxConfig()


class Service:
    def __init__(self, base: Path, idle: float, warm: bool = False) -> None:
        self.base = base
        self.idle = idle
        self.path = base / p.SOCKET_NAME
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}
        self.names: set[str] = set()  # taken, including by sandboxes still being created
        self.clients = 0
        self.quiet_since = time.monotonic()
        self.stopping = threading.Event()
        self.pool: SandboxPool | None = None  # made by the first run (or at once, with ``warm``)
        self.running: set[Sandbox] = set()  # the pool's sandboxes running a command, each its client's
        self.closing = False
        self.warm = warm

    # --- lifetime -----------------------------------------------------------------------------

    def serve(self) -> None:
        listener = self._listen()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: self.stopping.set())
        retired = False
        try:
            if self.warm:
                self._pool()
            while not self.stopping.is_set() and not retired:
                if wire_ready(listener, POLL_MS):
                    self._accept(listener)
                else:
                    retired = self._idle() and self._retire(listener)
        finally:
            if not retired:
                self.path.unlink(missing_ok=True)
            listener.close()
            self._close_all()

    def _listen(self) -> socket.socket:
        """Bind the socket, unless another service listens: probe, unlink and bind under a lock of
        their own, so of two services started at once the second finds the first listening."""
        with ServiceLock(self.base, name=BIND_LOCK):
            return self._bind()

    def _bind(self) -> socket.socket:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            probe.connect(str(self.path))
            raise SystemExit(f"jailbox: a service already listens on {self.path}")
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        finally:
            probe.close()
        try:
            os.unlink(self.path)  # a crashed service's socket
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(64)
        return listener

    def _idle(self) -> bool:
        with self.lock:
            if self.held or self.clients:
                self.quiet_since = time.monotonic()
                return False
            return time.monotonic() - self.quiet_since >= self.idle

    def _retire(self, listener: socket.socket) -> bool:
        """Stop listening, unless a client connected meanwhile: clients connect under the same lock,
        so one that got in is already queued on the listener and is served instead."""
        with ServiceLock(self.base, blocking=False) as got:
            if not got or wire_ready(listener, 0):
                return False
            os.unlink(self.path)
            return True

    def _close_all(self) -> None:
        with self.lock:
            self.closing = True
            held, self.held = list(self.held.values()), {}
            running, self.running = list(self.running), set()
        for sandbox in [h.sandbox for h in held] + running:
            sandbox.close()
        if self.pool is not None:
            self.pool.close()  # waits for a jail being built, then tears down the ready ones

    # --- connections --------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EINTR):
                return
            raise
        with self.lock:
            self.clients += 1
        threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                try:
                    if not own_peer(conn):
                        raise Refused("this service serves only its own user, outside any jail")
                    request = p.receive(conn, p.REQUEST)
                    if request is None:
                        return
                    if isinstance(request, p.Exec):
                        self._exec(conn, request)
                    elif isinstance(request, p.Run):
                        self._run(conn, request)
                    else:
                        p.send(conn, self._handle(request))
                except p.ProtocolViolation as exc:
                    p.send(conn, p.Error(ok=False, error=f"bad request: {exc}"))
                except Refused as exc:
                    p.send(conn, p.Error(ok=False, error=str(exc)))
                except (SandboxError, ValueError, OSError) as exc:  # ValueError: a bad env name, say
                    p.send(conn, p.Error(ok=False, error=str(exc)[:4000]))
                _linger(conn)
        except OSError:
            pass  # the client went away; nothing of its request is left half-done but its own exec, killed
        finally:
            with self.lock:
                self.clients -= 1
                self.quiet_since = time.monotonic()

    def _handle(self, request: p.Create | p.Copy | p.List | p.Stop | p.Pause | p.Fork | p.Snap) -> p.Ok:
        if isinstance(request, p.Create):
            return p.Ok(ok=True, id=self._create(request))
        if isinstance(request, p.Fork):
            return p.Ok(ok=True, made=self._fork(request))
        if isinstance(request, p.Snap):
            return p.Ok(ok=True, id=self._find(request.id).sandbox.snapshot(request.name).id)
        if isinstance(request, p.List):
            with self.lock:
                held = sorted(self.held.values(), key=lambda h: h.created)
            return p.Ok(ok=True, sandboxes=[h.info() for h in held])
        if isinstance(request, p.Stop):
            return p.Ok(ok=True, stopped=self._stop(request))
        if isinstance(request, p.Pause):
            sb = self._find(request.id).sandbox
            return p.Ok(ok=True, id=sb.id, changed=sb.pause() if request.op == "pause" else sb.resume())
        sb = self._find(request.id).sandbox
        if not os.path.isabs(request.host):
            raise Refused(f"host path {request.host!r} must be absolute")
        if request.op == "put":
            sb.put(request.host, request.jail)
        else:
            sb.get(request.jail, request.host)
        return p.Ok(ok=True)

    def _create(self, request: p.Create) -> str:
        try:
            config = SandboxConfig.model_validate(request.config)
        except (ValidationError, ValueError) as exc:
            raise Refused(f"bad sandbox configuration: {exc}") from None
        name = request.name
        with self.lock:
            if name is not None and (name in self.names or name in self.held):
                raise Refused(f"the name {name!r} is taken; pick another --name or jailbox stop {name}")
            if name is not None:
                self.names.add(name)
        try:
            sandbox = Sandbox(config)
        except BaseException:
            with self.lock:
                self.names.discard(name or "")
            raise
        with self.lock:
            self.held[sandbox.id] = Held(sandbox, name)
        return sandbox.id

    def _fork(self, request: p.Fork) -> list[str]:
        children = self._find(request.id).sandbox.fork(request.count)
        with self.lock:
            for child in children:
                self.held[child.id] = Held(child, None)
        return [child.id for child in children]

    def _find(self, ref: str) -> Held:
        with self.lock:
            for h in self.held.values():
                if ref in (h.name, h.sandbox.id):
                    return h
            matches = [h for sid, h in self.held.items() if sid.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise Refused(f"{ref!r} matches {len(matches)} sandboxes; give more of the id (jailbox ps lists them)")
        raise Refused(f"no sandbox {ref!r}; jailbox ps lists them")

    def _stop(self, request: p.Stop) -> list[str]:
        if request.all:
            with self.lock:
                targets = list(self.held.values())
        else:
            targets = [self._find(ref) for ref in request.ids]  # every id checked before any is stopped
        stopped = []
        for h in targets:
            with self.lock:
                if self.held.pop(h.sandbox.id, None) is None:
                    continue  # stopped by someone else meanwhile
                self.names.discard(h.name or "")
            h.sandbox.close()
            stopped.append(h.sandbox.id)
        return stopped

    # --- exec ---------------------------------------------------------------------------------

    def _exec(self, conn: socket.socket, request: p.Exec) -> None:
        sb = self._find(request.id).sandbox
        stream(conn, sb, request.argv, request.cwd, request.env, request.timeout, request.stdin)

    def _pool(self) -> SandboxPool:
        with self.lock:
            if self.closing:
                raise Refused("the service is stopping")
            if self.pool is None:
                self.pool = SandboxPool(size=WARM, config=default_config())
            return self.pool

    def _run(self, conn: socket.socket, request: p.Run) -> None:
        """A fresh sandbox from the pool for one command, then closed (its jail torn down in the
        pool's thread, after the client has its exit status)."""
        if request.context != context():
            raise Refused("this call's context (settings, limits, cgroup) is not the service's; run it in-process")
        sb = self._pool().acquire()
        with self.lock:
            stopping = self.closing
            if not stopping:
                self.running.add(sb)
        try:
            if stopping:
                raise Refused("the service is stopping")
            stream(conn, sb, request.argv, None, {}, None, True)
        finally:
            with self.lock:
                self.running.discard(sb)
            sb.close()


def stream(
    conn: socket.socket,
    sb: Sandbox,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str],
    timeout: float | None,
    stdin: bool,
) -> None:
    """Run ``argv`` in ``sb`` for the client on ``conn``: Ok once started, then output as it comes and
    the exit status (nothing more once the client went away: the command's tree is killed)."""
    feed = StdinFeed() if stdin else None
    gone = threading.Event()

    def forward(name: Literal["stdout", "stderr"]) -> Callable[[bytes], None]:
        def callback(data: bytes) -> None:
            if gone.is_set():
                return
            try:
                for i in range(0, len(data), p.CHUNK):
                    p.send(conn, p.Output(stream=name, data=p.encode(data[i : i + p.CHUNK])))
            except OSError:
                gone.set()

        return callback

    try:
        run = sb.begin_exec(
            argv,
            cwd=cwd,
            env=env,
            stdin=os.fdopen(feed.read_end, "rb", buffering=0, closefd=False) if feed else None,
            on_stdout=forward("stdout"),
            on_stderr=forward("stderr"),
        )
    except BaseException:
        if feed:
            feed.close()
        raise
    p.send(conn, p.Ok(ok=True, id=sb.id))  # started: the client may stream stdin now
    drive(run, conn, feed, timeout, gone)
    result = run.finish()
    if not gone.is_set():
        p.send(conn, p.Exited(exit=result.exit_code, signal=result.signal, timed_out=result.timed_out))


class StdinFeed:
    """The pipe a streamed command reads as stdin; the pipe's own buffer is the only one."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.write_end, False)
        self.pending = b""

    def end(self) -> None:
        """No more input: the command reads EOF once it has taken what the pipe holds."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1
        self.pending = b""

    def flush(self) -> None:
        """Write what is pending; a command that stopped reading (``head -n1``) ends the feed quietly."""
        try:
            written = os.write(self.write_end, self.pending)
            self.pending = self.pending[written:]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.end()

    def close(self) -> None:
        """Once the command is done (the run reads the pipe's other end until then)."""
        self.end()
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1


def drive(
    run: ExecRun, conn: socket.socket, feed: StdinFeed | None, timeout: float | None, gone: threading.Event
) -> None:
    """Run the command to its end: output out, stdin in (the next message is taken only once the last
    has gone into the pipe, so a command that does not read holds the client back, not our memory),
    the timeout kept. A client that goes away (Ctrl-C) has the command's whole tree killed."""
    deadline = None if timeout is None else run.started + timeout
    client = conn.fileno()
    try:
        while not run.done:
            if gone.is_set() and not run.killed:
                run.kill()
            wanted = {fd: select.POLLIN for fd in run.readers} | {fd: select.POLLOUT for fd in run.writers}
            if not gone.is_set():
                taking = feed is not None and feed.write_end >= 0 and not feed.pending
                wanted[client] = select.POLLIN if taking else 0  # 0: still told when the client hangs up
                if feed is not None and feed.pending:
                    wanted[feed.write_end] = select.POLLOUT
            poller = select.poll()
            for fd, mask in wanted.items():
                poller.register(fd, mask)
            now = time.monotonic()
            deadline = run.check_deadline(deadline, now)
            wait = POLL_MS if deadline is None else max(0, min(POLL_MS, int((deadline - now) * 1000) + 1))
            for fd, events in poller.poll(wait):
                if fd == client:
                    _from_client(conn, events, feed, gone)
                elif feed is not None and fd == feed.write_end:
                    feed.flush()
                else:
                    run.on_ready(fd)
    except BaseException:
        run.abandon()
        raise
    finally:
        if feed is not None:
            feed.close()


def _from_client(conn: socket.socket, events: int, feed: StdinFeed | None, gone: threading.Event) -> None:
    if not events & select.POLLIN:
        gone.set()  # hung up, or an error on the socket
        return
    try:
        message = p.receive(conn, p.STREAM)
    except (OSError, p.ProtocolViolation):
        message = None
    if message is None or feed is None:
        gone.set()  # went away, or sent what this request does not take
    elif isinstance(message, p.Eof):
        feed.end()
    elif feed.write_end >= 0:
        feed.pending = p.decode_data(message.data)


def _linger(conn: socket.socket) -> None:
    """Close after the client has read our last message: closing with its stdin still unread would
    reset the connection, and the client would lose that message (an error, an exit status)."""
    conn.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + LINGER
    while wire_ready(conn, int(max(0.0, deadline - time.monotonic()) * 1000)):
        try:
            if not conn.recv(p.MAX_MESSAGE):
                return
        except OSError:
            return
        if time.monotonic() >= deadline:
            return


def wire_ready(sock: socket.socket, timeout_ms: int) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return bool(poller.poll(timeout_ms))
    except InterruptedError:
        return False


def own_peer(conn: socket.socket) -> bool:
    """The peer is our user in our user namespace. A jail whose filesystem shows the socket (a bind of
    the state directory, or one under ``/usr``) runs rootless as the same uid, and only the namespace
    tells it apart; a peer whose namespace cannot be read (gone, or not dumpable) is refused."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid() or pid <= 0:
        return False
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/user"), os.stat("/proc/self/ns/user")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def main(idle: float, warm: bool = False) -> None:
    """``warm``: fill the pool at once (the fast path started this service, for the calls to come)."""
    base = state_dir()
    os.chdir("/")  # hold no directory of the client's busy
    for name in os.listdir("/proc/self/fd"):  # the start lock quick.py hands over: ours, not a child's
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(int(name), False)
    Service(base, idle, warm).serve()
