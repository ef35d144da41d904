"""The daemon protocol inside an E2B sandbox (envd), served for jailbox sandboxes from the host.

Runs in the serving host process, on a request's thread. A request names its sandbox (header or
host) and carries that sandbox's access token (``X-Access-Token``); without the right token it is
answered exactly as a sandbox that does not exist, so ids cannot be probed; so is a paused sandbox,
unless it was made to resume on traffic (``autoResume``), which such a request resumes. A ``/files``
request without a token is opened by envd's v1 signature of its URL instead (``by_signature``), else
answered 401 as envd answers it. Served: the Connect RPC process service (start with or without a
PTY, connect, list, send input, a client stream of input, resize, signal, close stdin) and filesystem
service (stat, list, make dir, move, remove, polled and streamed directory watches), and the HTTP
``/files`` download and upload (streamed to the jail a chunk at a time; a refused upload keeps the
files written before the refusal). Each request runs as the user the SDK
names, or the sandbox's own (``users``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import posixpath
import re
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import Message

from ...sandbox.errors import SandboxError
from . import filesystem_pb2 as fpb
from . import fs, metadata, processes, users
from . import process_pb2 as ppb
from .connect import (
    HTTP_STATUS,
    RpcError,
    client_stream,
    codec_for,
    end_envelope,
    stream_frames,
    stream_request,
    unary_request,
)
from .httpd import MAX_PART_HEAD, MAX_PARTS, Body, BodyCut, BodyTooLarge, Request, Response
from .registry import Registry, Served

ENVD_VERSION = "0.6.4"
"""The envd version the SDK is told (PEP 440): the lowest that unlocks every feature the e2b SDK
gates on a version (file metadata 0.6.2, entry info on watch events 0.6.3, watches over network
mounts 0.6.4)."""
MAX_FILE = 64 << 20
UPLOAD_CHUNK = 1 << 16
"""Bytes read of an upload at a time: what a streamed upload holds, beside one part's headers."""
KEEPALIVE_DEFAULT = 50.0
WATCH_POLL = 0.5
NOT_FOUND = "sandbox {} was not found"
SIGNATURE = re.compile(r"^v1_[A-Za-z0-9+/]{43}$")
"""envd's v1 signature as the SDK writes it: ``v1_`` and an unpadded base64 sha256."""
EXPIRATION = re.compile(r"^-?[0-9]{1,19}$")
OPERATIONS = {"GET": "read", "POST": "write"}


def _error_response(error: RpcError) -> Response:
    return Response(HTTP_STATUS[error.code], json.dumps(error.json()).encode(), "application/json")


def _stream_error(error: RpcError, content_type: str) -> Response:
    """A server-streaming call's error before its first message, as Connect sends one: HTTP 200 and the
    error in the stream's end (a client that reads only the status of a stream, as connect-web does,
    would see no message); a content type that is no Connect stream's gets the error as a status."""
    try:
        codec = codec_for(content_type, stream=True)
    except RpcError:
        return _error_response(error)
    return Response(200, end_envelope(error), codec.stream_type)


def _http_error(status: int, message: str) -> Response:
    return Response(status, json.dumps({"code": status, "message": message}).encode(), "application/json")


def sign(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """envd's v1 signature of a ``/files`` URL: base64 of the sha256 of its path, operation (``read``,
    ``write``), user (empty for the sandbox's own), the sandbox's access token and, if it expires,
    when (Unix seconds). The SDK's ``get_signature`` computes the same."""
    raw = f"{path}:{operation}:{user}:{token}" + ("" if expiration is None else f":{expiration}")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()


def signed(path: str, query: dict[str, list[str]]) -> bool:
    """Whether a request without a token asks for a file by a signed URL (``download_url``,
    ``upload_url``): its sandbox is then the one whose token makes the signature."""
    return path == "/files" and "signature" in query


def by_signature(registry: Registry, sandbox_id: str | None, request: Request, wake: bool = False) -> Served | str:
    """The sandbox a signed ``/files`` URL opens, checked as envd checks it (the signature over the
    URL's path, operation, user and expiry with the sandbox's access token, compared in constant time;
    an expired one refused), else why not. Without a sandbox id (a URL made against
    ``E2B_SANDBOX_URL`` names none) every sandbox's token is tried: the signature proves one of them."""
    query = request.query
    values = [query.get(name, []) for name in ("signature", "path", "username", "signature_expiration")]
    if any(len(v) > 1 for v in values) or request.method not in OPERATIONS:
        return "invalid signature: each of signature, path, username, signature_expiration at most once"
    signature, path, user, expiration = (v[0] if v else None for v in values)
    if signature is None or not SIGNATURE.match(signature):
        return "missing or malformed signature query parameter (v1_ and 43 base64 characters)"
    if expiration is not None and not EXPIRATION.match(expiration):
        return "signature_expiration must be Unix seconds, e.g. signature_expiration=1767225600"
    expires = None if expiration is None else int(expiration)
    with registry.lock:
        candidates = list(registry.served.values()) if sandbox_id is None else [registry.served.get(sandbox_id)]
    operation = OPERATIONS[request.method]
    found = None
    for served in candidates:
        if served is None:
            continue
        want = sign(path or "", operation, user or "", served.access_token, expires)
        if hmac.compare_digest(want.encode(), signature.encode()):
            found = served
    if found is None:
        return "invalid signature"
    if expires is not None and expires < time.time():
        return "signature is already expired"
    return registry.by_token(found.id, found.access_token, wake) or "invalid signature"


def handle(registry: Registry, sandbox_id: str | None, request: Request) -> Response:
    """A daemon request: to ``sandbox_id`` with its access token, or to the sandbox a signed ``/files``
    URL opens (``sandbox_id`` None: the URL named none)."""
    token = request.header("X-Access-Token")
    path = request.path
    if token is None and signed(path, request.query):
        opened = by_signature(registry, sandbox_id, request, wake=True)
        if isinstance(opened, str):
            return _http_error(401, opened)
        served: Served | None = opened
    else:
        served = None if sandbox_id is None else registry.by_token(sandbox_id, token, wake=True)
    if served is None:
        missing = NOT_FOUND.format((sandbox_id or "")[:64])
        if path.startswith(("/process.", "/filesystem.")):
            return _error_response(RpcError("unavailable", missing))
        return _http_error(502, missing)
    if path == "/health" and request.method == "GET":
        return Response(204)
    if path == "/files":
        if request.method == "GET":
            return _download(served, request)
        if request.method == "POST":
            try:
                user = users.requested(served, request, request.arg("username"))
            except RpcError as exc:
                return _http_error(401 if exc.code == "unauthenticated" else 502, str(exc))
            return _upload(served, request, user)
    service, _, method = path.lstrip("/").partition("/")
    if request.method == "POST" and (service, method) in UNARY:
        kind, call = UNARY[(service, method)]
        try:
            message, codec = unary_request(
                kind, request.body, request.header("Content-Type") or "", request.header("Content-Encoding") or ""
            )
            reply = call(served, message, users.requested(served, request))
        except RpcError as exc:
            return _error_response(exc)
        except (fs.FsError, processes.ProcessError) as exc:
            return _error_response(RpcError(exc.code, str(exc)))
        except SandboxError as exc:
            return _error_response(RpcError("unavailable", f"the sandbox stopped: {exc}"))
        return Response(200, codec.encode(reply), codec.unary_type)
    if request.method == "POST" and (service, method) == ("process.Process", "StreamInput"):
        return _stream_input(served, request)
    if request.method == "POST" and (service, method) in STREAMS:
        kind, stream = STREAMS[(service, method)]
        try:
            message, codec = stream_request(
                kind,
                request.body,
                request.header("Content-Type") or "",
                request.header("Connect-Content-Encoding") or "",
            )
        except RpcError as exc:
            return _stream_error(exc, request.header("Content-Type") or "")
        try:
            user = users.requested(served, request)
        except RpcError as exc:
            return _stream_error(exc, request.header("Content-Type") or "")
        limits = _call_limits(request)
        return Response(
            200, stream_frames(codec, _wrap(lambda: stream(served, message, limits, user))), codec.stream_type
        )
    if path.startswith(("/process.", "/filesystem.")):
        return _error_response(RpcError("unimplemented", f"{service}/{method} is not served by jailbox"))
    return _http_error(404, f"{request.method} {path} is not served by jailbox")


def _wrap(opened: Callable[[], Iterator[Message]]) -> Iterator[Message]:
    """Errors of the jail's side as the stream's end: a client hears why, never a cut connection."""
    try:
        yield from opened()
    except (fs.FsError, processes.ProcessError) as exc:
        raise RpcError(exc.code, str(exc)) from None
    except SandboxError as exc:
        raise RpcError("unavailable", f"the sandbox stopped: {exc}") from None


def _call_limits(request: Request) -> tuple[float | None, float | None]:
    """The call's deadline (``Connect-Timeout-Ms``) and keepalive interval, both bounded."""
    deadline = None
    try:
        ms = int(request.header("Connect-Timeout-Ms") or 0)
        if ms > 0:
            deadline = time.monotonic() + ms / 1000
        keepalive = float(request.header("Keepalive-Ping-Interval") or KEEPALIVE_DEFAULT)
    except ValueError:
        keepalive = KEEPALIVE_DEFAULT
    return deadline, min(300.0, max(1.0, keepalive))


# --- /files ------------------------------------------------------------------------------------


def _file_path(served: Served, request: Request, fallback: str | None = None) -> str:
    path = request.arg("path") or fallback
    if not path:
        raise fs.FsError("invalid_argument", "the path query parameter is required, e.g. ?path=/tmp/a.txt")
    return fs.check_path(path, served.sandbox.config.workdir)


def _fs_status(exc: fs.FsError) -> int:
    codes = {"not_found": 404, "invalid_argument": 400, "permission_denied": 403, "resource_exhausted": 413}
    return codes.get(exc.code, 500)


def _download(served: Served, request: Request) -> Response:
    try:
        path = _file_path(served, request)
        data = served.sandbox.read_file(path, max_bytes=MAX_FILE)
    except fs.FsError as exc:
        return _http_error(_fs_status(exc), str(exc))
    except OSError as exc:  # SandboxFileError carries the jail's errno
        status = {2: 404, 21: 400, 27: 413, 13: 403}.get(exc.errno or 0, 500)
        return _http_error(status, f"cannot read {request.arg('path')}: {exc.strerror or exc}")
    except SandboxError as exc:
        return _http_error(502, str(exc))
    return Response(200, data, "application/octet-stream")


def _boundary(content_type: str) -> bytes:
    for item in content_type.split(";")[1:]:
        name, _, value = item.strip().partition("=")
        if name.lower() == "boundary" and 0 < len(value.strip('"')) <= 200:
            return value.strip('"').encode()
    raise fs.FsError("invalid_argument", "multipart/form-data without a boundary")


class _Multipart:
    """A multipart/form-data body read as it arrives: each part's headers (at most ``MAX_PART_HEAD``
    bytes), then its data in chunks, never a whole part nor the whole body in memory."""

    def __init__(self, body: Body, boundary: bytes) -> None:
        self._body = body
        self._delimiter = b"\r\n--" + boundary
        self._buf = b"\r\n"  # the first delimiter has no CRLF before it: with this one, all read alike

    def _fill(self) -> bool:
        data = self._body.read(UPLOAD_CHUNK)
        self._buf += data
        return bool(data)

    def data(self) -> Iterator[bytes]:
        """The current part's data, up to the next delimiter (consumed)."""
        keep = len(self._delimiter) - 1  # a delimiter may straddle two reads
        while (at := self._buf.find(self._delimiter)) < 0:
            if len(self._buf) > keep:
                yield self._buf[:-keep]
                self._buf = self._buf[-keep:]
            if not self._fill():
                raise fs.FsError("invalid_argument", "the multipart body ends inside a part")
        if at:
            yield self._buf[:at]
        self._buf = self._buf[at + len(self._delimiter) :]

    def skip(self) -> None:
        """Drop what is left of the current part (the preamble, before the first one)."""
        for _ in self.data():
            pass

    def next(self) -> str | None:
        """Start the next part: its filename, or None after the last."""
        while len(self._buf) < 2 and self._fill():
            pass
        if self._buf.startswith(b"--"):
            while self._body.read(UPLOAD_CHUNK):  # the epilogue, dropped: the connection can serve the next
                pass
            return None
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_PART_HEAD:
                raise fs.FsError("invalid_argument", f"a multipart part's headers are over {MAX_PART_HEAD} bytes")
            if not self._fill():
                raise fs.FsError("invalid_argument", "a multipart part without the end of its headers")
        if end > MAX_PART_HEAD:
            raise fs.FsError("invalid_argument", f"a multipart part's headers are over {MAX_PART_HEAD} bytes")
        head, self._buf = self._buf[:end], self._buf[end + 4 :]
        filename = ""
        for line in head.split(b"\r\n"):
            name, _, value = line.decode(errors="replace").partition(":")
            if name.strip().lower() == "content-disposition":
                for param in value.split(";"):
                    key, _, val = param.strip().partition("=")
                    if key == "filename":
                        filename = val.strip('"')
        return filename


def _inflated(body: Body, encoding: str) -> Iterator[bytes]:
    """An upload's bytes as sent with ``encoding`` (identity or gzip), inflated a chunk at a time and
    refused past ``MAX_FILE``: a small gzip body cannot become a large one in memory."""
    if encoding in ("", "identity"):
        while data := body.read(UPLOAD_CHUNK):
            yield data
        return
    if encoding != "gzip":
        raise fs.FsError("invalid_argument", f"compression {encoding!r} is not supported (use gzip or none)")
    out = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    try:
        while data := out.unconsumed_tail or body.read(UPLOAD_CHUNK):
            chunk = out.decompress(data, UPLOAD_CHUNK)
            total += len(chunk)
            if total > MAX_FILE:
                raise fs.FsError("resource_exhausted", f"the inflated upload is over {MAX_FILE} bytes")
            yield chunk
        rest = out.flush()  # all input is in: what is left is at most zlib's window
        if total + len(rest) > MAX_FILE:
            raise fs.FsError("resource_exhausted", f"the inflated upload is over {MAX_FILE} bytes")
        yield rest
    except zlib.error as exc:
        raise fs.FsError("invalid_argument", f"bad gzip body: {exc}") from None


def _upload(served: Served, request: Request, user: str | None) -> Response:
    content_type = request.header("Content-Type") or ""
    assert request.stream is not None  # a STREAMED request
    body = request.stream
    written: list[str] = []
    try:
        wanted = metadata.from_headers(list(request.headers.items()))
        if content_type.startswith("multipart/form-data"):
            parts = _Multipart(body, _boundary(content_type))
            parts.skip()
            # A part is written as it arrives, before the next is read: ``?path=`` names the one file of
            # an upload (as the SDK sends one), and without it each part names its own by its filename.
            while (name := parts.next()) is not None:
                if len(written) == MAX_PARTS or (written and request.arg("path")):
                    raise fs.FsError("invalid_argument", f"an upload holds at most {MAX_PARTS} files, one with ?path=")
                path = _file_path(served, request, name)
                served.sandbox.write_file(path, parts.data())
                written.append(path)
            if not written:
                raise fs.FsError("invalid_argument", "the upload holds no file")
        else:
            path = _file_path(served, request)
            served.sandbox.write_file(path, _inflated(body, request.header("Content-Encoding") or ""))
            written.append(path)
        users.give(served, user, written)
        if wanted:
            metadata.write(served.sandbox, written, wanted, user)
            served.metadata_used = True
    except fs.FsError as exc:
        return _http_error(_fs_status(exc), str(exc))
    except RpcError as exc:
        return _http_error(502 if exc.code == "unavailable" else 500, str(exc))
    except BodyTooLarge as exc:
        return _http_error(413, str(exc))
    except BodyCut as exc:
        return _http_error(400, str(exc))
    except OSError as exc:
        status = {2: 404, 21: 400, 20: 400, 13: 403, 28: 507}.get(exc.errno or 0, 500)
        return _http_error(status, f"cannot write: {exc.strerror or exc}")
    except SandboxError as exc:
        return _http_error(502, str(exc))
    return Response(
        200,
        json.dumps(
            [
                {"name": posixpath.basename(p), "type": "file", "path": p} | ({"metadata": wanted} if wanted else {})
                for p in written
            ]
        ).encode(),
        "application/json",
    )


# --- the process service ------------------------------------------------------------------------


def _selector(sel: ppb.ProcessSelector) -> tuple[int | None, str | None]:
    which = sel.WhichOneof("selector")
    if which == "pid":
        return sel.pid, None
    if which == "tag":
        return None, sel.tag
    raise RpcError("invalid_argument", "name the process by pid or tag")


def _find(served: Served, sel: ppb.ProcessSelector) -> processes.Process:
    return served.procs.find(*_selector(sel))


def _event(event: processes.Event | None) -> ppb.ProcessEvent:
    if event is None:
        return ppb.ProcessEvent(keepalive=ppb.ProcessEvent.KeepAlive())
    if isinstance(event, processes.Output):
        data = ppb.ProcessEvent.DataEvent(**{event.stream: event.data})
        return ppb.ProcessEvent(data=data)
    end = ppb.ProcessEvent.EndEvent(exit_code=event.exit_code, exited=event.error is None, status=event.status)
    if event.error is not None:
        end.error = event.error
    return ppb.ProcessEvent(end=end)


def _follow(
    proc: processes.Process, watcher: processes.Watcher, limits: tuple[float | None, float | None], reply: Any
) -> Iterator[Message]:
    deadline, keepalive = limits
    yield reply(event=ppb.ProcessEvent(start=ppb.ProcessEvent.StartEvent(pid=proc.pid)))
    for event in processes.events(proc, watcher, keepalive, deadline):
        yield reply(event=_event(event))


def _start(
    served: Served, req: ppb.StartRequest, limits: tuple[float | None, float | None], user: str | None
) -> Iterator[Message]:
    config = req.process
    if not config.cmd:
        raise RpcError("invalid_argument", "process.cmd is required, e.g. /bin/bash")
    cwd = fs.check_path(config.cwd, served.sandbox.config.workdir) if config.HasField("cwd") and config.cwd else None
    if req.HasField("pty"):
        proc, watcher = served.procs.start_pty(
            config.cmd,
            list(config.args),
            dict(config.envs),
            cwd,
            req.tag if req.HasField("tag") else None,
            req.pty.size.cols,
            req.pty.size.rows,
            user,
        )
        return _follow(proc, watcher, limits, ppb.StartResponse)
    proc, watcher = served.procs.start(
        config.cmd,
        list(config.args),
        dict(config.envs),
        cwd,
        req.tag if req.HasField("tag") else None,
        req.stdin if req.HasField("stdin") else False,
        user,
    )
    return _follow(proc, watcher, limits, ppb.StartResponse)


def _connect(
    served: Served, req: ppb.ConnectRequest, limits: tuple[float | None, float | None], user: str | None
) -> Iterator[Message]:
    proc = _find(served, req.process)
    return _follow(proc, proc.watch(), limits, ppb.ConnectResponse)


def _list(served: Served, req: ppb.ListRequest, user: str | None) -> Message:
    infos = []
    for p in served.procs.list():
        config = ppb.ProcessConfig(cmd=p.cmd, args=p.args, envs=p.envs)
        if p.cwd is not None:
            config.cwd = p.cwd
        info = ppb.ProcessInfo(config=config, pid=p.pid)
        if p.tag is not None:
            info.tag = p.tag
        infos.append(info)
    return ppb.ListResponse(processes=infos)


def _send_input(served: Served, req: ppb.SendInputRequest, user: str | None) -> Message:
    which = req.input.WhichOneof("input")
    if which is None:
        raise RpcError("invalid_argument", "input must hold stdin or pty bytes")
    _find(served, req.process).write_input(getattr(req.input, which), pty=which == "pty")
    return ppb.SendInputResponse()


def _stream_input(served: Served, request: Request) -> Response:
    """``StreamInput``, Connect's client stream: a ``start`` naming the process, then each ``data``
    message written to it as it arrives (keepalives skipped); answered once the client ends its stream
    (over HTTP/1.1 the client sends it whole, then reads the answer). A stream holds at most
    ``MAX_BODY`` bytes (``httpd``); an error ends it there and is the stream's end."""
    assert request.stream is not None  # a STREAMED request
    content_type = request.header("Content-Type") or ""
    try:
        codec = codec_for(content_type, stream=True)
        target: processes.Process | None = None
        messages = client_stream(
            ppb.StreamInputRequest, request.stream.read, codec, request.header("Connect-Content-Encoding") or ""
        )
        for message in messages:
            event = message.WhichOneof("event")
            if event == "start":
                if target is not None:
                    raise RpcError("invalid_argument", "a stream names its process once, in its first message")
                target = _find(served, message.start.process)
            elif event == "data":
                if target is None:
                    raise RpcError("invalid_argument", "the first message must be start, naming the process")
                which = message.data.input.WhichOneof("input")
                if which is None:
                    raise RpcError("invalid_argument", "input must hold stdin or pty bytes")
                target.write_input(getattr(message.data.input, which), pty=which == "pty")
        if target is None:
            raise RpcError("invalid_argument", "the stream named no process (its first message must be start)")
    except RpcError as exc:
        return _stream_error(exc, content_type)
    except (fs.FsError, processes.ProcessError) as exc:
        return _stream_error(RpcError(exc.code, str(exc)), content_type)
    except BodyTooLarge as exc:
        return _stream_error(RpcError("resource_exhausted", str(exc)), content_type)
    except BodyCut as exc:
        return _stream_error(RpcError("canceled", str(exc)), content_type)
    except SandboxError as exc:
        return _stream_error(RpcError("unavailable", f"the sandbox stopped: {exc}"), content_type)
    return Response(200, stream_frames(codec, iter([ppb.StreamInputResponse()])), codec.stream_type)


def _update(served: Served, req: ppb.UpdateRequest, user: str | None) -> Message:
    if req.HasField("pty"):
        _find(served, req.process).resize(req.pty.size.cols, req.pty.size.rows)
    return ppb.UpdateResponse()


def _send_signal(served: Served, req: ppb.SendSignalRequest, user: str | None) -> Message:
    if req.signal not in (ppb.SIGNAL_SIGKILL, ppb.SIGNAL_SIGTERM):
        raise RpcError("invalid_argument", "signal must be SIGKILL or SIGTERM")
    _find(served, req.process).kill()
    return ppb.SendSignalResponse()


def _close_stdin(served: Served, req: ppb.CloseStdinRequest, user: str | None) -> Message:
    _find(served, req.process).close_stdin()
    return ppb.CloseStdinResponse()


# --- the filesystem service ---------------------------------------------------------------------


def _entry(e: fs.Entry) -> fpb.EntryInfo:
    # as newer envd: a symlink's type is its target's (unspecified if it resolves to nothing), and
    # is_symlink marks the link
    kind = {"file": fpb.FILE_TYPE_FILE, "dir": fpb.FILE_TYPE_DIRECTORY}.get(e.points_to, fpb.FILE_TYPE_UNSPECIFIED)
    info = fpb.EntryInfo(
        name=e.name,
        type=kind,
        path=e.path,
        size=e.size,
        mode=e.mode,
        permissions=e.permissions,
        owner=e.owner,
        group=e.group,
        is_symlink=e.kind == "symlink",
    )
    info.modified_time.FromNanoseconds(int(e.mtime * 1e9))
    if e.target is not None:
        info.symlink_target = e.target
    return info


def _path(served: Served, path: str) -> str:
    return fs.check_path(path, served.sandbox.config.workdir)


def _entries(served: Served, entries: list[fs.Entry], user: str | None) -> list[fpb.EntryInfo]:
    """Entries as the SDK gets them: with their metadata once the sandbox has had some set (best
    effort, as envd's: a listing whose attributes cannot be read is shown without them)."""
    infos = [_entry(e) for e in entries]
    if served.metadata_used and entries:
        try:
            found = metadata.read(served.sandbox, [e.path for e in entries], user)
        except fs.FsError:
            found = {}
        for e, info in zip(entries, infos, strict=True):
            info.metadata.update(found.get(e.path, {}))
    return infos


def _stat(served: Served, req: fpb.StatRequest, user: str | None) -> Message:
    entry = fs.stat(served.sandbox, _path(served, req.path), user)
    return fpb.StatResponse(entry=_entries(served, [entry], user)[0])


def _make_dir(served: Served, req: fpb.MakeDirRequest, user: str | None) -> Message:
    return fpb.MakeDirResponse(entry=_entry(fs.make_dir(served.sandbox, _path(served, req.path), user)))


def _move(served: Served, req: fpb.MoveRequest, user: str | None) -> Message:
    entry = fs.move(served.sandbox, _path(served, req.source), _path(served, req.destination), user)
    return fpb.MoveResponse(entry=_entries(served, [entry], user)[0])


def _list_dir(served: Served, req: fpb.ListDirRequest, user: str | None) -> Message:
    entries = fs.list_dir(served.sandbox, _path(served, req.path), req.depth or 1, user)
    return fpb.ListDirResponse(entries=_entries(served, entries, user))


def _remove(served: Served, req: fpb.RemoveRequest, user: str | None) -> Message:
    fs.remove(served.sandbox, _path(served, req.path), user)
    return fpb.RemoveResponse()


_EVENT_TYPES = {
    "create": fpb.EVENT_TYPE_CREATE,
    "write": fpb.EVENT_TYPE_WRITE,
    "remove": fpb.EVENT_TYPE_REMOVE,
    "chmod": fpb.EVENT_TYPE_CHMOD,
    "rename": fpb.EVENT_TYPE_RENAME,
}


def _fs_event(change: fs.Change) -> fpb.FilesystemEvent:
    event = fpb.FilesystemEvent(name=change.name, type=_EVENT_TYPES[change.kind])
    if change.entry is not None:
        event.entry.CopyFrom(_entry(change.entry))
    return event


def _create_watcher(served: Served, req: fpb.CreateWatcherRequest, user: str | None) -> Message:
    path = _path(served, req.path)
    wid = served.watchers.create(served.sandbox, path, req.recursive, req.include_entry, user)
    return fpb.CreateWatcherResponse(watcher_id=wid)


def _get_watcher_events(served: Served, req: fpb.GetWatcherEventsRequest, user: str | None) -> Message:
    changes = served.watchers.poll(served.sandbox, req.watcher_id)
    return fpb.GetWatcherEventsResponse(events=[_fs_event(c) for c in changes])


def _remove_watcher(served: Served, req: fpb.RemoveWatcherRequest, user: str | None) -> Message:
    served.watchers.remove(req.watcher_id)
    return fpb.RemoveWatcherResponse()


def _watch_dir(
    served: Served, req: fpb.WatchDirRequest, limits: tuple[float | None, float | None], user: str | None
) -> Iterator[Message]:
    path = _path(served, req.path)
    wid = served.watchers.create(served.sandbox, path, req.recursive, req.include_entry, user)
    deadline, keepalive = limits

    def watch() -> Iterator[Message]:
        try:
            yield fpb.WatchDirResponse(start=fpb.WatchDirResponse.StartEvent())
            quiet_since = time.monotonic()
            while deadline is None or time.monotonic() < deadline:
                changes = served.watchers.poll(served.sandbox, wid, WATCH_POLL)
                for c in changes:
                    yield fpb.WatchDirResponse(filesystem=_fs_event(c))
                if changes:
                    quiet_since = time.monotonic()
                elif keepalive is not None and time.monotonic() - quiet_since >= keepalive:
                    quiet_since = time.monotonic()
                    yield fpb.WatchDirResponse(keepalive=fpb.WatchDirResponse.KeepAlive())
            raise RpcError("deadline_exceeded", "the watch ran for its whole timeout")
        finally:
            try:
                served.watchers.remove(wid)
            except fs.FsError:
                pass

    return watch()


UnaryCall = Callable[[Served, Any, str | None], Message]
StreamCall = Callable[[Served, Any, tuple[float | None, float | None], str | None], Iterator[Message]]

UNARY: dict[tuple[str, str], tuple[type[Message], UnaryCall]] = {
    ("process.Process", "List"): (ppb.ListRequest, _list),
    ("process.Process", "SendInput"): (ppb.SendInputRequest, _send_input),
    ("process.Process", "Update"): (ppb.UpdateRequest, _update),
    ("process.Process", "SendSignal"): (ppb.SendSignalRequest, _send_signal),
    ("process.Process", "CloseStdin"): (ppb.CloseStdinRequest, _close_stdin),
    ("filesystem.Filesystem", "Stat"): (fpb.StatRequest, _stat),
    ("filesystem.Filesystem", "MakeDir"): (fpb.MakeDirRequest, _make_dir),
    ("filesystem.Filesystem", "Move"): (fpb.MoveRequest, _move),
    ("filesystem.Filesystem", "ListDir"): (fpb.ListDirRequest, _list_dir),
    ("filesystem.Filesystem", "Remove"): (fpb.RemoveRequest, _remove),
    ("filesystem.Filesystem", "CreateWatcher"): (fpb.CreateWatcherRequest, _create_watcher),
    ("filesystem.Filesystem", "GetWatcherEvents"): (fpb.GetWatcherEventsRequest, _get_watcher_events),
    ("filesystem.Filesystem", "RemoveWatcher"): (fpb.RemoveWatcherRequest, _remove_watcher),
}
STREAMS: dict[tuple[str, str], tuple[type[Message], StreamCall]] = {
    ("process.Process", "Start"): (ppb.StartRequest, _start),
    ("process.Process", "Connect"): (ppb.ConnectRequest, _connect),
    ("filesystem.Filesystem", "WatchDir"): (fpb.WatchDirRequest, _watch_dir),
}
