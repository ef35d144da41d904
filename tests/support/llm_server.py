"""A real HTTP server on 127.0.0.1 that plays a script of replies, so the LLM client is tested over real sockets."""

from __future__ import annotations

import itertools
import json
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Step:
    """One scripted reply: a status with a JSON or raw body, after ``delay`` seconds; or, with ``drop``, a
    connection closed without any response.

    A hostile server's reply has a ``stream`` instead: its body in pieces, made as they are written (a body of
    any size costs the server nothing), framed by ``length`` (a Content-Length, true or not), else chunked, or
    with ``close`` by the connection's end; ``gap`` seconds pass between writes, and with ``trickle_head`` the
    status line and headers are written a byte at a time too."""

    status: int = 200
    json: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    stream: Callable[[], Iterable[bytes]] | None = None
    length: int | None = None
    close: bool = False
    gap: float = 0.0
    trickle_head: bool = False


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


MiB = 1 << 20
COMPLETION_HEAD = b'{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "'
COMPLETION_TAIL = b'"}}]}'


def filler(size: int, head: bytes = COMPLETION_HEAD, tail: bytes = COMPLETION_TAIL) -> Callable[[], Iterator[bytes]]:
    """A body of ``head``, ``size`` bytes of "a" (whole MiB) and ``tail``: by default a chat completion whose
    content is one giant string."""

    def pieces() -> Iterator[bytes]:
        yield head
        yield from itertools.repeat(b"a" * MiB, size // MiB)
        yield tail

    return pieces


def filled(size: int, head: bytes = COMPLETION_HEAD, tail: bytes = COMPLETION_TAIL) -> int:
    """The length of ``filler``'s body, for a Content-Length that tells the truth."""
    return len(head) + size // MiB * MiB + len(tail)


def gzipped(size: int, head: bytes = COMPLETION_HEAD, tail: bytes = COMPLETION_TAIL) -> bytes:
    """``filler``'s body gzipped, made without compressing it all: one MiB compressed after a full flush (so
    nothing in it refers back past it) and repeated; a GiB takes a MiB."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(b"a" * MiB) + deflate.flush(zlib.Z_FULL_FLUSH)
    last = deflate.compress(tail) + deflate.flush()
    crc = zlib.crc32(head)
    for _ in range(size // MiB):
        crc = zlib.crc32(b"a" * MiB, crc)
    crc = zlib.crc32(tail, crc)
    total = len(head) + size // MiB * MiB + len(tail)
    trailer = crc.to_bytes(4, "little") + (total % (1 << 32)).to_bytes(4, "little")
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + first + block * (size // MiB) + last + trailer


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Step:
    """An OpenAI-shaped error reply."""
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    return Step(status=status, json=body, headers=headers or {})


class ScriptedServer:
    """Answers each request with the next step of its script and records it; when the script runs out it
    answers 410, which the client never retries, so a test that asks too often fails loudly. It listens
    on ``port`` (default: any free one)."""

    def __init__(
        self, steps: Iterable[Step] = (), responder: Callable[[Any], Step] | None = None, port: int = 0
    ) -> None:
        self.responder = responder  # answers from the request itself once the script is used up
        self.requests: list[Recorded] = []
        self._steps: deque[Step] = deque(steps)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
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
                if step.stream is not None:
                    self._stream(step)
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

            def _stream(self, step: Step) -> None:
                """A reply written piece by piece as ``step`` says; the connection closes after it."""
                self.close_connection = True
                chunked = step.length is None and not step.close
                headers = {"Content-Type": "application/json", **step.headers}
                if step.length is not None:
                    headers["Content-Length"] = str(step.length)
                elif chunked:
                    headers["Transfer-Encoding"] = "chunked"
                lines = [f"HTTP/1.1 {step.status} OK", *(f"{name}: {value}" for name, value in headers.items())]
                head = ("\r\n".join(lines) + "\r\n\r\n").encode()
                body = (b"%x\r\n%s\r\n" % (len(p), p) if chunked else p for p in step.stream() if p)
                pieces = itertools.chain(
                    (head[n : n + 1] for n in range(len(head))) if step.trickle_head else [head],
                    body,
                    [b"0\r\n\r\n"] if chunked else [],
                )
                try:
                    for piece in pieces:
                        self.wfile.write(piece)
                        if step.gap and server._closing.wait(step.gap):
                            return
                except OSError:  # the client stopped reading: what a bounded client does
                    return

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
