"""``jailbox ps --server URL`` and ``jailbox stop --server URL`` against a running ``jailbox serve``.

The server is a real subprocess on loopback holding real jails; the CLI runs as a user runs it. The
hostile-peer tests stand a small HTTP server in for a server that redirects, lies or floods.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.serve import KEY_A, KEY_B, Served, api, key_file, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(tmp_path_factory.mktemp("serve-cli"))


def cli(*args: str, key: str | None = None, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``jailbox ARGS`` with no E2B variables but ``E2B_API_KEY=key``, and ``config`` as its config home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env["XDG_CONFIG_HOME"] = str(config) if config is not None else "/nonexistent"
    if key is not None:
        env["E2B_API_KEY"] = key
    return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, env=env, timeout=120)


def make(server: Served, key: str, **body: object) -> str:
    status, made = api(server, "POST", "/v2/sandboxes", key, {"templateID": "host", **body})
    assert status == 201, made
    return made["sandboxID"]  # type: ignore[index]


def alive(server: Served, key: str, sid: str) -> bool:
    return api(server, "GET", f"/sandboxes/{sid}", key)[0] == 200


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_ps_lists_this_keys_sandboxes_and_stop_kills_them(server: Served) -> None:
    mine = [make(server, KEY_A, metadata={"job": "ps"}), make(server, KEY_A)]
    theirs = make(server, KEY_B)
    try:
        table = cli("ps", "--server", server.url, key=KEY_A)
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split() == ["ID", "NAME", "ROOTFS", "CREATED", "STATE", "EXPIRES"]
        assert sorted(row.split()[0] for row in rows) == sorted(mine)
        assert all(row.split()[2] == "host" and row.split()[5] == "running" for row in rows), rows
        listed = json.loads(cli("ps", "--server", server.url, "--json", key=KEY_A).stdout)
        assert sorted(b["id"] for b in listed) == sorted(mine)
        assert {"id", "name", "rootfs", "created", "state", "expires", "metadata"} <= set(listed[0])
        assert {"job": "ps"} in [b["metadata"] for b in listed]
        assert all(b["expires"] > b["created"] for b in listed)

        # another key's sandbox cannot be named, even by its full id, and nothing is killed for trying
        refused = cli("stop", "--server", server.url, mine[0], theirs, key=KEY_A)
        one_line_error(refused, 1, "--server", f"no sandbox {theirs}", "jailbox ps --server")
        assert alive(server, KEY_A, mine[0]) and alive(server, KEY_B, theirs)

        by_prefix = cli("stop", "--server", server.url, mine[0][:-4], key=KEY_A)
        assert by_prefix.returncode == 0 and by_prefix.stdout.split() == [mine[0]], by_prefix.stderr
        assert not alive(server, KEY_A, mine[0])
        everything = cli("stop", "--server", server.url, "--all", key=KEY_A)
        assert everything.returncode == 0 and everything.stdout.split() == [mine[1]], everything.stderr
        assert json.loads(cli("ps", "--server", server.url, "--json", key=KEY_A).stdout) == []
        assert alive(server, KEY_B, theirs)
    finally:
        for sid in mine:
            api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)
        api(server, "DELETE", f"/sandboxes/{theirs}", KEY_B)


def test_unknown_or_ambiguous_ids_are_named(server: Served) -> None:
    made = [make(server, KEY_A), make(server, KEY_A)]
    try:
        for ref in ("jbnope", "no such id", "x" * 300):
            one_line_error(cli("stop", "--server", server.url, ref, key=KEY_A), 1, "--server", "no sandbox")
        one_line_error(cli("stop", "--server", server.url, "jb", key=KEY_A), 1, "prefix of 2 sandboxes")
        assert all(alive(server, KEY_A, sid) for sid in made)
    finally:
        for sid in made:
            api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_a_wrong_or_missing_key_is_named_and_kills_nothing(server: Served, tmp_path: Path) -> None:
    sid = make(server, KEY_A)
    try:
        for key in ("jbx_" + "z" * 40, KEY_A + "x"):
            for args in (("ps",), ("stop", sid), ("stop", "--all")):
                one_line_error(
                    cli(*args, "--server", server.url, key=key), 1, "--api-key-file", "refused the API key (401)"
                )
        one_line_error(cli("ps", "--server", server.url), 1, "--api-key-file", "no API key")
        for bad in ("two words", "k\r\nX-Injected: 1", "\u00e9" * 20):
            one_line_error(cli("ps", "--server", server.url, key=bad), 1, "E2B_API_KEY", "printable ASCII")
        loose = key_file(tmp_path, KEY_A)
        loose.chmod(0o644)
        one_line_error(cli("ps", "--server", server.url, "--api-key-file", str(loose)), 1, "--api-key-file", "chmod")
        assert alive(server, KEY_A, sid)
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_A)


def test_where_the_key_comes_from(server: Served, tmp_path: Path) -> None:
    """--api-key-file, else $E2B_API_KEY, else (loopback only) the file jailbox serve makes by default."""
    sid = make(server, KEY_B)
    try:
        config = tmp_path / "config"
        (config / "jailbox").mkdir(parents=True)
        default = key_file(config / "jailbox", KEY_B).rename(config / "jailbox" / "serve-api-keys")

        def ids(*args: str, key: str | None = None) -> list[str]:
            proc = cli("ps", "--server", server.url, "--json", *args, key=key, config=config)
            assert proc.returncode == 0, proc.stderr
            return [b["id"] for b in json.loads(proc.stdout)]

        assert ids() == [sid]  # the default file, for a loopback server
        assert ids(key=KEY_A) == []  # E2B_API_KEY over the default file
        assert ids("--api-key-file", str(key_file(tmp_path, KEY_B)), key=KEY_A) == [sid]  # the flag over both
        # the local server's key is never offered to another host: refused before any connection is made
        for remote in ("http://[2001:db8::1]:49982", "https://sandbox.example.com"):
            proc = cli("ps", "--server", remote, config=config)
            one_line_error(proc, 1, "--api-key-file", "only for a loopback --server")
        assert default.read_text() == KEY_B + "\n"
    finally:
        api(server, "DELETE", f"/sandboxes/{sid}", KEY_B)


def test_no_server_and_bad_urls_are_named(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for args in (("ps",), ("stop", "jb1"), ("stop", "--all")):
        proc = cli(*args, "--server", f"http://127.0.0.1:{port}", key=KEY_A)
        one_line_error(proc, 1, "--server", "nothing is listening", f"jailbox serve --port {port}")
    for url in ("127.0.0.1:49982", "ftp://127.0.0.1", "http://", "http://127.0.0.1:x", "http://h/v2/sandboxes"):
        one_line_error(cli("ps", "--server", url, key=KEY_A), 2, "--server", "e.g. --server http://")
    one_line_error(cli("ps", "--api-key-file", str(key_file(tmp_path, KEY_A))), 2, "--api-key-file", "--server")


class Peer(BaseHTTPRequestHandler):
    """A stand-in server: answers each request with what ``reply`` says, and records what it saw."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str | None]]
    reply: tuple[int, dict[str, str], bytes]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("X-API-Key")))
        status, headers, body = self.reply
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = _answer


Peers = Callable[[int, dict[str, str], bytes], tuple[str, type[Peer]]]


@pytest.fixture
def peers() -> Iterator[Peers]:
    """``make(status, headers, body)``: a stand-in server on loopback answering every request so; its
    URL and its handler class (whose ``seen`` lists the requests)."""
    running: list[ThreadingHTTPServer] = []

    def make(status: int, headers: dict[str, str], body: bytes) -> tuple[str, type[Peer]]:
        handler = type("Handler", (Peer,), {"seen": [], "reply": (status, headers, body)})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        running.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", handler

    yield make
    for httpd in running:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow
def test_a_redirect_does_not_carry_the_key_elsewhere(peers: Peers) -> None:
    target, caught = peers(200, {"Content-Type": "application/json"}, b"[]")
    for status in (301, 302, 307, 308):
        url, redirector = peers(status, {"Location": target + "/v2/sandboxes"}, b"")
        for args in (("ps",), ("stop", "--all")):
            one_line_error(cli(*args, "--server", url, key=KEY_A), 1, "--server", f"answered {status}")
        assert redirector.seen and all(key == KEY_A for _, _, key in redirector.seen)
    assert caught.seen == []


def test_what_a_peer_names_is_checked_before_it_is_printed_or_used(peers: Peers) -> None:
    listing = [
        {"sandboxID": "jbgood", "templateID": "\x1b]0;pwned\x07\x1b[31mhost", "startedAt": "2026-01-01T00:00:00Z"},
        {"sandboxID": "../../etc", "templateID": "host"},
        {"sandboxID": "jb\x1b[2J", "templateID": "host"},
        {"sandboxID": 7},
        "not an object",
        {"sandboxID": "jbmeta", "templateID": "t" * 500, "metadata": {"k\x1b": "v\x1b[0m", "ok": "yes"}},
    ]
    url, handler = peers(200, {"Content-Type": "application/json"}, json.dumps(listing).encode())
    table = cli("ps", "--server", url, key=KEY_A)
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert sorted(row.split()[0] for row in table.stdout.splitlines()[1:]) == ["jbgood", "jbmeta"]
    listed = json.loads(cli("ps", "--server", url, "--json", key=KEY_A).stdout)
    assert sorted(b["id"] for b in listed) == ["jbgood", "jbmeta"]
    assert "\x1b" not in json.dumps(listed, ensure_ascii=False)
    # stop --all kills only the ids that passed, each by a path that cannot leave /sandboxes/
    killed = cli("stop", "--server", url, "--all", key=KEY_A)
    assert killed.returncode == 0 and sorted(killed.stdout.split()) == ["jbgood", "jbmeta"], killed.stderr
    deletes = [path for method, path, _ in handler.seen if method == "DELETE"]
    assert deletes and all(path in ("/sandboxes/jbgood", "/sandboxes/jbmeta") for path in deletes), deletes


@pytest.mark.slow
def test_an_endless_or_malformed_reply_is_bounded(peers: Peers) -> None:
    huge, _ = peers(200, {"Content-Type": "application/json"}, b"[" + b" " * (17 << 20) + b"]")
    one_line_error(cli("ps", "--server", huge, key=KEY_A), 1, "--server", "over")
    for body in (b"{not json", b'{"a": 1}', b"[" * 100000):
        url, _ = peers(200, {"Content-Type": "application/json"}, body)
        one_line_error(cli("ps", "--server", url, key=KEY_A), 1, "--server", "not a JSON list")
    paging, _ = peers(200, {"Content-Type": "application/json", "x-next-token": "1"}, b'[{"sandboxID": "jbx"}]')
    one_line_error(cli("ps", "--server", paging, key=KEY_A), 1, "--server", "pages")
