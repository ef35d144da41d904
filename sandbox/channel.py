"""Host side of a jail's control socket: fire-and-forget sends and calls with private replies.

What goes out is one of ``child/requests.py``'s typed requests; what comes back is read through the
bounded models of ``messages.py`` (the init is untrusted).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import TypeVar

from pydantic import ValidationError

from .child.requests import Request
from .errors import ProtocolError, SandboxClosed, SandboxFileError
from .floor import wire
from .messages import Failure, Reply

M = TypeVar("M", bound=Reply)
CALL_TIMEOUT = 60.0


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, req: Request, fds: list[int] | tuple[int, ...] = ()) -> None:
        try:
            wire.send(self.sock, req.to_wire(), fds)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (
                errno.EPIPE,
                errno.ECONNRESET,
                errno.EBADF,
                errno.ENOTCONN,
            ):
                raise
            raise SandboxClosed("the sandbox is closed or its init died") from exc

    def open_call(self, req: Request, fds: list[int] | tuple[int, ...] = ()) -> socket.socket:
        """Send ``req`` with a fresh reply socket; return our end of it."""
        mine, theirs = wire.seqpacket_pair()
        try:
            self.send(req, [*fds, theirs.fileno()])
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    def call(self, req: Request, model: type[M], max_fds: int = 0, path: str | None = None) -> tuple[M, list[int]]:
        with self.open_call(req) as reply:
            if not wire.wait_readable(reply, CALL_TIMEOUT):
                raise ProtocolError(f"no answer to {req.OP} within {CALL_TIMEOUT:.0f}s")
            return parse_reply(reply, model, max_fds, path)


def parse_reply(reply: socket.socket, model: type[M], max_fds: int, path: str | None) -> tuple[M, list[int]]:
    try:
        msg = wire.recv(reply, max_fds=max_fds, max_bytes=model.WIRE_LIMIT)
    except wire.WireError as exc:
        raise ProtocolError(str(exc)) from exc
    if msg is None:
        raise SandboxClosed("the sandbox's init closed the request without an answer")
    obj, fds = msg
    try:
        if obj.get("ok") is False:
            fail = Failure.model_validate(obj)
            raise SandboxFileError(fail.errno or errno.EIO, fail.error or "failed", path)
        return model.model_validate(obj), fds
    except ValidationError as exc:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"malformed reply from the jail: {exc.errors()[:1]}") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
