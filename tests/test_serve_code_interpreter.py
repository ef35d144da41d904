"""``jailbox serve``'s code interpreter (port 49999) driven by the unmodified ``e2b-code-interpreter``
SDK, pointed at it with environment variables only, and by raw HTTP where the SDK cannot misbehave.

The server runs as a subprocess on loopback, its sandboxes on the host rootfs, whose Debian Python has
a Jupyter kernel (``needs("kernel")``); the SDK runs in a fresh interpreter per test. Real jails, real
kernels."""

from __future__ import annotations

import http.client
import importlib.util
import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import host_tree, require
from support.serve import KEY_A, KEY_B, Served, api, sdk, serving

pytestmark = pytest.mark.needs("kernel")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require(
        importlib.util.find_spec("e2b_code_interpreter") is not None,
        "the e2b-code-interpreter SDK (Python 3.11+)",
        "pip install -e '.[test]' with Python 3.11 or newer",
    )
    yield from serving(tmp_path_factory.mktemp("serve-interpreter"), "--warm", "0")


@pytest.mark.slow
def test_a_notebook_run_through_the_sdk(server: Served, tmp_path: Path) -> None:
    """Variables kept between calls, a figure as a PNG, a data frame's columns, an exception's
    traceback, and the callbacks in order, from the SDK's default ``Sandbox.create()``."""
    sdk(
        server,
        tmp_path,
        """
        import base64
        from e2b_code_interpreter import Sandbox

        sb = Sandbox.create()  # the SDK's code-interpreter-v1: the host tree here
        assert sb.traffic_access_token
        first = sb.run_code("x = 41\\nprint('hi')\\nx + 1")
        assert first.text == "42" and first.logs.stdout == ["hi\\n"] and first.error is None, first
        assert first.execution_count == 1 and first.results[0].is_main_result
        assert sb.run_code("x * 2", language="python").text == "82"  # kept, in the default context

        plot = sb.run_code("import matplotlib.pyplot as plt\\nplt.plot([1, 3, 2])\\nplt.show()")
        [figure] = plot.results
        assert figure.png and not figure.is_main_result and "png" in figure.formats(), figure
        assert base64.b64decode(figure.png)[:8] == b"\\x89PNG\\r\\n\\x1a\\n"

        frame = sb.run_code("import pandas as pd\\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
        assert frame.results[0].data == {"a": [1, 2], "b": ["x", None]}, frame.results[0].data
        assert "<table" in frame.results[0].html

        failed = sb.run_code("def f():\\n    return 1 / 0\\nf()")
        assert failed.error.name == "ZeroDivisionError" and failed.error.value == "division by zero"
        assert "f()" in failed.error.traceback and "\\x1b[" not in failed.error.traceback
        assert sb.run_code("x").text == "41"

        seen = []
        done = sb.run_code(
            "import sys\\nprint('a'); sys.stdout.flush()\\nprint('b', file=sys.stderr); sys.stderr.flush()\\n"
            "display(1)\\nprint('c'); sys.stdout.flush()\\n1 / 0",
            on_stdout=lambda m: seen.append(("out", m.line, m.error)),
            on_stderr=lambda m: seen.append(("err", m.line, m.error)),
            on_result=lambda r: seen.append(("result", r.text, r.is_main_result)),
            on_error=lambda e: seen.append(("error", e.name, None)),
        )
        assert seen == [
            ("out", "a\\n", False), ("err", "b\\n", True), ("result", "1", False), ("out", "c\\n", False),
            ("error", "ZeroDivisionError", None),
        ], seen
        assert done.logs.stdout == ["a\\n", "c\\n"] and done.logs.stderr == ["b\\n"]

        envs = sb.run_code("import os\\nos.environ.get('MODE')", envs={"MODE": "test"})
        assert envs.text == "test" and sb.run_code("os.environ.get('MODE')").text is None
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_contexts_through_the_sdk(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        from e2b import InvalidArgumentException, NotFoundException, SandboxException
        from e2b_code_interpreter import Sandbox

        sb = Sandbox.create(template="host")
        ctx = sb.create_code_context(cwd="/tmp")
        assert (ctx.language, ctx.cwd) == ("python", "/tmp"), vars(ctx)
        listed = sb.list_code_contexts()
        assert len(listed) == 2 and listed[1].id == ctx.id, [vars(c) for c in listed]  # the default one first
        sb.run_code("y = 3", context=ctx)
        assert sb.run_code("import os\\n(y, os.getcwd())", context=ctx).text == "(3, '/tmp')"
        assert sb.run_code("y").error.name == "NameError"  # not in the default context
        sb.restart_code_context(ctx)
        assert sb.run_code("y", context=ctx).error.name == "NameError"  # gone with the restart
        sb.remove_code_context(ctx.id)  # by id too
        assert [c.id for c in sb.list_code_contexts()] == [listed[0].id]

        for call in (
            lambda: sb.run_code("1", context=ctx),
            lambda: sb.restart_code_context(ctx),
            lambda: sb.remove_code_context("no-such-context"),
        ):
            try:
                call()
                raise AssertionError("a removed context answered")
            except NotFoundException as exc:
                assert "not found" in str(exc), exc
        for call in (
            lambda: sb.run_code("1", language="r"),
            lambda: sb.run_code("1", language="javascript"),
            lambda: sb.create_code_context(language="bash"),
        ):
            try:
                call()
                raise AssertionError("a language without a kernel answered")
            except SandboxException as exc:
                assert "400" in str(exc) and "has no kernel in jailbox serve" in str(exc), exc
        try:
            sb.create_code_context(cwd="relative")
            raise AssertionError("a relative cwd was taken")
        except SandboxException as exc:
            assert "cwd must be an absolute path" in str(exc), exc
        try:
            sb.run_code("1", language="python", context=listed[0])
            raise AssertionError("language and context together were taken")
        except InvalidArgumentException:
            pass
        sb.kill()
        """,
    )


@pytest.mark.slow
def test_timeouts_a_killed_sandbox_and_a_missing_kernel(server: Served, tmp_path: Path) -> None:
    """The SDK's ``timeout`` is its read deadline: past it the SDK raises and the server, seeing the
    client gone, interrupts the run (the next one in the context starts well before the first
    would have ended); ``timeout=0`` waits as long as the run takes, across keepalives. A sandbox
    killed during a run and after it, and a tree without a kernel, give the SDK's own errors."""
    sdk(
        server,
        tmp_path,
        """
        import threading, time
        from e2b import SandboxException, TimeoutException
        from e2b_code_interpreter import Sandbox

        sb = Sandbox.create(template="host")
        started = time.monotonic()
        try:
            sb.run_code("import time\\ntime.sleep(40)\\nslept = True", timeout=2)
            raise AssertionError("a run past its timeout returned")
        except TimeoutException as exc:
            assert "Execution timed out" in str(exc), exc
        after = sb.run_code("'slept' in dir()", timeout=30)
        assert after.text == "False", after  # interrupted, not finished
        assert time.monotonic() - started < 30, time.monotonic() - started

        slow = sb.run_code("import time\\ntime.sleep(6)\\n'waited'", timeout=0)  # past a keepalive
        assert slow.text == "waited" and slow.error is None, slow

        failed = []
        def run():
            try:
                sb.run_code("import time\\ntime.sleep(60)")
            except Exception as exc:
                failed.append(exc)
        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(2)
        Sandbox.kill(sb.sandbox_id)
        runner.join(30)
        assert not runner.is_alive()
        assert len(failed) == 1 and isinstance(failed[0], TimeoutException), failed
        assert "killed while the request was in progress" in str(failed[0]), failed
        for call in (lambda: sb.run_code("1"), sb.list_code_contexts, sb.create_code_context):
            try:
                call()
                raise AssertionError("a killed sandbox answered")
            except TimeoutException as exc:
                assert "was not found" in str(exc), exc

        bare = Sandbox.create(template="host")
        # a module beside the interpreter's cwd shadows the host's jupyter_client: as a tree without it
        bare.files.write("/testbed/jupyter_client.py", "raise ImportError('No module named jupyter_client')")
        try:
            bare.run_code("1")
            raise AssertionError("a run without a kernel answered")
        except SandboxException as exc:
            assert "503" in str(exc) and "no Jupyter kernel" in str(exc), exc
            assert "python3-ipykernel" in str(exc) and "jailbox rootfs build code-interpreter" in str(exc), exc
        bare.kill()
        """,
    )


@pytest.mark.slow
def test_the_async_sdk(server: Served, tmp_path: Path) -> None:
    sdk(
        server,
        tmp_path,
        """
        import asyncio, os
        from e2b_code_interpreter import AsyncSandbox

        async def main():
            sb = await AsyncSandbox.create(template="host")
            await sb.run_code("n = 20")
            lines = []
            done = await sb.run_code("print(n); n + 1", on_stdout=lambda m: lines.append(m.line))
            assert done.text == "21" and lines == ["20\\n"], (done, lines)
            ctx = await sb.create_code_context()
            assert ctx.id in [c.id for c in await sb.list_code_contexts()]
            await sb.remove_code_context(ctx)
            await sb.kill()

        asyncio.run(main())
        os._exit(0)  # main() passed: the SDK's client stack aborts now and then in teardown (test_serve_e2b)
        """,
    )


# --- raw HTTP: what the SDK never sends -------------------------------------------------------------


def _post(server: Served, path: str, headers: dict[str, str], body: bytes | None, method: str = "POST"):
    url = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request(method, path, body=body, headers=headers)
    return conn, conn.getresponse()


@pytest.fixture
def made(server: Served) -> Iterator[dict]:
    status, body = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(body, dict), body
    yield body
    api(server, "DELETE", f"/sandboxes/{body['sandboxID']}", KEY_A)


def _headers(made: dict, **tokens: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": made["sandboxID"], "E2b-Sandbox-Port": "49999", **tokens}


@pytest.mark.slow
def test_execute_streams_lines_and_keepalives(server: Served, made: dict) -> None:
    headers = _headers(made, **{"X-Access-Token": made["envdAccessToken"], "Content-Type": "application/json"})
    code = "import sys, time\nprint('one'); sys.stdout.flush()\ntime.sleep(6)\n'two'"
    conn, response = _post(server, "/execute", headers, json.dumps({"code": code}).encode())
    try:
        assert response.status == 200
        lines = [json.loads(line) for line in response.read().splitlines()]
    finally:
        conn.close()
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "number_of_executions" and kinds[-1] == "end_of_execution", kinds
    assert "keepalive" in kinds, kinds  # six silent seconds
    assert lines[1] == {"type": "stdout", "text": "one\n", "timestamp": lines[1]["timestamp"]}
    assert {"type": "result", "text": "two", "is_main_result": True} in lines, lines


def test_the_interpreter_needs_a_token_of_its_sandbox(server: Served, made: dict) -> None:
    """Without the sandbox's access token or traffic token, every interpreter call is answered as a
    sandbox that does not exist, its body unread; the traffic token opens the interpreter only."""
    status, other = api(server, "POST", "/v2/sandboxes", KEY_A, {"templateID": "host"})
    assert status == 201 and isinstance(other, dict)
    try:
        traffic, access = made["trafficAccessToken"], made["envdAccessToken"]
        assert traffic and traffic != access
        wrong: list[dict[str, str]] = [
            {},
            {"X-Access-Token": ""},
            {"E2B-Traffic-Access-Token": traffic + "x"},
            {"E2B-Traffic-Access-Token": other["trafficAccessToken"]},
            {"X-Access-Token": other["envdAccessToken"]},
        ]
        calls = (("GET", "/contexts", None), ("POST", "/execute", b'{"code": "1"}'), ("POST", "/contexts", b"{}"))
        for tokens in wrong:
            for method, path, body in calls:
                conn, response = _post(server, path, _headers(made, **tokens), body, method)
                said = response.read()
                conn.close()
                assert response.status == 502 and b"was not found" in said, (tokens, path, said)
        for tokens in ({"E2B-Traffic-Access-Token": traffic}, {"X-Access-Token": access}):
            conn, response = _post(server, "/contexts", _headers(made, **tokens), None, "GET")
            assert response.status == 200 and len(json.loads(response.read())) == 1
            conn.close()
        # the traffic token is not the daemon's: files, commands stay closed to it
        envd = {"E2b-Sandbox-Id": made["sandboxID"], "E2B-Traffic-Access-Token": traffic}
        conn, response = _post(server, "/files?path=/etc/hostname", envd, None, "GET")
        assert response.status == 502
        conn.close()
    finally:
        api(server, "DELETE", f"/sandboxes/{other['sandboxID']}", KEY_A)


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"not json", b"must be JSON"),
        (b"[1]", b"must be a JSON object"),
        (b'{"code": 7}', b"code must be a string"),
        (b'{"code": "1", "context_id": 7}', b"context_id must be a string"),
        (b'{"code": "1", "language": ["python"]}', b"language must be a string"),
        (b'{"code": "1", "language": "python", "context_id": "x"}', b"not both"),
        (b'{"code": "1", "env_vars": ["A"]}', b"env_vars must map"),
        (b'{"code": "1", "env_vars": {"A": 1}}', b"env_vars must map"),
        (b'{"code": "1", "env_vars": {"A=B": "1"}}', b"env_vars: environment variable name"),
        (b'{"code": "1", "env_vars": {"A": "\\u0000"}}', b"NUL"),
        (b'{"code": "1", "context_id": "no-such"}', b"not found"),
        (b"[" * 100 + b"]" * 100, b"nested at most"),
        (b"[" + b"[]," * 70_000 + b"[]]", b"at most 65536 elements"),
        (b'{"code": "' + b"\\ud800" + b'"}', None),  # a lone surrogate: Python keeps it, the kernel's codec refuses
    ],
)
def test_bad_bodies_are_named_never_a_500(server: Served, made: dict, body: bytes, needle: bytes | None) -> None:
    headers = _headers(made, **{"X-Access-Token": made["envdAccessToken"]})
    conn, response = _post(server, "/execute", headers, body)
    said = response.read()
    conn.close()
    if needle is None:  # whatever it is, it is answered, and not with a 500
        assert response.status != 500 and b"Traceback" not in said, said
        return
    assert response.status in (400, 404) and needle in said, said
    assert b"Traceback" not in said


@pytest.mark.slow
def test_a_client_that_goes_away_has_its_run_interrupted_and_leaves_no_thread(server: Served, made: dict) -> None:
    """A client that closes during a run (the SDK past its timeout, a killed agent) is found by the
    next keepalive: the run is interrupted, the context keeps working, and the run's reader thread
    ends."""
    headers = _headers(made, **{"X-Access-Token": made["envdAccessToken"]})
    conn, response = _post(server, "/execute", headers, b'{"code": "1"}')
    assert response.status == 200 and b"end_of_execution" in response.read()  # the kernel started
    conn.close()
    serving = psutil.Process(server.proc.pid)
    time.sleep(0.5)
    before = serving.num_threads()
    code = "import time\nprint('go', flush=True)\ntime.sleep(60)\nfinished = True"
    started = time.monotonic()
    for _ in range(2):
        conn, response = _post(server, "/execute", headers, json.dumps({"code": code}).encode())
        assert response.status == 200
        # the second waits for the first to be interrupted: keepalives meanwhile
        kinds: list[str] = []
        while kinds[-1:] != ["stdout"] and len(kinds) < 20:  # 100 s of keepalives at most
            kinds.append(json.loads(response.readline())["type"])
        assert [k for k in kinds if k != "keepalive"] == ["number_of_executions", "stdout"], kinds
        response.close()
        conn.close()  # gone, the run still sleeping
    conn, response = _post(server, "/execute", headers, b'{"code": "\'finished\' in dir()"}')
    lines = [json.loads(line) for line in response.read().splitlines()]
    conn.close()
    assert {"type": "result", "text": "False", "is_main_result": True} in lines, lines  # interrupted, twice
    assert time.monotonic() - started < 45  # not the 120 s two runs would take
    deadline = time.monotonic() + 15
    while serving.num_threads() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serving.num_threads() <= before


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require(
        importlib.util.find_spec("e2b_code_interpreter") is not None,
        "the e2b-code-interpreter SDK (Python 3.11+)",
        "pip install -e '.[test]' with Python 3.11 or newer",
    )
    yield from serving(tmp_path_factory.mktemp("serve-interpreter-warm"), "--warm", "1")


def _server_kernels(server: Served) -> set[int]:
    """The kernels the server's jails run, by pid (``host_tree`` may name a process twice)."""
    return {p.pid for p in host_tree(server.proc.pid) if "ipykernel_launcher" in p.cmdline()}


@pytest.mark.slow
def test_the_sdk_gets_a_sandbox_whose_kernel_started_ahead_and_ran_nothing(warm_server: Served, tmp_path: Path) -> None:
    """``Sandbox.create()`` of the code-interpreter SDK from a warm pool: the kernel runs before the first
    ``run_code`` (the sandbox's own ``ps`` shows it), and has nothing of the previous user: no variable,
    module, environment variable, working directory or file, and its first cell is number 1, for one
    user after another (the pool refilling between them), with both keys. A sandbox of the plain
    ``e2b`` SDK's template gets no kernel. Killed sandboxes leave no kernel: the server ends up running
    just the pool's one."""
    script = """
        import time
        from e2b_code_interpreter import Sandbox

        contexts = set()
        for user in range(3):
            sb = Sandbox.create()
            deadline = time.monotonic() + 30
            while "ipykernel_launcher" not in sb.commands.run("ps -eo args").stdout:  # no run_code yet
                assert time.monotonic() < deadline, "no kernel was started ahead"
                time.sleep(0.1)
            first = sb.run_code(
                "import os, sys\\n"
                "[k for k in globals() if k.startswith('secret')], 'secretmod' in sys.modules, "
                "os.environ.get('SECRET'), os.path.exists('/tmp/secret')"
            )
            assert first.error is None and first.execution_count == 1, first
            assert first.text == "([], False, None, False)", first.text
            sb.run_code(
                f"secret_{user} = {user}\\nimport json as secretmod\\nsys.modules['secretmod'] = secretmod\\n"
                "os.environ['SECRET'] = 'x'\\nopen('/tmp/secret', 'w').write('x')"
            )
            [context] = sb.list_code_contexts()
            assert context.id not in contexts
            contexts.add(context.id)
            sb.kill()
            time.sleep(0.5)  # the pool refills (a create meanwhile would be built cold, and still fresh)
        """
    sdk(warm_server, tmp_path, script)
    sdk(warm_server, tmp_path, script, key=KEY_B)
    sdk(
        warm_server,
        tmp_path,
        """
        from e2b import Sandbox

        sb = Sandbox.create(template="host")
        assert "ipykernel_launcher" not in sb.commands.run("ps -eo args").stdout
        sb.kill()
        """,
    )
    deadline = time.monotonic() + 60
    while len(_server_kernels(warm_server)) != 1:  # the warm one; every killed sandbox's is gone
        assert time.monotonic() < deadline, _server_kernels(warm_server)
        time.sleep(0.2)
