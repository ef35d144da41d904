"""Every public method of the unmodified e2b and e2b-code-interpreter Python SDKs, called against
``jailbox serve`` as their users call them, holds to the compatibility table of ``docs/e2b-compat.md``:
a method the table says is served works (a URL it returns reaches the sandbox), and one it says is
not raises one of the SDK's own exceptions whose message names what is missing, never a 500 or a
server traceback. The table names every method; a method the SDK gains fails this test until the
table says what it does here. Both releases are held to it: the latest (the venv's) and the previous
minor release of each SDK (``support.serve.previous_sdk``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import sdk_methods
from support.sdk_methods import public_methods
from support.serve import KEY_A, PREVIOUS_DIR, Served, api, need_sdk, previous_sdk, sdk, serving

TABLE = Path(__file__).resolve().parent.parent / "docs" / "e2b-compat.md"
# Methods that only make a URL, which the caller then fetches itself: where such a URL does not reach
# the sandbox, the failure is the fetch's (urllib's here), not an SDK exception.
URL_MAKERS = {"Sandbox.get_host", "Sandbox.download_url", "Sandbox.upload_url", "Sandbox.get_mcp_url"}
ROW = re.compile(r"^\| `([A-Za-z_.]+)` \| (served|not served) \|", re.MULTILINE)

# Each call as a user of the SDK makes it, in one sandbox (a second for kill and a paused one); what
# each gave: "ok", or the exception's type, module and message.
CALLS = r'''
import datetime, io, json, time, urllib.request, urllib.error
from e2b import Sandbox, SandboxNetworkUpdate
from e2b.sandbox.commands.command_handle import PtySize
from e2b_code_interpreter import Sandbox as CodeSandbox

out = {}
def call(name, fn):
    try:
        fn()
        out[name] = "ok"
    except Exception as exc:
        out[name] = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)[:400]}

def reaches(url, data=None):
    """The URL alone (no SDK headers), as a browser or curl is given it, reaches the sandbox."""
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as reply:
        if reply.status >= 300:
            raise RuntimeError(f"HTTP {reply.status}")

sb = Sandbox.create(template="host", metadata={"suite": "compat"}, envs={"A": "1"})
call("Sandbox.create", lambda: None)
call("Sandbox.connect", lambda: Sandbox.connect(sb.sandbox_id).is_running() or 1 / 0)
call("Sandbox.is_running", lambda: sb.is_running() or 1 / 0)
call("Sandbox.get_info", lambda: sb.get_info().sandbox_id == sb.sandbox_id or 1 / 0)
call("Sandbox.set_timeout", lambda: sb.set_timeout(600))
call("Sandbox.list", lambda: sb.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()] or 1 / 0)
call("Sandbox.traffic_access_token", lambda: sb.traffic_access_token or 1 / 0)
call("Sandbox.get_metrics", lambda: sb.get_metrics())
call("Sandbox.update_network", lambda: sb.update_network(SandboxNetworkUpdate(allow_internet_access=False)))
def host():  # by the server's address and the name as Host: this machine's resolver may not know *.localhost
    sb.commands.run("python3 -m http.server 8080 --bind 127.0.0.1", background=True)
    request = urllib.request.Request(__import__("os").environ["E2B_API_URL"], headers={"Host": sb.get_host(8080)})
    for _ in range(100):
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return reply.read(1)
        except urllib.error.HTTPError as exc:
            if "nothing listens" not in exc.read().decode():
                raise
            time.sleep(0.1)
    raise RuntimeError("port 8080 never answered")
call("Sandbox.get_host", host)
call("Sandbox.download_url", lambda: (sb.files.write("/tmp/dl", "x"), reaches(sb.download_url("/tmp/dl"))))
def upload():  # as a browser's form posts a file: multipart, as envd takes it
    import httpx
    httpx.post(sb.upload_url("/tmp/ul"), files={"file": ("ul", b"x")}, timeout=5).raise_for_status()
    sb.files.read("/tmp/ul") == "x" or 1 / 0
call("Sandbox.upload_url", upload)
call("Sandbox.get_mcp_url", lambda: reaches(sb.get_mcp_url()))
call("Sandbox.get_mcp_token", lambda: sb.get_mcp_token() or 1 / 0)
call("Sandbox.git", lambda: (sb.git.init("/tmp/repo"), sb.git.status("/tmp/repo")))

fs = sb.files
call("Filesystem.write", lambda: fs.write("/tmp/f", "hello"))
call("Filesystem.write_files", lambda: fs.write_files([{"path": "/tmp/g", "data": "g"}]))
call("Filesystem.read", lambda: fs.read("/tmp/f") == "hello" or 1 / 0)
call("Filesystem.exists", lambda: fs.exists("/tmp/f") or 1 / 0)
call("Filesystem.get_info", lambda: fs.get_info("/tmp/f").size == 5 or 1 / 0)
call("Filesystem.list", lambda: "f" in [e.name for e in fs.list("/tmp")] or 1 / 0)
call("Filesystem.make_dir", lambda: fs.make_dir("/tmp/d"))
call("Filesystem.rename", lambda: fs.rename("/tmp/g", "/tmp/h"))
call("Filesystem.remove", lambda: fs.remove("/tmp/h"))
def watch():
    handle = fs.watch_dir("/tmp/d")
    fs.write("/tmp/d/new", "n")
    time.sleep(0.5)
    events = handle.get_new_events()
    handle.stop()
    if not any(e.name == "new" for e in events):
        raise RuntimeError(f"no event for the new file: {events}")
call("Filesystem.watch_dir", watch)

cmd = sb.commands
call("Commands.run", lambda: cmd.run("echo $A").stdout == "1\n" or 1 / 0)
bg = cmd.run("cat", background=True, stdin=True)  # reads until its stdin closes
call("Commands.list", lambda: bg.pid in [p.pid for p in cmd.list()] or 1 / 0)
call("Commands.connect", lambda: cmd.connect(bg.pid))
call("Commands.send_stdin", lambda: cmd.send_stdin(bg.pid, "x\n"))
call("Commands.close_stdin", lambda: cmd.close_stdin(bg.pid))
bg2 = cmd.run("cat", background=True, stdin=True)
call("Commands.stream_input", lambda: cmd.stream_input(bg2.pid, iter([b"a", b"b"])))
call("Commands.kill", lambda: cmd.kill(bg2.pid) or 1 / 0)

pty = sb.pty
term = pty.create(PtySize(rows=24, cols=80))
call("Pty.create", lambda: None)
call("Pty.resize", lambda: pty.resize(term.pid, PtySize(rows=30, cols=100)))
call("Pty.send_stdin", lambda: pty.send_stdin(term.pid, b"echo hi\n"))
call("Pty.connect", lambda: pty.connect(term.pid))
call("Pty.stream_input", lambda: pty.stream_input(term.pid, iter([b"echo a\n"])))
call("Pty.kill", lambda: pty.kill(term.pid) or 1 / 0)

call("Sandbox.pause", lambda: sb.pause())
call("Sandbox.beta_pause", lambda: Sandbox.connect(sb.sandbox_id).beta_pause())
sb = Sandbox.connect(sb.sandbox_id)
snap = {}
call("Sandbox.create_snapshot", lambda: snap.setdefault("s", sb.create_snapshot()))
call("Sandbox.list_snapshots", lambda: list(Sandbox.list_snapshots().next_items()) or 1 / 0)
call("Sandbox.fork", lambda: [child.kill() for child in sb.fork(count=1)])
call("Sandbox.delete_snapshot", lambda: Sandbox.delete_snapshot(snap["s"].snapshot_id) or 1 / 0)
call("Sandbox.kill", lambda: sb.kill() or 1 / 0)

code = CodeSandbox.create()
call("CodeSandbox.run_code", lambda: code.run_code("x = 1; x + 1").text == "2" or 1 / 0)
ctx = {}
call("CodeSandbox.create_code_context", lambda: ctx.setdefault("c", code.create_code_context()))
call("CodeSandbox.list_code_contexts", lambda: code.list_code_contexts() or 1 / 0)
call("CodeSandbox.restart_code_context", lambda: code.restart_code_context(ctx["c"]))
call("CodeSandbox.remove_code_context", lambda: code.remove_code_context(ctx["c"]))
code.kill()
print(json.dumps(out))
'''


def table() -> dict[str, str]:
    return dict(ROW.findall(TABLE.read_text()))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    need_sdk()
    tmp = tmp_path_factory.mktemp("serve-compat")
    yield from serving(tmp, keys=(KEY_A,), env={"JAILBOX_CACHE_DIR": str(tmp / "c")})


def test_the_table_names_every_public_method_of_both_sdks() -> None:
    need_sdk()
    names = public_methods()
    assert set(table()) == names, (sorted(names - set(table())), sorted(set(table()) - names))


def test_the_table_names_every_public_method_of_the_previous_release() -> None:
    """Found as the test above finds the latest's, with the previous release first on the path."""
    previous_sdk()
    script = Path(sdk_methods.__file__)
    env = {**os.environ, "PYTHONPATH": str(PREVIOUS_DIR)}
    got = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    missing = set(json.loads(got.stdout)) - set(table())
    assert missing == set(), sorted(missing)


def test_the_envd_version_parses_as_pep_440_and_unlocks_every_gate(server: Served) -> None:
    from packaging.version import Version

    status, made = api(server, "POST", "/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(made, dict), made
    try:
        assert Version(made["envdVersion"]) >= Version("0.6.4"), made  # file metadata, watch entries, mounts
    finally:
        api(server, "DELETE", f"/sandboxes/{made['sandboxID']}", KEY_A)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["latest", "previous"])
def test_every_method_does_what_the_table_says(server: Served, tmp_path: Path, release: str) -> None:
    got = json.loads(sdk(server, tmp_path, CALLS, release=release).strip().splitlines()[-1])
    wrong = {}
    for name, says in table().items():
        outcome = got.get(name, "not called")
        if says == "served" and outcome != "ok":
            wrong[name] = outcome
        if says == "not served":
            if not isinstance(outcome, dict):
                wrong[name] = outcome  # served after all
            elif not outcome["module"].startswith("e2b") and name not in URL_MAKERS:
                wrong[name] = outcome  # not the SDK's own error
            elif re.search(r"\b500\b|Traceback", outcome["message"]):
                wrong[name] = outcome
    assert wrong == {}, json.dumps(wrong, indent=1)
    assert "".join(server.log).count("Traceback") == 0
