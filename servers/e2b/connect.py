"""Connect RPC over HTTP/1.1, server side: unary, server-streaming and client-streaming calls, protobuf
binary or JSON.

Runs in the serving host process, on the thread of one HTTP request. Every request body arrives
already bounded by the HTTP layer; this module bounds what it decodes from it too (one message per
unary call, one envelope per server-streaming request, a client stream's envelopes one at a time, gzip
inflated to at most ``MAX_MESSAGE``, every message checked for its depth and element count before it is
parsed).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from ...sandbox.errors import ServerError
from ..jsonshape import excess

MAX_MESSAGE = 16 << 20
"""Largest message a client may send, after decompression."""
INFLATE_STEP = 1 << 16
"""Bytes a gzip message is inflated by at a time, each step checked against ``MAX_MESSAGE``."""
MAX_DEPTH = 32
MAX_ELEMENTS = 1 << 16
"""A message's nesting, and its elements (JSON: as ``jsonshape`` counts them; protobuf: fields, each element
of a repeated one too), checked before it is parsed: parsing builds an object per element, and 16 MiB of
JSON ``[[],[],...`` built 400 MB. A message big for its data (a long string) has few."""

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


class RpcError(ServerError):
    """An RPC that ends with a Connect error code (one of ``HTTP_STATUS``) and a message for the client."""

    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(message)
        self.code = code
        self.message = message

    def json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def inflate(data: bytes, encoding: str) -> bytes | bytearray:
    """``data`` as sent with ``encoding`` (identity or gzip), refusing more than ``MAX_MESSAGE`` inflated.

    Inflated a step at a time into one buffer: zlib's own output for a large ``max_length`` is blocks
    joined at the end, twice the message at its peak (eight 16 KB bombs at once held 256 MiB)."""
    if encoding in ("", "identity"):
        return data
    if encoding != "gzip":
        raise RpcError("unimplemented", f"compression {encoding!r} is not supported (use gzip or none)")
    out = zlib.decompressobj(16 + zlib.MAX_WBITS)
    inflated = bytearray()
    try:
        while data:
            inflated += out.decompress(data, INFLATE_STEP)
            if len(inflated) > MAX_MESSAGE:
                raise RpcError("resource_exhausted", f"message larger than {MAX_MESSAGE} bytes")
            data = out.unconsumed_tail
        inflated += out.flush()  # all input is in: what is left is at most zlib's window
    except zlib.error as exc:
        raise RpcError("invalid_argument", f"bad gzip body: {exc}") from None
    if len(inflated) > MAX_MESSAGE:
        raise RpcError("resource_exhausted", f"message larger than {MAX_MESSAGE} bytes")
    return inflated


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

    def decode(self, kind: type[M], data: bytes | bytearray) -> M:
        msg = kind()
        try:
            if self.name == "json":
                _check_json(data)
                json_format.Parse(data.decode(), msg, ignore_unknown_fields=True, max_recursion_depth=MAX_DEPTH)
            else:
                _check_proto(cast(Descriptor, kind.DESCRIPTOR), memoryview(data), MAX_ELEMENTS, 0)
                msg.ParseFromString(cast(bytes, data))  # any buffer: an inflated message is not copied
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as exc:
            raise RpcError("invalid_argument", f"cannot decode {kind.DESCRIPTOR.full_name}: {exc}") from None
        return msg

    def encode(self, msg: Message) -> bytes:
        if self.name == "json":
            return json_format.MessageToJson(msg, indent=None).encode()
        return msg.SerializeToString()


def _check_json(data: bytes | bytearray) -> None:
    """Refuse JSON nested deeper than ``MAX_DEPTH`` or of more than ``MAX_ELEMENTS`` elements (``jsonshape``)."""
    over = excess(data, MAX_DEPTH, MAX_ELEMENTS)
    if over == "elements":
        raise RpcError("resource_exhausted", f"a JSON message holds at most {MAX_ELEMENTS} elements")
    if over == "depth":
        raise RpcError("invalid_argument", f"a JSON message is nested at most {MAX_DEPTH} deep")


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise RpcError("invalid_argument", "cannot decode the message: a bad varint")


def _check_proto(descriptor: Descriptor, data: memoryview, budget: int, depth: int) -> int:
    """Refuse protobuf nested deeper than ``MAX_DEPTH`` or of more than ``MAX_ELEMENTS`` fields, by
    walking the wire format against the message's schema (unknown fields count one each, their content
    is not walked); returns what is left of ``budget``. Malformed input stops the walk: the parser says
    what is wrong with it."""
    if depth > MAX_DEPTH:
        raise RpcError("invalid_argument", f"a message is nested at most {MAX_DEPTH} deep")
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        budget -= 1
        if budget < 0:
            raise RpcError("resource_exhausted", f"a message holds at most {MAX_ELEMENTS} elements")
        wire = key & 7
        if wire == 0:
            pos = _varint(data, pos)[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            field = descriptor.fields_by_number.get(key >> 3)
            if field is not None and field.message_type is not None:
                budget = _check_proto(field.message_type, data[pos : pos + size], budget, depth + 1)
            pos += size
        else:  # groups (deprecated, sent by no client) and invalid wire types
            raise RpcError("invalid_argument", f"cannot decode the message: wire type {wire} is not served")
    return budget


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
    data = inflate(body[5:], encoding or "gzip") if flags & FLAG_COMPRESSED else body[5:]
    return codec.decode(kind, data), codec


def client_stream(kind: type[M], read: Callable[[int], bytes], codec: Codec, encoding: str) -> Iterator[M]:
    """The messages of a client-streaming call as they arrive (``read(n)``: at most ``n`` bytes of the
    request body, ``b""`` at its end), each envelope at most ``MAX_MESSAGE`` bytes as sent and inflated,
    decoded within its bounds. The stream ends with the body, or at an end-of-stream envelope."""
    while (head := _exactly(read, 5)) is not None:
        flags, size = struct.unpack(">BI", head)
        if flags & ~(FLAG_COMPRESSED | FLAG_END):
            raise RpcError("invalid_argument", f"unknown envelope flags {flags:#x}")
        if size > MAX_MESSAGE:
            raise RpcError("resource_exhausted", f"message larger than {MAX_MESSAGE} bytes")
        data = _exactly(read, size) if size else b""
        if data is None:
            raise RpcError("invalid_argument", "the request ended inside a message")
        if flags & FLAG_END:
            return
        yield codec.decode(kind, inflate(data, encoding or "gzip") if flags & FLAG_COMPRESSED else data)


def _exactly(read: Callable[[int], bytes], size: int) -> bytes | None:
    """``size`` bytes read whole, or None at the body's end before the first; ended inside: an error."""
    data = bytearray()
    while len(data) < size:
        part = read(size - len(data))
        if not part:
            if data:
                raise RpcError("invalid_argument", "the request ended inside a message")
            return None
        data += part
    return bytes(data)


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
