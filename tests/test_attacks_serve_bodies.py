"""What one key holder's request bodies cost ``jailbox serve``: file uploads and Connect messages built
to make the server build (many parts, long part headers, gzip bombs, deep or wide JSON, wide protobuf),
sent several at once. Under each, the server's memory grows by at most ``GROWTH`` and another tenant is
still served. Real server on loopback, real jails; the figures are printed (``-s`` shows them)."""

from __future__ import annotations

import gzip
import re
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.serve import KEY_A, KEY_B, Served, api, key_file, need_sdk, sdk, start_server

from jailbox.servers.e2b import process_pb2 as ppb
from jailbox.servers.e2b.connect import MAX_MESSAGE as MAX_INFLATED

GROWTH = 256 << 20
"""The goal: what the attacks together may add to the server's resident memory."""


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server per test: what one attack leaves allocated (memory freed but kept) is not the next's."""
    need_sdk()
    tmp = tmp_path_factory.mktemp("bodies")
    served = start_server(tmp, "--api-key-file", str(key_file(tmp, KEY_A, KEY_B)))
    yield served
    served.stop()


@pytest.fixture
def sandboxes(server: Served) -> Iterator[dict[str, dict[str, str]]]:
    """One sandbox per tenant: A attacks through its own, B's must still be served."""
    made = {}
    for key in (KEY_A, KEY_B):
        status, body = api(server, "POST", "/v2/sandboxes", key, {"templateID": "host"})
        assert status == 201, body
        made[key] = body
    yield made  # type: ignore[misc]
    for key, body in made.items():
        api(server, "DELETE", f"/sandboxes/{body['sandboxID']}", key)  # type: ignore[index]


def _head(sandbox: dict[str, str], path: str, length: int, *headers: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        f"E2b-Sandbox-Id: {sandbox['sandboxID']}",
        f"X-Access-Token: {sandbox['envdAccessToken']}",
        f"Content-Length: {length}",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _send(url: str, head: bytes, body: bytes) -> str:
    """Send one request on its own connection; its status line. The body is sent beside the read: a
    server that refuses early stops reading it, and the refusal is what counts."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=300) as conn:

        def send() -> None:
            try:
                conn.sendall(head + body)
            except OSError:  # refused and closed before all of it went
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reply = b""
        try:
            while b"\r\n\r\n" not in reply and (chunk := conn.recv(4096)):
                reply += chunk
            head_end = reply.find(b"\r\n\r\n") + 4
            length = re.search(rb"(?im)^content-length: *(\d+)", reply[:head_end])
            want = head_end + min(int(length.group(1)), 1 << 16) if length else 0
            while len(reply) < want and (chunk := conn.recv(4096)):
                reply += chunk
        except OSError as exc:
            return f"no reply: {exc}"
        sender.join(60)
    status = reply.split(b"\r\n")[0].decode(errors="replace")
    ended = re.search(rb'"error": *\{"code": *"(\w+)"', reply[head_end:want]) if want else None
    return status + (f" [{ended.group(1).decode()}]" if status.endswith(" 200 OK") and ended else "")


def _attack(server: Served, other: dict[str, str], requests: list[tuple[bytes, bytes]]) -> list[str]:
    """Send ``requests`` all at once while sampling the server's memory; meanwhile tenant B lists its
    sandbox's processes, which must succeed. Returns the status lines; asserts the growth."""
    proc = psutil.Process(server.proc.pid)
    before = proc.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)

    statuses: list[str] = [""] * len(requests)

    def one(i: int) -> None:
        statuses[i] = _send(server.url, *requests[i])

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # the attacks are under way
        req = urllib.request.Request(
            server.url + "/process.Process/List",
            data=b"{}",
            method="POST",
            headers={
                "E2b-Sandbox-Id": other["sandboxID"],
                "X-Access-Token": other["envdAccessToken"],
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=60) as r:  # generous: this is a functional check
            assert r.status == 200
    finally:
        for t in threads:
            t.join(300)
        done.set()
        sampler.join()
    print(f"server memory: {before >> 20} MiB before, {peak >> 20} MiB at the peak; replies: {set(statuses)}")
    assert peak - before <= GROWTH, f"the server grew by {(peak - before) >> 20} MiB"
    return statuses


def _multipart(sandbox: dict[str, str], parts: bytes, boundary: str = "b") -> tuple[bytes, bytes]:
    body = parts + f"--{boundary}--\r\n".encode()
    head = _head(sandbox, "/files", len(body), f"Content-Type: multipart/form-data; boundary={boundary}")
    return head, body


def _refused(statuses: list[str], *codes: int | str) -> None:
    """Each reply is one of ``codes``: an HTTP status, or a Connect code a stream ended with (``[code]``)."""
    for line in statuses:
        assert any(f" {code} " in line + " " or f"[{code}]" in line for code in codes), statuses


@pytest.mark.slow
def test_an_upload_of_many_empty_parts(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    """About 9.6 million empty parts in 64 MiB (before: 1.27 GB for one, 4.9 GB for four)."""
    empty = b"--b\r\n\r\n\r\n"
    attack = _multipart(sandboxes[KEY_A], empty * ((64 << 20) // len(empty)))
    _refused(_attack(server, sandboxes[KEY_B], [attack] * 4), 400)


@pytest.mark.slow
def test_an_upload_of_many_tiny_parts_with_long_headers(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="/tmp/many/f"\r\n'
    part += b"X-Pad: " + b"p" * 4000 + b"\r\n\r\nx\r\n"
    attack = _multipart(sandboxes[KEY_A], part * ((64 << 20) // len(part)))
    _refused(_attack(server, sandboxes[KEY_B], [attack] * 4), 400)


@pytest.mark.slow
def test_a_part_header_without_end(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    attack = _multipart(sandboxes[KEY_A], b"--b\r\nX-Long: " + b"h" * (64 << 20))
    _refused(_attack(server, sandboxes[KEY_B], [attack] * 8), 400)


@pytest.mark.slow
def test_a_gzip_bomb_upload(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    """A 64 KB gzip body inflating to 256 MiB: refused past 64 MiB, never inflated whole."""
    bomb = gzip.compress(b"\0" * (256 << 20), 9)
    head = _head(sandboxes[KEY_A], "/files?path=/tmp/bomb", len(bomb), "Content-Encoding: gzip")
    _refused(_attack(server, sandboxes[KEY_B], [(head, bomb)] * 8), 413)


def _connect_json(sandbox: dict[str, str], message: bytes) -> tuple[bytes, bytes]:
    body = gzip.compress(message, 9)
    head = _head(
        sandbox, "/process.Process/List", len(body), "Content-Type: application/json", "Content-Encoding: gzip"
    )
    return head, body


@pytest.mark.slow
def test_a_gzip_bomb_of_connect_json(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    """16 KB inflating to 16 MiB of ``[],`` (before: about 400 MB per request)."""
    wide = b'{"x": [' + b"[]," * ((16 << 20) // 3 - 4) + b"[]]}"
    _refused(_attack(server, sandboxes[KEY_B], [_connect_json(sandboxes[KEY_A], wide)] * 8), 429)


@pytest.mark.slow
def test_deeply_nested_and_wide_connect_json(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    deep = b'{"x": ' + b"[" * ((8 << 20) - 8) + b"]" * ((8 << 20) - 8) + b"}"
    numbers = b'{"x": [' + b"0," * ((8 << 20) - 4) + b"0]}"  # millions of elements, no compression
    keys = b"{" + b",".join(b'"%d":0' % i for i in range(1 << 20)) + b"}"
    requests = [_connect_json(sandboxes[KEY_A], deep)] * 4
    for message in (numbers, keys):
        head = _head(sandboxes[KEY_A], "/process.Process/List", len(message), "Content-Type: application/json")
        requests += [(head, message)] * 2
    _refused(_attack(server, sandboxes[KEY_B], requests), 400, 429)


@pytest.mark.slow
def test_a_gzip_bomb_of_connect_proto(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    """A streamed Start whose 16 MiB inflate to 8 million empty arguments."""
    start = ppb.StartRequest(process=ppb.ProcessConfig(cmd="/bin/true", args=[""] * ((8 << 20) - 16)))
    data = gzip.compress(start.SerializeToString(), 9)
    envelope = struct.pack(">BI", 1, len(data)) + data
    head = _head(
        sandboxes[KEY_A],
        "/process.Process/Start",
        len(envelope),
        "Content-Type: application/connect+proto",
        "Connect-Content-Encoding: gzip",
    )
    _refused(_attack(server, sandboxes[KEY_B], [(head, envelope)] * 8), 429, "resource_exhausted")


@pytest.mark.slow
def test_large_bodies_to_requests_read_whole(server: Served, sandboxes: dict[str, dict[str, str]]) -> None:
    """An upload's 65 MiB sent where a body is read whole (before: eight grew the server by 375 MiB)."""
    body = b" " * (65 << 20)
    head = _head(sandboxes[KEY_A], "/process.Process/List", len(body), "Content-Type: application/json")
    _refused(_attack(server, sandboxes[KEY_B], [(head, body)] * 8), 413)


@pytest.mark.slow
def test_uploads_still_work_single_multi_gzip_and_streamed(server: Served, tmp_path: Path) -> None:
    """What the SDK sends (one file, several, large, gzip, a chunked stream) is written whole."""
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        sb = Sandbox.create(template="host")
        big = bytes(range(256)) * (160 << 10)  # 40 MiB, bytes that look like a delimiter's included
        assert sb.files.write("/tmp/up/big", big).path == "/tmp/up/big"
        assert bytes(sb.files.read("/tmp/up/big", format="bytes")) == big
        entries = [WriteEntry(path=f"/tmp/up/{i}.txt", data=f"file {i}\\r\\n--" * i) for i in range(50)]
        written = sb.files.write_files(entries)
        assert [w.path for w in written] == [e["path"] for e in entries], written
        for i in (0, 1, 49):
            assert sb.files.read(f"/tmp/up/{i}.txt") == f"file {i}\\r\\n--" * i
        sb.files.write("/tmp/up/gz", big, gzip=True)
        assert bytes(sb.files.read("/tmp/up/gz", format="bytes")) == big
        sb.files.write("/tmp/up/stream", (big[i : i + 100000] for i in range(0, len(big), 100000)))
        assert bytes(sb.files.read("/tmp/up/stream", format="bytes")) == big
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_a_refused_upload_is_answered_once_its_small_rest_arrives(
    server: Served, sandboxes: dict[str, dict[str, str]]
) -> None:
    """An upload refused from its headers (metadata over envd's bound) whose body is small is read to
    its end before the answer: answered while the client still sent, the SDK's client failed to read
    the answer about one upload in 500 on a loaded machine. A rest that does not come is not waited
    for past the linger deadline, and a large one is not read first."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    body = b"--b\r\nContent-Disposition: form-data; name=file; filename=x\r\n\r\nx\r\n--b--\r\n"
    metadata = "X-Metadata-K: " + "v" * 5000
    head = _head(
        sandboxes[KEY_A],
        "/files?path=/tmp/refused",
        len(body),
        metadata,
        "Content-Type: multipart/form-data; boundary=b",
    )
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(head)
        conn.settimeout(1.0)
        with pytest.raises(TimeoutError):
            conn.recv(1)  # nothing yet: the server waits for the body it will drop
        conn.sendall(body)
        conn.settimeout(60)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400") and b"4096" in answer, answer[:300]
    with socket.create_connection((host, int(port)), timeout=60) as conn:  # a rest that never comes
        conn.sendall(head)
        started = time.monotonic()
        conn.settimeout(60)
        answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400") and time.monotonic() - started < 30, answer[:200]


@pytest.mark.slow
def test_a_client_stream_of_input_is_read_and_checked_message_by_message(
    server: Served, sandboxes: dict[str, dict[str, str]]
) -> None:
    """``StreamInput``'s envelopes are read one at a time, each bounded before it is read or inflated:
    a stream that names no process, a forged or cut envelope, a bomb, JSON too deep each end the
    stream with their own code, the server's memory flat, the other tenant served meanwhile."""

    def envelope(message: bytes, flags: int = 0) -> bytes:
        return struct.pack(">BI", flags, len(message)) + message

    def data(text: bytes) -> bytes:
        event = ppb.StreamInputRequest(data=ppb.StreamInputRequest.DataEvent(input=ppb.ProcessInput(stdin=text)))
        return envelope(event.SerializeToString())

    start_of_nothing = ppb.StreamInputRequest(
        start=ppb.StreamInputRequest.StartEvent(process=ppb.ProcessSelector(pid=999_999))
    )
    bomb = gzip.compress(b"\0" * (MAX_INFLATED + 1), 9)
    deep = b'{"data": {"input": ' * 40 + b"{}" + b"}" * 80
    streams = {
        "data before start": (data(b"x"), "proto", "invalid_argument"),
        "an empty stream": (b"", "proto", "invalid_argument"),
        "an unknown process": (envelope(start_of_nothing.SerializeToString()), "proto", "not_found"),
        "a 1 GiB envelope": (struct.pack(">BI", 0, 1 << 30) + b"x" * 100, "proto", "resource_exhausted"),
        "a cut envelope": (struct.pack(">BI", 0, 100) + b"x" * 10, "proto", "invalid_argument"),
        "unknown flags": (envelope(b"", 0x80), "proto", "invalid_argument"),
        "a gzip bomb": (envelope(bomb, 1), "proto", "resource_exhausted"),
        "JSON too deep": (envelope(deep), "json", "invalid_argument"),
    }
    requests = []
    for body, codec, _ in streams.values():
        head = _head(
            sandboxes[KEY_A],
            "/process.Process/StreamInput",
            len(body),
            f"Content-Type: application/connect+{codec}",
            "Connect-Content-Encoding: gzip",
        )
        requests.append((head, body))
    statuses = _attack(server, sandboxes[KEY_B], requests)
    for (what, (_, _, code)), status in zip(streams.items(), statuses, strict=True):
        assert status.endswith(f" 200 OK [{code}]"), (what, status)
