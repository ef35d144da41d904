"""A real HTTP server on 127.0.0.1 that plays a script of replies, so the LLM client is tested over real sockets."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Step:
    """One scripted reply: a status with a JSON or raw body, after ``delay`` seconds; or, with ``drop``, a
    connection closed without any response."""

    status: int = 200
    json: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


DROP = Step(drop=True)


@dataclass(frozen=True)
class Recorded:
    """A request as the server saw it; header names are lower-cased, ``json`` is None when the body was not JSON."""

    path: str
    headers: dict[str, str]
    json: Any


def reply(
    content: str | None = "ok", *, usage: dict[str, int] | None = None, finish_reason: str = "stop", **fields: Any
) -> Step:
    """A 200 chat completion whose assistant message has ``content`` plus any other ``fields``."""
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content, **fields}, "finish_reason": finish_reason}
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return Step(json=body)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Step:
    """An OpenAI-shaped error reply."""
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    return Step(status=status, json=body, headers=headers or {})


class ScriptedServer:
    """Answers each request with the next step of its script and records it; when the script runs out it
    answers 410, which the client never retries, so a test that asks too often fails loudly."""

    def __init__(self, steps: Iterable[Step] = (), responder: Callable[[Any], Step] | None = None) -> None:
        self.responder = responder  # answers from the request itself once the script is used up
        self.requests: list[Recorded] = []
        self._steps: deque[Step] = deque(steps)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def add(self, *steps: Step) -> None:
        with self._lock:
            self._steps.extend(steps)

    def _next(self, recorded: Recorded) -> Step:
        with self._lock:
            self.requests.append(recorded)
            if self._steps:
                return self._steps.popleft()
        if self.responder is not None:
            return self.responder(recorded.json)
        return Step(status=410, json={"error": "script exhausted"})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    parsed = None
                headers = {name.lower(): value for name, value in self.headers.items()}
                step = server._next(Recorded(self.path, headers, parsed))
                if step.delay:
                    server._closing.wait(step.delay)
                if step.drop:
                    self.close_connection = True
                    return
                payload = step.raw if step.raw is not None else json.dumps(step.json).encode()
                try:
                    self.send_response(step.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in step.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: pytest shows what matters."""

        return Handler

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
