"""``jailbox serve`` driven by the previous minor release of each unmodified E2B SDK (``e2b``,
``e2b-code-interpreter``; the latest, the venv's, is what the other ``test_serve_*`` modules drive).
``.ci/run``'s ``PREVIOUS_SDK_INSTALL`` pins them and installs them apart (``.venv/sdk-previous``); the
SDK runs in a fresh interpreter with that directory first on its path (``support.serve.sdk``).

One interpreter runs a user's whole session, to keep the suite's time: a sandbox with metadata, envs,
a timeout and its own network at create, listed, connected to, its timeout moved, its metrics;
commands in the foreground and background, fed on stdin, killed; a terminal; files written (text,
bytes, a stream, gzip), listed, moved, removed, watched, opened by signed URLs; the async classes; and
the code interpreter: variables kept, a figure as a PNG, an error's traceback, a context of its own.
Every method against the compatibility table: ``tests/test_serve_compat.py``, with both releases."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need
from support.serve import KEY_A, PREVIOUS_INSTALL, ROOT, Served, previous_sdk, sdk, serving
from support.standin import StandIn

pytestmark = pytest.mark.needs("kernel")

SESSION = r"""
import asyncio, base64, io, time
import httpx
from e2b import (
    ALL_TRAFFIC, AsyncSandbox, CommandExitException, FileType, FilesystemEventType, NotFoundException, PtySize,
    Sandbox, SandboxQuery,
)
from e2b_code_interpreter import Sandbox as CodeSandbox

def reach(sb):
    got = sb.commands.run(
        "for a in " + " ".join(f"{ip}:{port}" for ip, port in PORTS.items())
        + "; do curl -sS -m 10 http://$a/hello 2>&1; echo; done"
    ).stdout
    return "".join(ip[-1] for ip in PORTS if f"hello from {ip}:" in got)

def raises(exc_type, call):
    try:
        call()
    except exc_type as exc:
        return exc
    raise AssertionError(f"{call} did not raise {exc_type.__name__}")

# a sandbox: metadata, envs, a timeout and a network of its own at create
sb = Sandbox.create(
    "host", metadata={"sdk": "previous"}, envs={"GREETING": "hello"}, timeout=120, secure=True,
    network={"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]},
)
assert reach(sb) == "2"
dark = Sandbox.create("host", allow_internet_access=False)
assert reach(dark) == ""
dark.kill()
info = sb.get_info()
assert info.metadata == {"sdk": "previous"} and info.template_id == "host", info
listed = Sandbox.list(query=SandboxQuery(metadata={"sdk": "previous"})).next_items()
assert [(s.sandbox_id, s.metadata) for s in listed] == [(sb.sandbox_id, {"sdk": "previous"})], listed
assert Sandbox.connect(sb.sandbox_id).commands.run("echo $GREETING").stdout == "hello\n"
sb.set_timeout(600)
assert sb.get_info().end_at > info.end_at
(metrics,) = sb.get_metrics()
assert metrics.mem_total == info.memory_mb << 20, (metrics, info)

# commands
cmd = sb.commands
r = cmd.run("echo out; echo err >&2; pwd", cwd="/tmp", envs={"X": "1"})
assert (r.exit_code, r.stdout, r.stderr) == (0, "out\n/tmp\n", "err\n"), r
failed = raises(CommandExitException, lambda: cmd.run("echo nope >&2; exit 7"))
assert (failed.exit_code, failed.stderr) == (7, "nope\n")
seen = []
loop = cmd.run("for i in 1 2 3; do echo line$i; sleep 0.05; done", background=True)
assert loop.wait(on_stdout=seen.append).stdout == "line1\nline2\nline3\n" == "".join(seen), seen
cat = cmd.run("cat; echo done", background=True, stdin=True)
cmd.send_stdin(cat.pid, "fed\n")
cmd.close_stdin(cat.pid)
assert cat.wait().stdout == "fed\ndone\n"
sleeper = cmd.run("sleep 300", background=True)
assert sleeper.pid in [p.pid for p in cmd.list()]
assert cmd.connect(sleeper.pid).pid == sleeper.pid
assert cmd.kill(sleeper.pid)
raises(CommandExitException, sleeper.wait)
assert sleeper.pid not in [p.pid for p in cmd.list()] and not cmd.kill(sleeper.pid)

# a terminal
term = sb.pty.create(PtySize(rows=24, cols=80), cwd="/tmp")
sb.pty.send_stdin(term.pid, b"stty size; pwd; echo mark$((40+2))\n")
out, deadline = b"", time.monotonic() + 60
for _, _, chunk in term:
    out += chunk or b""
    if b"mark42" in out or time.monotonic() > deadline:
        break
sb.pty.resize(term.pid, PtySize(rows=30, cols=100))
sb.pty.send_stdin(term.pid, b"stty size; exit 3\n")
chunks = []
assert raises(CommandExitException, lambda: term.wait(on_pty=chunks.append)).exit_code == 3
text = (out + b"".join(chunks)).decode(errors="replace")
assert "24 80" in text and "/tmp" in text and "mark42" in text and "30 100" in text, text
term = sb.pty.create(PtySize(rows=24, cols=80))
assert sb.pty.kill(term.pid)
raises(CommandExitException, term.wait)

# files
fs = sb.files
fs.make_dir("/tmp/w")
watch = fs.watch_dir("/tmp/w")
assert fs.write("/tmp/w/a.txt", "alpha").path == "/tmp/w/a.txt"
fs.write("/tmp/w/bin", b"\x00\xff" * 1000)
fs.write("/tmp/w/streamed", io.BytesIO(b"s" * 100_000))  # file-like: an octet-stream upload
fs.write("/tmp/w/zipped", "z" * 10_000, gzip=True)
fs.write_files([{"path": "/tmp/w/many/1", "data": "1"}, {"path": "/tmp/w/many/2", "data": b"2"}])
assert fs.read("/tmp/w/a.txt") == "alpha"
assert bytes(fs.read("/tmp/w/bin", format="bytes")) == b"\x00\xff" * 1000
assert fs.get_info("/tmp/w/streamed").size == 100_000 and fs.read("/tmp/w/zipped") == "z" * 10_000
entries = {e.name: e for e in fs.list("/tmp/w")}
assert set(entries) == {"a.txt", "bin", "streamed", "zipped", "many"}, entries
assert entries["many"].type == FileType.DIR and entries["a.txt"].size == 5
assert "/tmp/w/many/2" in {e.path for e in fs.list("/tmp/w", depth=2)}
assert fs.rename("/tmp/w/a.txt", "/tmp/w/b.txt").path == "/tmp/w/b.txt"
fs.remove("/tmp/w/many")
assert not fs.exists("/tmp/w/many") and fs.exists("/tmp/w/b.txt")
raises(NotFoundException, lambda: fs.read("/tmp/w/missing"))
events = set()
deadline = time.monotonic() + 30
while ("a.txt", FilesystemEventType.RENAME) not in events and time.monotonic() < deadline:
    events |= {(e.name, e.type) for e in watch.get_new_events()}
    time.sleep(0.1)
watch.stop()
moved = {("a.txt", FilesystemEventType.RENAME), ("b.txt", FilesystemEventType.CREATE)}  # inotify's pair, as envd's
assert {("a.txt", FilesystemEventType.CREATE)} | moved <= events, events

# signed URLs: the URL alone reads and writes, a changed one is refused
got = httpx.get(sb.download_url("/tmp/w/b.txt", use_signature_expiration=60), timeout=30)
assert (got.status_code, got.text) == (200, "alpha"), (got.status_code, got.text)
put = httpx.post(sb.upload_url("/tmp/up.txt"), files={"file": ("x", b"uploaded")}, timeout=30)
assert put.status_code == 200 and fs.read("/tmp/up.txt") == "uploaded", (put.status_code, put.text)
forged = sb.download_url("/tmp/w/b.txt").replace("b.txt", "bin")
assert httpx.get(forged, timeout=30).status_code == 401

sb.kill()
assert not sb.is_running() and sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]

# the async classes
async def main():
    asb = await AsyncSandbox.create("host", metadata={"sdk": "previous-async"})
    await asb.files.write("/tmp/a", "async")
    got = (await asb.commands.run("cat /tmp/a")).stdout
    await asb.kill()
    return got
assert asyncio.run(main()) == "async"

# the code interpreter
code = CodeSandbox.create()
first = code.run_code("x = 41\nprint('hi')\nx + 1")
assert first.text == "42" and first.logs.stdout == ["hi\n"] and first.error is None, first
assert code.run_code("x * 2").text == "82"  # kept
plot = code.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
[figure] = plot.results
assert base64.b64decode(figure.png)[:8] == b"\x89PNG\r\n\x1a\n", figure
error = code.run_code("def f():\n    return 1 / 0\nf()").error
assert (error.name, error.value) == ("ZeroDivisionError", "division by zero") and "f()" in error.traceback, error
ctx = code.create_code_context(cwd="/tmp")
code.run_code("y = 3", context=ctx)
assert code.run_code("import os\n(y, os.getcwd())", context=ctx).text == "(3, '/tmp')"
assert code.run_code("y").error.name == "NameError"  # not in the default context
assert [c.id for c in code.list_code_contexts()][1:] == [ctx.id]
code.restart_code_context(ctx)
assert code.run_code("y", context=ctx).error.name == "NameError"
code.remove_code_context(ctx)
assert len(code.list_code_contexts()) == 1
code.kill()
print("session done")
"""


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[StandIn, StandIn]]:
    need("curl")
    ups = (StandIn("127.0.0.2"), StandIn("127.0.0.3"))
    yield ups
    for up in ups:
        up.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstreams: tuple[StandIn, StandIn]) -> Iterator[Served]:
    previous_sdk()
    tmp = tmp_path_factory.mktemp("serve-previous")
    yield from serving(tmp, "--network", "allow:127.0.0.0/24:*", "--warm", "1", keys=(KEY_A,))


def test_ci_installs_the_previous_minor_release_of_each_sdk() -> None:
    """The pins are each SDK's previous minor release: below the ``test`` extra's floor, the latest's
    minor less one (or less, where no release had the one between)."""
    assert PREVIOUS_INSTALL, ".ci/run no longer sets PREVIOUS_SDK_INSTALL"
    pins = dict(re.findall(r"'([a-z0-9-]+)==([0-9.]+)'", PREVIOUS_INSTALL.group(1)))
    extra = (ROOT / "pyproject.toml").read_text()
    for name, version in pins.items():
        floor = re.search(rf'"{name}>=([0-9.]+);', extra)
        assert floor, (name, "not in the test extra")
        latest, previous = (tuple(map(int, v.split(".")[:2])) for v in (floor.group(1), version))
        assert previous[0] == latest[0] and previous[1] < latest[1], (name, version, floor.group(1))


@pytest.mark.slow
def test_a_users_session_with_the_previous_release(
    server: Served, upstreams: tuple[StandIn, StandIn], tmp_path: Path
) -> None:
    ports = {f"127.0.0.{i + 2}": up.port for i, up in enumerate(upstreams)}
    out = sdk(server, tmp_path, f"PORTS = {ports!r}\n" + textwrap.dedent(SESSION), release="previous")
    assert out.splitlines()[-1] == "session done", out
    assert "".join(server.log).count("Traceback") == 0, "".join(server.log)
