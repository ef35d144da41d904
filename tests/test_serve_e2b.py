"""``jailbox serve`` driven by the unmodified E2B SDK, pointed at it with environment variables only.

The server runs as a subprocess on loopback; the SDK runs in this process. Real jails, real kernel.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.bound_probe import BOUNDS, PROBE_LINE, held
from support.cli import JAILBOX
from support.serve import KEY_A, KEY_B, Served, api, key_file, need_sdk, sdk, serving, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    need_sdk()
    yield from serving(tmp_path_factory.mktemp("serve"), "--max-per-key", "6")


def test_create_run_and_kill(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import CommandExitException, Sandbox, SandboxException

        sb = Sandbox.create(template="host", metadata={"suite": "serve"}, envs={"GREETING": "hello"})
        assert sb.is_running()
        r = sb.commands.run("echo out; echo err >&2; echo $GREETING")
        assert (r.exit_code, r.stdout, r.stderr) == (0, "out\\nhello\\n", "err\\n"), r

        seen = []
        r = sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.05; done", on_stdout=seen.append)
        assert "".join(seen) == "line1\\nline2\\nline3\\n" == r.stdout, seen

        try:
            sb.commands.run("echo nope >&2; exit 7")
            raise AssertionError("a failing command did not raise")
        except CommandExitException as failed:
            assert (failed.exit_code, failed.stderr) == (7, "nope\\n")

        assert sb.commands.run("pwd", cwd="/tmp").stdout == "/tmp\\n"

        cat = sb.commands.run("cat; echo done", background=True, stdin=True)
        sb.commands.send_stdin(cat.pid, "fed\\n")
        sb.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "fed\\ndone\\n"

        sleeper = sb.commands.run("sleep 300", background=True)
        assert sleeper.pid in [p.pid for p in sb.commands.list()]
        assert sb.commands.kill(sleeper.pid)
        try:
            sleeper.wait()
            raise AssertionError("a killed command did not raise")
        except CommandExitException:
            pass
        assert sleeper.pid not in [p.pid for p in sb.commands.list()]
        assert not sb.commands.kill(sleeper.pid)

        info = sb.get_info()
        assert info.metadata == {"suite": "serve"} and info.template_id == "host", info
        assert sb.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        (metrics,) = sb.get_metrics()  # one sample, now (tests/test_serve_host.py holds the rest)
        assert metrics.mem_total == info.memory_mb << 20, (metrics, info)
        sb.kill()
        assert not sb.is_running()
        assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        """,
    )


def test_files(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import FileType, NotFoundException, Sandbox

        sb = Sandbox.create(template="host")
        info = sb.files.write("/tmp/work/a.txt", "alpha")
        assert info.path == "/tmp/work/a.txt"
        assert sb.files.read("/tmp/work/a.txt") == "alpha"
        sb.files.write("/tmp/work/bin", b"\\x00\\xff" * 1000)
        assert bytes(sb.files.read("/tmp/work/bin", format="bytes")) == b"\\x00\\xff" * 1000
        assert sb.files.exists("/tmp/work/a.txt")
        assert not sb.files.exists("/tmp/work/missing")
        try:
            sb.files.read("/tmp/work/missing")
            raise AssertionError("reading a missing file did not raise")
        except NotFoundException:
            pass

        assert sb.files.make_dir("/tmp/work/sub/deeper")
        assert not sb.files.make_dir("/tmp/work/sub/deeper")
        sb.files.write("/tmp/work/sub/deeper/c.txt", "gamma")
        top = {e.name: e for e in sb.files.list("/tmp/work")}
        assert set(top) == {"a.txt", "bin", "sub"}, top
        assert top["sub"].type == FileType.DIR and top["a.txt"].type == FileType.FILE
        assert top["a.txt"].size == 5
        deep = {e.path for e in sb.files.list("/tmp/work", depth=3)}
        assert "/tmp/work/sub/deeper/c.txt" in deep, deep

        assert sb.files.rename("/tmp/work/a.txt", "/tmp/work/b.txt").path == "/tmp/work/b.txt"
        assert sb.commands.run("cat /tmp/work/b.txt").stdout == "alpha"
        sb.files.remove("/tmp/work/sub")
        assert not sb.files.exists("/tmp/work/sub")
        assert sb.files.get_info("/tmp/work/b.txt").size == 5

        sb.commands.run("printf made > /tmp/work/by-cmd")
        assert sb.files.read("/tmp/work/by-cmd") == "made"
        sb.kill()
        """,
    )


def test_watch_dir(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import FilesystemEventType, Sandbox

        sb = Sandbox.create(template="host")
        sb.files.make_dir("/tmp/watched")
        handle = sb.files.watch_dir("/tmp/watched")
        sb.files.write("/tmp/watched/new.txt", "x")
        sb.commands.run("mkdir /tmp/watched/d")
        events = {(e.name, e.type) for e in handle.get_new_events()}
        assert ("new.txt", FilesystemEventType.CREATE) in events, events
        assert ("d", FilesystemEventType.CREATE) in events, events
        sb.commands.run("rm /tmp/watched/new.txt")
        events = {(e.name, e.type) for e in handle.get_new_events()}
        assert events == {("new.txt", FilesystemEventType.REMOVE)}, events
        handle.stop()
        sb.kill()
        """,
    )


def test_pty(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import CommandExitException, PtySize, Sandbox

        sb = Sandbox.create(template="host")
        seen = []
        term = sb.pty.create(PtySize(rows=24, cols=80), cwd="/tmp")
        sb.pty.send_stdin(term.pid, b"stty size; pwd; echo mark$((40+2))\\n")
        deadline = time.monotonic() + 60
        for _, _, pty in term:
            seen.append(pty or b"")
            if b"mark42" in b"".join(seen) or time.monotonic() > deadline:
                break
        sb.pty.resize(term.pid, PtySize(rows=30, cols=100))
        sb.pty.send_stdin(term.pid, b"stty size; exit 3\\n")
        try:
            term.wait(on_pty=seen.append)
            raise AssertionError("exit 3 did not raise")
        except CommandExitException as exc:
            assert exc.exit_code == 3, exc
        text = b"".join(seen).decode(errors="replace")
        assert "24 80" in text and "/tmp" in text and "mark42" in text and "30 100" in text, text

        term = sb.pty.create(PtySize(rows=24, cols=80))
        assert sb.pty.kill(term.pid)
        try:
            term.wait()
            raise AssertionError("a killed terminal did not raise")
        except CommandExitException:
            pass
        assert term.pid not in [p.pid for p in sb.commands.list()]
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_a_killed_terminal_ends_as_killed_when_it_exits_0_on_the_hangup(server: Served, tmp_path: Path) -> None:
    """A command that has not read its terminal yet when the kill hangs it up reads end of file and may
    exit 0 (a shell that had not set its SIGHUP handler up, here one that ignores SIGHUP): it was killed
    all the same, and wait() says so."""
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import CommandExitException, PtySize, Sandbox

        sb = Sandbox.create(template="host")
        term = sb.pty.create(PtySize(rows=24, cols=80))
        sb.pty.send_stdin(term.pid, b"trap '' HUP; echo read$((40+2)); sleep 1; exit 0\\n")
        seen, deadline = b"", time.monotonic() + 60
        for _, _, pty in term:
            seen += pty or b""
            if b"read42" in seen or time.monotonic() > deadline:
                break
        assert b"read42" in seen, seen
        assert sb.pty.kill(term.pid)  # hung up while it sleeps, SIGHUP ignored: then it exits 0
        try:
            term.wait()
            raise AssertionError("a killed terminal did not raise")
        except CommandExitException as exc:
            assert exc.exit_code == 129, exc
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_timeout_and_expiry(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import Sandbox

        sb = Sandbox.create(template="host", timeout=300)
        sb.commands.run("sleep 600", background=True)
        before = sb.get_info().end_at
        sb.set_timeout(2)
        assert sb.get_info().end_at < before
        deadline = time.monotonic() + 60
        while sb.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sb.is_running()
        assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        """,
    )


def test_connect_by_id(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox

        sb = Sandbox.create()  # the SDK's default template: default if stored, else host
        assert sb.get_info().template_id in ("default", "host")
        sb.commands.run("echo kept > /tmp/kept")
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("cat /tmp/kept").stdout == "kept\\n"
        sb.kill()
        """,
    )


def test_async_sdk(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import asyncio
        import os
        from e2b import AsyncSandbox, CommandExitException, FilesystemEventType

        async def main():
            sb = await AsyncSandbox.create(template="host", metadata={"kind": "async"})
            seen = []
            r = await sb.commands.run("echo one; echo two", on_stdout=seen.append)
            assert r.stdout == "one\\ntwo\\n" == "".join(seen), (r, seen)
            try:
                await sb.commands.run("exit 4")
                raise AssertionError("a failing command did not raise")
            except CommandExitException as failed:
                assert failed.exit_code == 4
            await sb.files.write("/tmp/async.txt", "written")
            assert await sb.files.read("/tmp/async.txt") == "written"
            assert [e.name for e in await sb.files.list("/tmp") if e.name == "async.txt"]

            await sb.files.make_dir("/tmp/seen")
            events = asyncio.Queue()
            handle = await sb.files.watch_dir("/tmp/seen", on_event=events.put_nowait, recursive=True)
            await sb.files.write("/tmp/seen/new.txt", "x")
            event = await asyncio.wait_for(events.get(), 60)
            assert (event.name, event.type) == ("new.txt", FilesystemEventType.CREATE), event
            await handle.stop()
            await sb.kill()

        asyncio.run(main())
        # main() passed (a failed assert exits 1 before this): skip the interpreter's teardown, where the
        # SDK's client stack aborts now and then (SIGABRT with no Python frame, after main() printed done)
        os._exit(0)
        """,
    )


def test_open_command_streams_do_not_hold_up_other_requests(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox

        sb = Sandbox.create(template="host")
        sleepers = [sb.commands.run("sleep 1000", background=True, timeout=0) for _ in range(4)]
        # the SDK sends each command's request chunked: four streams open, more than a key's two
        # large transfers, must not keep the next requests waiting (they timed out after 60 s)
        assert sb.commands.run("echo next", request_timeout=20).stdout == "next\\n"
        sb.files.write("/tmp/after", "x", request_timeout=20)
        assert sb.files.read("/tmp/after", request_timeout=20) == "x"
        assert len(sb.commands.list(request_timeout=20)) == 4
        sb.kill()
        """,
    )


def test_missing_or_wrong_key_is_401_and_creates_nothing(server: Served) -> None:
    _, before = api(server, "GET", "/v2/sandboxes", KEY_A)
    for key in (None, "", "jbx_" + "c" * 40, KEY_A + "x", KEY_A[:-1]):
        status, body = api(server, "POST", "/v2/sandboxes", key, {"templateID": "host"})
        assert status == 401, (key, body)
        for method, path in (("GET", "/v2/sandboxes"), ("GET", "/sandboxes/x"), ("DELETE", "/sandboxes/x")):
            assert api(server, method, path, key)[0] == 401
    _, after = api(server, "GET", "/v2/sandboxes", KEY_A)
    assert after == before


def test_wrong_key_through_the_sdk(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import AuthenticationException, Sandbox

        try:
            Sandbox.create(template="host")
            raise AssertionError("an unknown key created a sandbox")
        except AuthenticationException:
            pass
        """,
        key="jbx_" + "z" * 40,
    )


def test_another_keys_sandbox_is_not_found(server: Served, tmp_path: Path) -> None:
    sid = sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox

        print(Sandbox.create(template="host").sandbox_id)
        """,
    ).strip()
    for method, path, body in (
        ("GET", f"/sandboxes/{sid}", None),
        ("DELETE", f"/sandboxes/{sid}", None),
        ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 1}),
        ("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 10}),
        ("POST", f"/sandboxes/{sid}/refreshes", {"duration": 10}),
    ):
        assert api(server, method, path, KEY_B, body)[0] == 404, (method, path)
    _, listed = api(server, "GET", "/v2/sandboxes", KEY_B)
    assert sid not in [s["sandboxID"] for s in listed]  # type: ignore[union-attr]
    sdk(
        server,
        tmp_path,
        f"""
        from e2b import Sandbox, SandboxException

        try:
            Sandbox.connect("{sid}")
            raise AssertionError("another key connected")
        except SandboxException:
            pass
        assert not Sandbox.kill("{sid}")
        """,
        key=KEY_B,
    )
    sdk(
        server,
        tmp_path,
        f"""
        from e2b import Sandbox

        sb = Sandbox.connect("{sid}")
        assert sb.commands.run("echo still").stdout == "still\\n"
        sb.kill()
        """,
    )


def test_envd_needs_the_sandboxs_own_token(server: Served) -> None:
    made = []
    for _ in range(2):
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
        assert status == 201, body
        made.append(body)
    sid, own, other = made[0]["sandboxID"], made[0]["envdAccessToken"], made[1]["envdAccessToken"]  # type: ignore[index]
    try:
        for token in (None, "", "guess", other, own + "x", own):
            headers = {"E2b-Sandbox-Id": sid, "Content-Type": "application/json"}
            if token is not None:
                headers["X-Access-Token"] = token
            for method, path, data in (
                ("GET", "/health", None),
                ("GET", "/files?path=/etc/hostname", None),
                ("POST", "/filesystem.Filesystem/Stat", b'{"path": "/"}'),
                ("POST", "/process.Process/List", b"{}"),
            ):
                req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
                if token == own:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        assert r.status in (200, 204)
                    continue
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(req, timeout=60)
                assert refused.value.code in (502, 503), (token, path)
                assert b"was not found" in refused.value.read()
    finally:
        for body in made:
            api(server, "DELETE", f"/sandboxes/{body['sandboxID']}", KEY_A)  # type: ignore[index]


def test_bad_requests_are_named(server: Served, tmp_path: Path) -> None:
    (server.cwd / "here").mkdir(exist_ok=True)  # a directory beside the server is not a template
    (server.cwd / "here" / "secret").write_text("host data")
    for template in ("/", "../etc", "/usr", "a/b", "", None, 7, "here", "~", ".", "no-such-rootfs"):
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": template})
        assert status == 400 and "templateID" in body["message"], (template, body)  # type: ignore[index]
    for timeout in (0, -1, 10**9, "300", 1.5, True):
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host", "timeout": timeout})
        assert status == 400 and "timeout" in body["message"], (timeout, body)  # type: ignore[index]
    for metadata in ("x", {"k": 1}, {str(i): "v" for i in range(100)}):
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host", "metadata": metadata})
        assert status == 400 and "metadata" in body["message"], (metadata, body)  # type: ignore[index]
    for envs in ({"A B": "x"}, {"": "x"}, {"X": "a\0b"}, {"X": 1}, ["X"]):
        status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host", "envVars": envs})
        assert status == 400 and "envVars" in body["message"], (envs, body)  # type: ignore[index]
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox, SandboxException

        try:
            Sandbox.create(template="no-such-rootfs-stored")
            raise AssertionError("an unknown template made a sandbox")
        except SandboxException as exc:
            assert "no-such-rootfs-stored" in str(exc), exc
        sb = Sandbox.create(template="host")
        for path in ("/tmp/../etc", "../x"):
            try:
                sb.files.list(path)
                raise AssertionError(f"listed {path}")
            except SandboxException as exc:
                assert "'..'" in str(exc), exc
        sb.kill()
        """,
    )


def test_max_per_key(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import Sandbox, SandboxException

        held = len(Sandbox.list().next_items())
        made = [Sandbox.create(template="host") for _ in range(6 - held)]
        try:
            Sandbox.create(template="host")
            raise AssertionError("a seventh sandbox was made")
        except SandboxException as exc:
            assert "--max-per-key" in str(exc), exc
        for sb in made:
            sb.kill()
        Sandbox.create(template="host").kill()  # a slot freed is a slot usable again
        """,
    )


@pytest.mark.cgroup
@pytest.mark.slow
def test_the_bound_flags_bound_every_served_sandbox(tmp_path: Path) -> None:
    need_sdk()
    served = start_server(tmp_path, "--api-key-file", str(key_file(tmp_path, KEY_A)), *BOUNDS)
    try:
        code = f"""
            from e2b import Sandbox

            for _ in range(2):  # the first made for the call, the second from the warm pool it starts
                sb = Sandbox.create(template="host")
                print(sb.sandbox_id)
                print(sb.commands.run({PROBE_LINE!r}).stdout, end="=====\\n")
        """
        first, second, _ = sdk(served, tmp_path, code).split("=====\n")
        for output in (first, second):
            sid, probed = output.split("\n", 1)
            held(probed)
            status, detail = api(served, "GET", f"/sandboxes/{sid}", KEY_A)
            assert status == 200 and (detail["memoryMB"], detail["diskSizeMB"]) == (64, 8), detail  # type: ignore[index]
    finally:
        served.stop()


@pytest.mark.slow
def test_first_start_makes_a_private_key_once(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    first = start_server(tmp_path, env=env)
    first.stop()
    path = tmp_path / "config" / "jailbox" / "serve-api-keys"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    assert key in "".join(first.log)
    second = start_server(tmp_path, env=env)
    try:
        assert key not in "".join(second.log)
        assert path.read_text().strip() == key
        assert api(second, "GET", "/v2/sandboxes", key)[0] == 200
    finally:
        second.stop()


def test_key_file_must_be_private(tmp_path: Path) -> None:
    keys = key_file(tmp_path, KEY_A)
    for mode in (0o644, 0o640, 0o604):
        keys.chmod(mode)
        r = subprocess.run(
            [*JAILBOX, "serve", "--port", "0", "--api-key-file", str(keys)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and r.stderr.startswith(f"jailbox: --api-key-file {keys}: "), r.stderr
        assert "chmod 600" in r.stderr, r.stderr
    link = tmp_path / "link"
    keys.chmod(0o600)
    link.symlink_to(keys)
    r = subprocess.run(
        [*JAILBOX, "serve", "--port", "0", "--api-key-file", str(link)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "--api-key-file" in r.stderr, r.stderr


def _raw(server: Served, request: bytes) -> bytes:
    """Send ``request`` as written on a fresh connection; the reply's status line and headers."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply


def test_oversized_and_malformed_bodies_are_refused(server: Served) -> None:
    _, before = api(server, "GET", "/v2/sandboxes", KEY_A)
    auth = f"X-API-Key: {KEY_A}\r\n".encode()
    # declared too large: refused before a byte of it is read
    big = b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 999999999999\r\n\r\n"
    assert b" 413 " in _raw(server, big).split(b"\r\n")[0]
    # chunked past the bound: refused as it arrives
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    chunked = b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 70
    assert b" 413 " in _raw(server, chunked).split(b"\r\n")[0]
    # a control-plane body over 1 MiB, JSON nested past the parser, not an object
    for body in (b'{"templateID": "host", "x": "' + b"y" * (2 << 20) + b'"}', b"[" * 100000, b"[]", b"{"):
        req = urllib.request.Request(
            server.url + "/v2/sandboxes", data=body, method="POST", headers={"X-API-Key": KEY_A}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=60)
        assert refused.value.code in (400, 413), body[:20]
    _, after = api(server, "GET", "/v2/sandboxes", KEY_A)
    assert after == before
    # a Connect message over its bound, to a real sandbox with its token
    status, made = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201
    try:
        headers = {
            "E2b-Sandbox-Id": made["sandboxID"],  # type: ignore[index]
            "X-Access-Token": made["envdAccessToken"],  # type: ignore[index]
            "Content-Type": "application/proto",
        }
        for data in (b"\x0a" + b"\xff" * 10, b"\x00" * ((16 << 20) + 64)):
            req = urllib.request.Request(
                server.url + "/filesystem.Filesystem/Stat", data=data, headers=headers, method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=60)
            assert refused.value.code in (400, 413), refused.value.read()
        assert api(server, "GET", f"/sandboxes/{made['sandboxID']}", KEY_A)[0] == 200  # type: ignore[index]
    finally:
        api(server, "DELETE", f"/sandboxes/{made['sandboxID']}", KEY_A)  # type: ignore[index]


def test_a_refused_body_still_gets_its_answer(server: Served) -> None:
    """A client still sending a body the server has refused reads the refusal, not a reset: the server
    reads and drops what is in flight (bounded) before it closes."""
    head = b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\n" + f"X-API-Key: {KEY_A}\r\n".encode()
    tail = b"x" * (32 << 20)  # more than loopback's socket buffers hold: the send ends only if the server reads
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    for request in (
        head + b"Content-Length: 999999999999\r\n\r\n" + tail,  # refused on its declared size
        head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * (17 + 32),  # refused as it passes the bound
    ):
        assert b" 413 " in _raw(server, request).split(b"\r\n")[0]
    assert api(server, "GET", "/v2/sandboxes", KEY_A)[0] == 200


@pytest.mark.slow
def test_64_sandboxes_at_once(tmp_path: Path) -> None:
    """The server's whole default capacity, made concurrently through the SDK, each running a command;
    what an idle sandbox costs the server process is printed (``-s`` shows it)."""
    need_sdk()
    served = start_server(tmp_path, "--api-key-file", str(key_file(tmp_path, KEY_A)), "--max-sandboxes", "64")
    try:
        out = sdk(
            served,
            tmp_path,
            f"""
            from concurrent.futures import ThreadPoolExecutor
            import psutil
            from e2b import Sandbox, SandboxException

            server = psutil.Process({served.proc.pid})
            before = server.memory_info().rss

            def one(i):
                sb = Sandbox.create(template="host")
                assert sb.commands.run(f"echo {{i}}").stdout == f"{{i}}\\n"
                return sb

            with ThreadPoolExecutor(64) as pool:
                made = list(pool.map(one, range(64)))
            assert len({{sb.sandbox_id for sb in made}}) == 64
            print("server memory per idle sandbox:", (server.memory_info().rss - before) // 64 // 1024, "KiB")
            try:
                Sandbox.create(template="host")
                raise AssertionError("a 65th sandbox was made")
            except SandboxException as exc:
                assert "--max-sandboxes" in str(exc), exc
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda sb: sb.kill(), made))
            assert Sandbox.list().next_items() == []
            """,
        )
        print(out)
    finally:
        served.stop()


@pytest.mark.parametrize("command", [["serve"], ["mcp", "--http"]], ids=" ".join)
@pytest.mark.slow
def test_an_address_that_cannot_be_listened_on_is_one_line_naming_the_flag(tmp_path: Path, command: list[str]) -> None:
    """A port another program holds (the usual case: a second server), an address not of this machine,
    and a name that does not resolve: each is refused before anything is served, in one line that names
    the flag to change and a valid use of it."""
    token = tmp_path / "token"  # else jailbox mcp would make its token in this user's config directory
    token.write_text("t" * 32)
    token.chmod(0o600)
    extra = ["--api-key-file", str(key_file(tmp_path, KEY_A))] if command == ["serve"] else ["--token-file", str(token)]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        cases = {
            "--port": (["--port", str(taken)], f"127.0.0.1:{taken} is in use by another program"),
            "--host": (["--host", "192.0.2.1"], "cannot listen on 192.0.2.1: Cannot assign requested address"),
            "--host ": (["--host", "nosuch.invalid"], "cannot listen on nosuch.invalid: "),
        }
        for flag, (args, said) in cases.items():
            r = subprocess.run(
                [*JAILBOX, *command, *args, *extra],
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines = [line for line in r.stderr.splitlines() if not line.startswith("jailbox serve: made an API key")]
            assert r.returncode == 2 and len(lines) == 1, r.stderr
            assert lines[0].startswith(f"jailbox: {flag.strip()}: {said}"), r.stderr
            assert lines[0].endswith("; e.g. --port 0 (any free port; the server prints the address it bound)") == (
                flag == "--port"
            ), r.stderr


def test_stream_input_reaches_the_process_as_it_is_sent(server: Served, tmp_path: Path) -> None:
    """``stream_input`` (Connect's client stream, over HTTP/1.1): each chunk reaches the command before
    the next is sent, a PTY's too; a command that is gone is the SDK's NotFoundException."""
    sdk(
        server,
        tmp_path,
        """
        import time
        from e2b import NotFoundException, PtySize, Sandbox

        sb = Sandbox.create(template="host")
        watcher = Sandbox.connect(sb.sandbox_id)  # its own connection: the stream holds the first's

        def arrived(text):
            deadline = time.monotonic() + 30
            while watcher.commands.run("cat /tmp/got 2>/dev/null || true").stdout != text:
                assert time.monotonic() < deadline, "the chunk did not reach the command"
                time.sleep(0.05)

        def chunks():
            yield "first\\n"
            arrived("first\\n")  # written before the stream goes on
            yield b"second\\n"
            arrived("first\\nsecond\\n")
            for i in range(200):
                yield f"{i}\\n"

        cat = sb.commands.run("cat > /tmp/got", background=True, stdin=True)
        sb.commands.stream_input(cat.pid, chunks())
        sb.commands.close_stdin(cat.pid)
        cat.wait()
        lines = sb.files.read("/tmp/got").splitlines()
        assert lines == ["first", "second", *map(str, range(200))], lines[:5]

        term = sb.pty.create(PtySize(rows=24, cols=80))
        sb.pty.stream_input(term.pid, iter([b"echo typed$((40+2)) > /tmp/pty\\n", b"exit\\n"]))
        term.wait()
        assert sb.files.read("/tmp/pty") == "typed42\\n"

        try:
            sb.commands.stream_input(cat.pid, iter(["late\\n"]))
            raise AssertionError("a stream to a finished command did not raise")
        except NotFoundException:
            pass
        sb.kill()
        """,
    )
