"""Connect RPC over HTTP/1.1, server side: unary and server-streaming calls, protobuf binary or JSON.

Runs in the serving host process, on the thread of one HTTP request. Every request body arrives
already bounded by the HTTP layer; this module bounds what it decodes from it too (one message per
unary call, one envelope per server-streaming request, gzip inflated to at most ``MAX_MESSAGE``).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

MAX_MESSAGE = 16 << 20
"""Largest message a client may send, after decompression."""

FLAG_COMPRESSED = 0x01
FLAG_END = 0x02

HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

M = TypeVar("M", bound=Message)


class RpcError(Exception):
    """An RPC that ends with a Connect error code (one of ``HTTP_STATUS``) and a message for the client."""

    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(message)
        self.code = code
        self.message = message

    def json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def inflate(data: bytes, encoding: str) -> bytes:
    """``data`` as sent with ``encoding`` (identity or gzip), refusing more than ``MAX_MESSAGE`` inflated."""
    if encoding in ("", "identity"):
        return data
    if encoding != "gzip":
        raise RpcError("unimplemented", f"compression {encoding!r} is not supported (use gzip or none)")
    out = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = out.decompress(data, MAX_MESSAGE + 1)
    except zlib.error as exc:
        raise RpcError("invalid_argument", f"bad gzip body: {exc}") from None
    if len(data) > MAX_MESSAGE or out.unconsumed_tail:
        raise RpcError("resource_exhausted", f"message larger than {MAX_MESSAGE} bytes")
    return data


@dataclass(frozen=True)
class Codec:
    """Protobuf's binary or JSON form: the client picks one by content type; replies use the same."""

    name: str  # "proto" or "json"

    @property
    def unary_type(self) -> str:
        return f"application/{self.name}"

    @property
    def stream_type(self) -> str:
        return f"application/connect+{self.name}"

    def decode(self, kind: type[M], data: bytes) -> M:
        msg = kind()
        try:
            if self.name == "json":
                json_format.Parse(data.decode(), msg, ignore_unknown_fields=True, max_recursion_depth=32)
            else:
                msg.ParseFromString(data)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as exc:
            raise RpcError("invalid_argument", f"cannot decode {kind.DESCRIPTOR.full_name}: {exc}") from None
        return msg

    def encode(self, msg: Message) -> bytes:
        if self.name == "json":
            return json_format.MessageToJson(msg, indent=None).encode()
        return msg.SerializeToString()


def codec_for(content_type: str, stream: bool) -> Codec:
    base = content_type.split(";")[0].strip().lower()
    prefix = "application/connect+" if stream else "application/"
    if base in (prefix + "proto", prefix + "json"):
        return Codec(base[len(prefix) :])
    raise RpcError("unimplemented", f"content type {content_type!r} is not served; use {prefix}proto or {prefix}json")


def unary_request(kind: type[M], body: bytes, content_type: str, encoding: str) -> tuple[M, Codec]:
    """The request message of a unary call, and the codec to answer in."""
    codec = codec_for(content_type, stream=False)
    return codec.decode(kind, inflate(body, encoding)), codec


def stream_request(kind: type[M], body: bytes, content_type: str, encoding: str) -> tuple[M, Codec]:
    """The single request message of a server-streaming call (one envelope, nothing after it), and the
    codec to answer in."""
    codec = codec_for(content_type, stream=True)
    if len(body) < 5:
        raise RpcError("invalid_argument", "a streaming request needs one enveloped message")
    flags, size = struct.unpack(">BI", body[:5])
    if size != len(body) - 5 or flags & ~FLAG_COMPRESSED:
        raise RpcError("invalid_argument", "a server-streaming request holds exactly one message envelope")
    data = body[5:]
    if flags & FLAG_COMPRESSED:
        data = inflate(data, encoding or "gzip")
    return codec.decode(kind, data), codec


def end_envelope(error: RpcError | None) -> bytes:
    data = json.dumps({"error": error.json()} if error is not None else {}).encode()
    return struct.pack(">BI", FLAG_END, len(data)) + data


def stream_frames(codec: Codec, messages: Iterator[Message]) -> Iterator[bytes]:
    """The response body of a server-streaming call: each message, then the end of the stream (with the
    error that stopped it, if one did)."""
    try:
        for msg in messages:
            data = codec.encode(msg)
            yield struct.pack(">BI", 0, len(data)) + data
    except RpcError as exc:
        yield end_envelope(exc)
        return
    yield end_envelope(None)
