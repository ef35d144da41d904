"""The code interpreter of an E2B sandbox (port 49999), served for jailbox sandboxes from the host.

Runs in the serving host process, on a request's thread (and, for ``/execute``, one reader thread per
run). The unmodified ``e2b-code-interpreter`` SDK reaches it as E2B's Jupyter front: a request names
its sandbox (``E2b-Sandbox-Id`` or the ``49999-<id>.<domain>`` host) and the port (``E2b-Sandbox-Port:
49999`` or that host), and carries the sandbox's access token (``X-Access-Token``, which ``/execute``
sends) or its traffic access token (``E2B-Traffic-Access-Token``, which every call sends once the
create answer names one; the server always does). Without either it is answered exactly as a sandbox
that does not exist. Served: ``POST /execute`` streaming one JSON object a line (e2b's records, a
``keepalive`` line every ``KEEPALIVE`` seconds of silence so a client that went away is noticed and
its run interrupted), and ``/contexts`` create, list, restart and remove, all through the library's
``Sandbox.stream_code`` and context calls.

What a client sends is bounded before it is parsed (``connect._check_json``: tokens and depth); a run
has no time limit of its own (the SDK's ``timeout`` is its read deadline: past it the client closes,
and the run is interrupted), so the sandbox's lifetime bounds it. Lines of a run wait for a slow
client in a queue of ``QUEUED`` records at most. Every failure is an HTTP status the SDK turns into
its own exception (400 bad input, 404 no such context, 502 no such sandbox, 503 the interpreter
cannot run), never a 500; a sandbox killed during a run breaks the stream, as E2B's does, so the SDK
raises its "sandbox was killed" error.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from email.message import Message
from http import HTTPStatus
from typing import Any

from ...sandbox.errors import InterpreterError, SandboxError, ServerError
from ...sandbox.serving import Store, check_env
from .connect import RpcError, _check_json
from .httpd import IDLE, Request, Response
from .registry import MAX_ENV, Registry, Served

PORT = "49999"
HOST = re.compile(r"^49999-")
KEEPALIVE = 5.0
"""Seconds of silence in a run before a ``keepalive`` line: a write is how a client gone is noticed."""
QUEUED = 64
"""Records of a run held for a client slower than the kernel (each at most the library's line bound)."""
LANGUAGES = ("python",)
SDK_TEMPLATE = "code-interpreter-v1"
"""What e2b-code-interpreter's ``Sandbox.create()`` asks for when its caller names no template."""
TREE = "code-interpreter"
"""The stored tree that template means where the server has it (``rootfs/code-interpreter.yaml``)."""
NOT_FOUND = "sandbox {} was not found (or the request carried neither its access token nor its traffic access token)"


def addressed(headers: Message) -> bool:
    """Whether a request for a sandbox is for its code interpreter rather than its daemon."""
    return (headers.get("E2b-Sandbox-Port") or "").strip() == PORT or bool(HOST.match(headers.get("Host") or ""))


def traffic_token(served: Served) -> str:
    """The sandbox's traffic access token: derived from its access token, so a sandbox kept across a
    server restart keeps it, and it opens the interpreter only, never the daemon."""
    return hmac.new(served.access_token.encode(), b"e2b traffic access token", hashlib.sha256).hexdigest()


def template(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A create request's body, its ``SDK_TEMPLATE`` made the ``code-interpreter`` tree if it is
    stored, else the host's (whose Python has a kernel where ipykernel is installed); and whether it
    was ``SDK_TEMPLATE``, the code-interpreter SDK's, whose sandbox gets its kernel started at once."""
    if body.get("templateID") != SDK_TEMPLATE:
        return body, False
    return {**body, "templateID": TREE if Store().resolve(TREE) is not None else "host"}, True


def find(registry: Registry, sandbox_id: str, headers: Message, wake: bool = False) -> Served | None:
    """The sandbox a request names, if it carries its access token or its traffic token."""
    served = registry.by_token(sandbox_id, headers.get("X-Access-Token"), wake)
    token = headers.get("E2B-Traffic-Access-Token")
    if served is None and token is not None:
        with registry.lock:
            named = registry.served.get(sandbox_id)
        if named is not None and hmac.compare_digest(traffic_token(named).encode(), token.encode()):
            served = registry.by_token(sandbox_id, named.access_token, wake)  # paused and resumed as the daemon's
    return served


def _text(status: int, message: str) -> Response:
    """An error as E2B's Jupyter front sends it: plain text, which the Python SDK puts in its exception;
    the JavaScript SDK shows only the status line, so its reason phrase says it too."""
    return Response(
        status, message.encode(), "text/plain; charset=utf-8", reason=f"{HTTPStatus(status).phrase}: {message}"
    )


def _json(obj: object) -> Response:
    return Response(200, json.dumps(obj).encode(), "application/json")


class BadRequest(ServerError):
    pass


def _body(request: Request) -> dict[str, Any]:
    if not request.body:
        return {}
    try:
        _check_json(request.body)
        body = json.loads(request.body)
    except RpcError as exc:
        raise BadRequest(str(exc)) from None
    except (ValueError, RecursionError):
        raise BadRequest('the request body must be JSON, e.g. {"code": "1 + 1"}') from None
    if not isinstance(body, dict):
        raise BadRequest('the request body must be a JSON object, e.g. {"code": "1 + 1"}')
    return body


def _optional(body: dict[str, Any], name: str, example: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string, e.g. {example}")
    return value


def _language(body: dict[str, Any]) -> str | None:
    language = _optional(body, "language", '"language": "python"')
    if language is not None and language.strip().lower() not in LANGUAGES:
        raise BadRequest(
            f"language {language[:40]!r} has no kernel in jailbox serve: only Python runs here "
            "(language='python', or none)"
        )
    return None if language is None else "python"


def _envs(body: dict[str, Any]) -> dict[str, str] | None:
    envs = body.get("env_vars")
    if envs is None:
        return None
    if not isinstance(envs, dict) or len(envs) > MAX_ENV or not all(isinstance(v, str) for v in envs.values()):
        raise BadRequest(f'env_vars must map at most {MAX_ENV} names to strings, e.g. {{"MODE": "test"}}')
    try:
        return check_env(envs)
    except ValueError as exc:
        raise BadRequest(f'env_vars: {exc} (e.g. {{"MODE": "test"}})') from None


def handle(registry: Registry, sandbox_id: str, request: Request) -> Response:
    served = find(registry, sandbox_id, request.headers, wake=True)
    if served is None:
        return _text(502, NOT_FOUND.format(sandbox_id[:64]))
    path, method = request.path, request.method
    parts = path.strip("/").split("/")
    try:
        if path == "/health" and method == "GET":
            return _json("OK")
        if path == "/execute" and method == "POST":
            return _execute(registry, served, _body(request))
        if path == "/contexts" and method == "POST":
            body = _body(request)
            cwd = _optional(body, "cwd", '"cwd": "/tmp"')
            if cwd is not None and not cwd.startswith("/"):
                raise BadRequest(f'cwd must be an absolute path, e.g. "cwd": "/tmp", not {cwd[:80]!r}')
            context = served.sandbox.create_code_context(cwd or None, _language(body))
            return _json(context.model_dump())
        if path == "/contexts" and method == "GET":
            return _json([c.model_dump() for c in served.sandbox.list_code_contexts()])
        if parts[0] == "contexts" and len(parts) in (2, 3):
            context_id = parts[1]
            if len(parts) == 3 and parts[2] == "restart" and method == "POST":
                _known(served, context_id)
                served.sandbox.restart_code_context(context_id)
                return _json(None)
            if len(parts) == 2 and method == "DELETE":
                _known(served, context_id)
                served.sandbox.remove_code_context(context_id)
                return _json(None)
    except BadRequest as exc:
        return _text(400, str(exc))
    except LookupError as exc:
        return _text(404, str(exc))
    except InterpreterError as exc:  # no kernel in the tree (naming the packages), or one that broke
        return _text(503, str(exc))
    except SandboxError as exc:
        return _text(502, f"sandbox {served.id} stopped: {exc}")
    return _text(404, f"{method} {path[:200]} is not served by jailbox's code interpreter")


def _known(served: Served, context_id: str) -> None:
    if context_id not in {c.id for c in served.sandbox.list_code_contexts()}:
        raise LookupError(f"Context {context_id[:80]} not found")


def _execute(registry: Registry, served: Served, body: dict[str, Any]) -> Response:
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequest('code must be a string, e.g. {"code": "1 + 1"}')
    context = _optional(body, "context_id", '"context_id": "<a context\'s id>"')
    language = _language(body)
    if context is not None and language is not None:
        raise BadRequest("give context_id or language, not both")
    envs = _envs(body)
    if context is not None:
        _known(served, context)
    records = served.sandbox.stream_code(code, language, context, envs, timeout=0)  # starts the interpreter
    return Response(200, _Run(registry, served, records, context).lines(), "application/x-ndjson")


class _Run:
    """One ``/execute``: a thread reads the run's records into a bounded queue, and the response's
    lines come from the queue, with a keepalive whenever it stays empty ``KEEPALIVE`` seconds."""

    def __init__(self, registry: Registry, served: Served, records: Iterator[Any], context: str | None) -> None:
        self.registry, self.served, self.records, self.context = registry, served, records, context
        self.queue: queue.Queue[bytes | None] = queue.Queue(QUEUED)
        self.gone = threading.Event()  # the client went away
        self.killed = False  # the sandbox was closed during the run
        self.over = False  # the run's last record was read
        self.thread = threading.Thread(target=self._read, name=f"jailbox-serve-execute-{served.id}", daemon=True)
        self.thread.start()

    def _put(self, line: bytes | None) -> bool:
        """Queue a line for the client; False once it went away, or read nothing for ``IDLE`` seconds
        (as a write to it would time out; a reply never sent is never closed, so this is the bound)."""
        deadline = time.monotonic() + IDLE
        while not self.gone.is_set() and time.monotonic() < deadline:
            try:
                self.queue.put(line, timeout=KEEPALIVE)
                return True
            except queue.Full:
                continue
        self.gone.set()
        return False

    def _read(self) -> None:
        try:
            for record in self.records:
                if self.gone.is_set():
                    # drained to the run's end, not closed: closing early makes the library interrupt
                    # the context once more, and that interrupt would hit the context's next run
                    continue
                line = record.model_dump(mode="json", by_alias=True, exclude_none=True)
                if line["type"] in ("stdout", "stderr"):  # the SDK reads a stream's timestamp unconditionally
                    line.setdefault("timestamp", datetime.now(timezone.utc).isoformat())
                self._put(json.dumps(line).encode() + b"\n")
            self.over = True
        except (InterpreterError, SandboxError) as exc:
            with self.registry.lock:
                self.killed = self.registry.served.get(self.served.id) is not self.served
            if not self.killed:  # as E2B's front says a run it lost: an error, then the end
                error = {"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": ""}
                self._put(json.dumps(error).encode() + b"\n")
                self._put(b'{"type": "end_of_execution"}\n')
        finally:
            self._put(None)

    def lines(self) -> Iterator[bytes]:
        ended = False
        try:
            while True:
                try:
                    line = self.queue.get(timeout=KEEPALIVE)
                except queue.Empty:
                    yield b'{"type": "keepalive"}\n'
                    continue
                if line is None:
                    ended = True
                    break
                yield line
            if self.killed:
                # E2B's proxy drops the connection of a sandbox that dies: the SDK then asks whether the
                # sandbox runs and raises its "sandbox was killed" error. An OSError here makes the HTTP
                # layer close the connection without the stream's last chunk.
                raise ConnectionAbortedError(f"sandbox {self.served.id} was closed during the run")
        finally:
            if not ended:  # the client went away: interrupt what runs, and the reader ends with it
                self.gone.set()
            if not ended and not self.over:
                try:
                    self.served.sandbox.interrupt_code(self.context)
                except SandboxError:
                    pass
