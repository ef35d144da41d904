"""The ``jailbox`` side of the per-user service, in the user's process: find it (or start it), send one
request per connection, read the typed replies.

Clients connect under a lock file in the state directory, and the service retires under the same
lock, so two ``jailbox create`` at once start one service and a connection is never made to a
service that is about to exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import TypeAdapter

from ...sandbox.errors import SandboxError
from ...sandbox.serving import state_dir
from . import protocol as p
from .quick import DEFAULT_IDLE, IDLE_ENV, ServiceLock, service_argv, try_connect

START_TIMEOUT = 30.0


class ServiceError(SandboxError):
    """The service refused a request, could not be reached or started, or answered nonsense."""


def idle_timeout() -> float:
    """Seconds the service lingers with no sandbox and no client ($JAILBOX_SERVICE_IDLE, default 300)."""
    raw = os.environ.get(IDLE_ENV, "")
    if not raw:
        return DEFAULT_IDLE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1e7:
        raise ServiceError(f"JAILBOX_SERVICE_IDLE={raw!r}: expected seconds, e.g. JAILBOX_SERVICE_IDLE=300")
    return value


class Connection:
    """One request's connection to the service."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.sock.close()

    def call(self, request: p.Create | p.Copy | p.List | p.Stop | p.Pause | p.Fork | p.Snap) -> p.Ok:
        p.send(self.sock, request)
        return _ok(self._receive(p.REPLY))

    def _receive(self, adapter: TypeAdapter[Any]) -> object:
        try:
            reply = p.receive(self.sock, adapter)
        except p.ProtocolViolation as exc:
            raise ServiceError(f"the service answered nonsense: {exc}") from None
        except OSError as exc:
            raise ServiceError(f"lost the service: {exc}") from None
        if reply is None:
            raise ServiceError(f"the service closed the connection (see {state_dir() / p.LOG_NAME})")
        return reply

    def exec(
        self,
        request: p.Exec,
        stdin: int | None,
        on_output: Callable[[str, bytes], None],
    ) -> p.Exited:
        """Send ``request``, stream descriptor ``stdin`` from a thread (blocking sends: the service takes
        the next chunk only once the command has read the last), hand output over as it comes. The
        thread reads the raw descriptor: a buffered file's lock would hold up the interpreter's exit."""
        p.send(self.sock, request)
        _ok(self._receive(p.REPLY))
        if stdin is not None:
            threading.Thread(target=self._pump, args=(stdin,), daemon=True).start()
        while True:
            reply = self._receive(p.EXEC_REPLY)
            if isinstance(reply, p.Output):
                try:
                    data = p.decode_data(reply.data)
                except p.ProtocolViolation as exc:
                    raise ServiceError(f"the service answered nonsense: {exc}") from None
                on_output(reply.stream, data)
            elif isinstance(reply, p.Exited):
                return reply
            else:
                _ok(reply)  # an Error: raises

    def _pump(self, stdin: int) -> None:
        try:
            while True:
                data = os.read(stdin, p.CHUNK)
                if not data:
                    break
                p.send(self.sock, p.Input(op="stdin", data=p.encode(data)))
            p.send(self.sock, p.Eof(op="eof"))
        except (OSError, ValueError):
            pass  # the command ended, or the connection did: the exit status says which


def _ok(reply: object) -> p.Ok:
    if isinstance(reply, p.Error):
        raise ServiceError(reply.error)
    if not isinstance(reply, p.Ok):
        raise ServiceError(f"the service answered {type(reply).__name__} where a result was due")
    return reply


def connect(start: bool) -> Connection | None:
    """A connection to this user's service; with ``start``, one is started if none runs, else None."""
    base = state_dir()
    with ServiceLock(base):
        sock = _try_connect(base)
        if sock is None and start:
            sock = _start(base)
    return Connection(sock) if sock is not None else None


def remove_stale_socket() -> Path | None:
    """Remove the socket a killed service left (``jailbox cleanup``); returns its path if it did."""
    base = state_dir()
    path = base / p.SOCKET_NAME
    with ServiceLock(base):
        if not path.is_socket():
            return None
        sock = _try_connect(base)
        if sock is not None:
            sock.close()
            return None
        path.unlink()
        return path


def _try_connect(base: Path) -> socket.socket | None:
    try:
        return try_connect(base)
    except OSError as exc:
        raise ServiceError(f"cannot reach the service at {base / p.SOCKET_NAME}: {exc}") from None


def _start(base: Path) -> socket.socket:
    """Start ``jailbox _service`` detached (its own session, no terminal), and wait until it listens."""
    log_path = base / p.LOG_NAME
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            service_argv(idle_timeout(), warm=False),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "JAILBOX_STATE_DIR": str(base)},
        )
    finally:
        os.close(log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _try_connect(base)
        if sock is not None:
            return sock
        if proc.poll() is not None:
            sock = _try_connect(base)  # it lost the race to one that fast exec started: that one listens
            if sock is not None:
                return sock
            break
        time.sleep(0.05)
    tail = log_path.read_text(errors="replace")[-2000:].strip()
    if proc.poll() is None:
        proc.kill()
    raise ServiceError(f"the jailbox service did not start: {tail or 'no output'} (log: {log_path})")
