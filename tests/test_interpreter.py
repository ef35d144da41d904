"""run_code: a real ipykernel in a real jail (the host rootfs, which sees the host's Debian packages),
as a notebook is used, and a gateway made hostile by the code it runs (which shares its jail)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from conftest import host_tree
from support.descriptors import held_fds

from jailbox.sandbox import AsyncSandbox, Execution, Sandbox, SandboxPool, interpreter
from jailbox.sandbox.errors import InterpreterError, InterpreterTimeout
from jailbox.sandbox.rootfs.build import load_recipe

pytestmark = pytest.mark.needs("kernel")


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    """One sandbox for the tests that keep their gateway healthy: a kernel takes seconds to start."""
    with Sandbox() as sandbox:
        yield sandbox


@pytest.mark.slow
def test_a_notebook_run_keeps_variables_plots_and_explains_errors(sb: Sandbox):
    first = sb.run_code("x = 41\nprint('hi')\nx + 1")
    assert first.text == "42" and first.logs.stdout == ["hi\n"] and first.error is None
    assert first.execution_count is not None and first.results[0].is_main_result
    assert sb.run_code("x * 2").text == "82"  # the variable survived

    plot = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    [figure] = plot.results
    assert figure.png is not None and not figure.is_main_result and not figure.extra
    assert base64.b64decode(figure.png)[:8] == b"\x89PNG\r\n\x1a\n"

    big = sb.run_code("import numpy as np, pandas as pd\npd.DataFrame(np.zeros((1000, 600)))")
    assert big.error is None and big.results[0].data is None  # over 500,000 cells: text and HTML only
    frame = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
    assert frame.results[0].data == {"a": [1, 2], "b": ["x", None]}
    assert frame.results[0].html is not None and "<table" in frame.results[0].html

    failed = sb.run_code("def f():\n    return 1 / 0\nf()")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert failed.error.value == "division by zero"
    assert "f()" in failed.error.traceback and "\x1b[" not in failed.error.traceback  # no colour codes
    assert sb.run_code("x").text == "41"  # an error leaves the context working


@pytest.mark.slow
def test_rich_formats_map_to_their_fields(sb: Sandbox):
    shown = sb.run_code(
        "from IPython.display import display, HTML, Latex, JSON, Markdown, SVG\n"
        "display(HTML('<b>b</b>'))\ndisplay(Latex(r'$x^2$'))\ndisplay(Markdown('*m*'))\n"
        "display(JSON({'k': [1]}))\n'quoted'"
    )
    html, latex, markdown, json_, main = shown.results
    assert html.html == "<b>b</b>" and latex.latex == "$x^2$" and markdown.markdown == "*m*"
    assert json_.json_ == {"k": [1]} and "json" in json_.formats()
    assert main.text == "quoted" and main.is_main_result  # one pair of quotes stripped, as e2b does
    raw = sb.run_code("from IPython.display import publish_display_data\npublish_display_data({'text/latex': 'L'})")
    assert raw.results[0].formats() == ["latex"]
    odd = sb.run_code("publish_display_data({'text/plain': 'p', 'application/x-odd': 'o'})")
    assert odd.results[0].extra == {"application/x-odd": "o"} and odd.results[0].formats() == [
        "text",
        "application/x-odd",
    ]


def test_callbacks_stream_in_order_as_the_records_come(sb: Sandbox):
    seen: list[tuple[str, str]] = []
    execution = sb.run_code(
        "import sys\nprint('a'); sys.stdout.flush()\nprint('b', file=sys.stderr); sys.stderr.flush()\n"
        "display(1)\nprint('c'); sys.stdout.flush()\n1 / 0",
        on_stdout=lambda m: seen.append(("out", m.line)),
        on_stderr=lambda m: seen.append(("err", m.line)),
        on_result=lambda r: seen.append(("result", r.text or "")),
        on_error=lambda e: seen.append(("error", e.name)),
    )
    assert seen == [("out", "a\n"), ("err", "b\n"), ("result", "1"), ("out", "c\n"), ("error", "ZeroDivisionError")]
    assert execution.logs.stderr == ["b\n"]
    records = [r.type for r in sb.stream_code("print(1)\n2")]
    assert records == ["number_of_executions", "stdout", "result", "end_of_execution"]
    line = interpreter.to_line(interpreter.StreamRecord(type="stdout", text="1\n"))
    assert line == '{"type":"stdout","text":"1\\n"}'  # e2b's /execute line: absent fields left out


@pytest.mark.slow
def test_contexts_are_independent_and_restart_and_remove(sb: Sandbox):
    sb.run_code("shared = 'default'")
    ctx = sb.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    assert sb.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    assert sb.run_code("'shared' in globals()", context=ctx).text == "False"
    sb.run_code("mine = 1", context=ctx.id)
    assert sb.run_code("'mine' in globals()").text == "False"
    assert ctx.id in [c.id for c in sb.list_code_contexts()]

    sb.restart_code_context(ctx)
    gone = sb.run_code("mine", context=ctx)
    assert gone.error is not None and gone.error.name == "NameError"
    assert sb.run_code("shared").text == "default"  # the default context was not restarted

    sb.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sb.list_code_contexts()]
    for call in (
        lambda: sb.run_code("1", context=ctx),
        lambda: sb.restart_code_context(ctx),
        lambda: sb.remove_code_context(ctx.id),
    ):
        with pytest.raises(InterpreterError, match=f"context {ctx.id} not found"):
            call()
    assert sb.run_code("1 + 1").text == "2"


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["restart", "remove"])
def test_restarting_or_removing_a_context_ends_its_run_in_flight(sb: Sandbox, ending: str):
    """The run's kernel goes: the run ends at once with an error saying why, a restarted context
    starts afresh, and the other contexts keep their state. Before, a restart left the run waiting on
    the old kernel's sockets until its timeout, and then the whole interpreter was killed; a removal
    ended it as if it had succeeded."""
    sb.run_code("kept = 'default'")
    ctx = sb.create_code_context()
    sb.run_code("mine = 1", context=ctx)
    ended: list[object] = []
    runner = threading.Thread(
        target=lambda: ended.append(sb.run_code("print('started', flush=True); import time; time.sleep(600)",
                                                context=ctx, on_stdout=lambda _: started.set(), timeout=300)),
    )  # fmt: skip
    started = threading.Event()
    runner.start()
    assert started.wait(60)
    if ending == "restart":
        sb.restart_code_context(ctx)
    else:
        sb.remove_code_context(ctx)
    runner.join(60)
    [run] = ended
    assert isinstance(run, Execution) and run.error is not None, run
    assert (run.error.name, run.error.value) == {
        "restart": ("ContextRestarted", "the context was restarted while the code ran"),
        "remove": ("ContextRemoved", "the context was removed while the code ran"),
    }[ending]
    if ending == "restart":
        assert sb.run_code("mine", context=ctx).error.name == "NameError"  # a fresh kernel
        sb.remove_code_context(ctx)
    assert sb.run_code("kept").text == "default"


@pytest.mark.slow
def test_a_long_run_in_one_context_does_not_hold_up_another(sb: Sandbox):
    other = sb.create_code_context()
    slow = threading.Thread(target=sb.run_code, args=("import time\ntime.sleep(5)",), kwargs={"context": other})
    slow.start()
    try:
        time.sleep(0.5)
        assert slow.is_alive()
        assert sb.run_code("'quick'", timeout=4).text == "quick"  # while the other context sleeps
        assert slow.is_alive()
    finally:
        slow.join()
        sb.remove_code_context(other)


def test_envs_are_set_for_one_run_then_restored(sb: Sandbox):
    probe = "import os; (os.environ.get('JB_MODE'), os.environ.get('LANG'))"
    before = sb.run_code(probe).text
    assert before == "(None, 'C.UTF-8')"
    assert sb.run_code(probe, envs={"JB_MODE": "test", "LANG": "x"}).text == "('test', 'x')"
    assert sb.run_code(probe).text == before


def test_bad_arguments_name_the_argument(sb: Sandbox):
    for call, needle in (
        (lambda: sb.run_code("1", language="python", context="x"), "language= or context="),
        (lambda: sb.run_code("1", language="r"), "language 'r'"),
        (lambda: sb.run_code(b"1"), "code must be a string"),  # type: ignore[arg-type]
        (lambda: sb.run_code("1", envs={"A": 1}), "envs must map"),  # type: ignore[dict-item]
        (lambda: sb.run_code("1", timeout=-1), "timeout must be seconds"),
        (lambda: sb.create_code_context(cwd="rel"), "cwd must be an absolute path"),
    ):
        with pytest.raises(InterpreterError, match=needle):
            call()


@pytest.mark.slow
def test_a_timeout_interrupts_the_kernel_and_the_next_run_works(sb: Sandbox):
    sb.run_code("kept = 'yes'")
    started = time.monotonic()
    with pytest.raises(InterpreterTimeout, match="1 s timeout and was interrupted"):
        sb.run_code("import time\nwhile True: time.sleep(0.01)", timeout=1)
    assert time.monotonic() - started < 1 + interpreter.INTERRUPT_GRACE
    assert sb.run_code("kept").text == "yes"


def test_closing_the_stream_early_interrupts_the_code(sb: Sandbox):
    records = sb.stream_code("import sys, time\nprint('started'); sys.stdout.flush()\ntime.sleep(60)")
    assert [next(records).type, next(records).type] == ["number_of_executions", "stdout"]
    started = time.monotonic()
    records.close()  # a client that went away
    assert sb.run_code("'next'", timeout=20).text == "next"
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_no_timeout_and_an_interrupt_from_another_thread(sb: Sandbox):
    """``timeout=0`` is no limit (as e2b's SDK); ``interrupt_code`` ends a run another thread waits on
    (a server whose client went away), and the context keeps its state."""
    sb.run_code("kept = 'still'")
    records = sb.stream_code("import sys, time\nprint('go'); sys.stdout.flush()\ntime.sleep(60)", timeout=0)
    assert [next(records).type, next(records).type] == ["number_of_executions", "stdout"]
    threading.Timer(0.5, sb.interrupt_code).start()
    rest = list(records)
    assert [r.type for r in rest[-2:]] == ["error", "end_of_execution"]
    assert rest[-2].name == "KeyboardInterrupt"  # type: ignore[union-attr]
    assert sb.run_code("import time\ntime.sleep(1.5)\nkept", timeout=0).text == "still"


@pytest.mark.slow
def test_a_timeout_does_not_count_time_paused(sb: Sandbox):
    """As exec's: 2 s of running in a 3 s timeout, with the sandbox paused 3 s meanwhile."""
    sb.run_code("'warm'")  # the gateway started: the pause falls inside the run
    done: list[str | None] = []
    code = "import time\nfor _ in range(20): time.sleep(0.1)\n'ran'"
    run = threading.Thread(target=lambda: done.append(sb.run_code(code, timeout=3).text))
    run.start()
    time.sleep(0.5)
    assert sb.pause()
    time.sleep(3)
    sb.resume()
    run.join()
    assert done == ["ran"]


@pytest.mark.slow
def test_async_twins_run_callbacks_on_the_loop():
    async def main() -> None:
        async with AsyncSandbox() as sb:
            loop_thread = threading.get_ident()
            threads: list[int] = []
            await sb.start_interpreter()
            execution = await sb.run_code("print('x')\n7", on_stdout=lambda m: threads.append(threading.get_ident()))
            assert execution.text == "7" and threads == [loop_thread]
            ctx = await sb.create_code_context()
            assert ctx.id in [c.id for c in await sb.list_code_contexts()]
            await sb.restart_code_context(ctx)
            await sb.remove_code_context(ctx)
            task = asyncio.ensure_future(sb.run_code("import time\ntime.sleep(60)"))
            await asyncio.sleep(1)
            task.cancel()  # interrupts the kernel, so the next run does not wait 60 s
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await sb.run_code("3", timeout=20)).text == "3"

    asyncio.run(main())


@pytest.mark.slow
def test_close_leaves_no_process_and_no_thread():
    sb = Sandbox()
    sb.run_code("1")
    sb.create_code_context()
    procs = psutil.Process(sb.init_pid).children(recursive=True)
    kernels = [p for p in procs if "ipykernel_launcher" in p.cmdline()]
    assert len(kernels) == 2
    sb.close()
    assert not [p for p in procs if p.is_running()]
    assert not [t for t in threading.enumerate() if t.name == f"jailbox-interpreter-{sb.id}"]
    with pytest.raises(Exception, match="closed"):
        sb.run_code("1")


@pytest.mark.slow
def test_close_during_a_run_ends_it_with_a_typed_error():
    sb = Sandbox()
    sb.run_code("1")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            sb.run_code("import time\ntime.sleep(60)")
        except BaseException as exc:
            raised.append(exc)

    waiting = threading.Thread(target=run)
    waiting.start()
    time.sleep(1)
    started = time.monotonic()
    sb.close()
    waiting.join(20)
    assert not waiting.is_alive() and time.monotonic() - started < 20
    assert len(raised) == 1 and isinstance(raised[0], InterpreterError), raised


@pytest.mark.slow
def test_reset_starts_a_fresh_interpreter():
    with Sandbox() as sb:
        sb.run_code("v = 1")
        sb.reset()
        assert sb.run_code("'v' in globals()").text == "False"


# --- a hostile gateway ------------------------------------------------------------------------------
# The gateway shares the jail with the code it runs, which can stop it, ptrace it or drive it through the
# kernel's messages. These run a gateway that says what such a takeover could make it say: a real command
# in a real jail, in place of the real gateway's source.

HOSTILE = """
import json, sys, time
sys.stdout.write({first})
sys.stdout.flush()
for raw in sys.stdin:
    rid = json.loads(raw)["id"]
    {answer}
    sys.stdout.flush()
"""
READY = json.dumps({"type": "ready", "default": "d"}) + "\n"


def _hostile(monkeypatch: pytest.MonkeyPatch, answer: str, first: str = READY) -> Sandbox:
    monkeypatch.setattr(interpreter, "GATEWAY", HOSTILE.format(first=repr(first), answer=answer))
    return Sandbox()


def _line(**fields: object) -> str:
    return f"sys.stdout.write(json.dumps(dict(id=rid, **{fields!r})) + '\\n')"


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        ("sys.stdout.write('not json\\n')", "not JSON"),
        ("sys.stdout.write('[1, 2]\\n')", "not a JSON object"),
        ("sys.stdout.write('[' * 100000 + '\\n')", "not JSON"),  # nesting past the parser's stack
        (_line(type="stdout", text=5), r"malformed line: stdout\.text"),
        (_line(type="result", png=["x"]), r"malformed line: result\.png"),
        (_line(type="result", is_main_result=True, sneaky=1), r"malformed line: result\.sneaky"),
        (_line(type="number_of_executions", execution_count="many"), "malformed line"),
        (_line(type="exec", cmd="rm -rf /"), "malformed line"),
        (_line(type="failure", kind="boom", message="x"), "malformed failure"),
        ("sys.stdout.write('x' * (4 << 20))", f"a line over {1 << 20} bytes"),
        ("sys.stdout.write('x' * (4 << 20) + '\\n')", f"a line over {1 << 20} bytes"),
    ],
)
def test_garbage_from_the_gateway_is_a_typed_error_that_ends_it(monkeypatch, answer: str, needle: str):
    monkeypatch.setattr(interpreter, "INTERPRETER_LINE_MAX", 1 << 20)
    with _hostile(monkeypatch, answer) as sb:
        with pytest.raises(InterpreterError, match=needle):
            sb.run_code("1", timeout=20)
        gateway = sb._code().gateway
        assert gateway is not None and gateway.broken is not None
        gateway.thread.join(10)
        assert not gateway.thread.is_alive()  # killed: its command ended
        assert sb.exec("true").exit_code == 0  # the sandbox itself is fine


def test_a_line_of_many_small_values_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch):
    """28 MiB of empty lists, under the line bound: parsing it built 723 MB here."""
    lists = "dict(id=rid, type='stdout', text=[[]] * 10_000_000)"
    flood = f"sys.stdout.write(json.dumps({lists}, separators=(',', ':')) + '\\n')"
    me = psutil.Process()
    with _hostile(monkeypatch, flood) as sb:
        sb.exec("true")
        base = me.memory_info().rss
        with pytest.raises(InterpreterError, match=f"JSON values, over {interpreter.INTERPRETER_LINE_VALUES}"):
            sb.run_code("1", timeout=60)
        grown = (me.memory_info().rss - base) >> 20
        assert grown < 160, f"the host grew {grown} MiB"  # the line and a copy of it, and slack


def test_garbage_in_a_context_reply_is_typed_too(monkeypatch: pytest.MonkeyPatch):
    context = "dict(id='c', language='python', cwd='/')"
    many = f"sys.stdout.write(json.dumps(dict(id=rid, type='contexts', contexts=[{context}] * 20000)) + '\\n')"
    with _hostile(monkeypatch, many) as sb, pytest.raises(InterpreterError, match="malformed reply"):
        sb.list_code_contexts()
    with _hostile(monkeypatch, _line(type="done")) as sb, pytest.raises(InterpreterError, match="something else"):
        sb.create_code_context()


@pytest.mark.slow
def test_a_gateway_that_never_answers_is_killed_after_the_grace(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(interpreter, "INTERRUPT_GRACE", 1.0)
    monkeypatch.setattr(interpreter, "INTERPRETER_WAIT", 2.0)
    with _hostile(monkeypatch, "time.sleep(3600)") as sb:
        started = time.monotonic()
        with pytest.raises(InterpreterTimeout, match="did not stop when interrupted"):
            sb.run_code("1", timeout=1)
        assert time.monotonic() - started < 1 + 1 + 5
        with pytest.raises(InterpreterError, match="did not answer 'list' in 2 s"):
            sb.list_code_contexts()  # a fresh (equally silent) gateway: the wait is bounded too


@pytest.mark.slow
def test_endless_lines_are_bounded_per_execution(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(interpreter, "INTERPRETER_EXECUTION_MAX", 1 << 20)
    monkeypatch.setattr(interpreter, "INTERRUPT_GRACE", 2.0)
    endless = f"while True: {_line(type='stdout', text='z' * 1000)}"
    with _hostile(monkeypatch, endless) as sb:
        with pytest.raises(InterpreterError, match=f"sent over {1 << 20} bytes and did not stop when interrupted"):
            sb.run_code("1", timeout=60)
        gateway = sb._code().gateway
        assert gateway is not None and gateway.broken is not None


@pytest.mark.slow
def test_a_gateway_that_does_not_start_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(interpreter, "INTERPRETER_START", 2.0)
    with _hostile(monkeypatch, "pass", first="") as sb:
        with pytest.raises(InterpreterError, match="did not start in 2 s"):
            sb.run_code("1")
    missing = json.dumps({"type": "missing", "message": "No module named jupyter_client"}) + "\n"
    with _hostile(monkeypatch, "pass", first=missing) as sb:
        with pytest.raises(InterpreterError, match="apt-get install python3-ipykernel python3-jupyter-client"):
            sb.run_code("1")
    with _hostile(monkeypatch, "pass", first="{}\n") as sb, pytest.raises(InterpreterError, match="'ready'"):
        sb.run_code("1")
    with _hostile(monkeypatch, "pass", first="{}\n") as sb:
        with pytest.raises(InterpreterError, match="'ready'"):
            sb.run_code("1")  # once first: what a process opens once and keeps is not a call's
        fds, threads = held_fds(), threading.active_count()
        for _ in range(3):
            with pytest.raises(InterpreterError, match="'ready'"):
                sb.run_code("1")
        assert held_fds() <= fds and threading.active_count() <= threads  # nothing kept


@pytest.mark.slow
def test_code_that_kills_its_gateway_leaves_no_kernel_and_the_next_call_recovers():
    with Sandbox() as sb:
        sb.run_code("1")
        with pytest.raises(InterpreterError, match="the interpreter ended"):
            sb.run_code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", timeout=20)
        deadline = time.monotonic() + 10
        while "ipykernel_launcher" in sb.exec("ps -eo args").stdout:  # the kernel notices its parent went
            assert time.monotonic() < deadline, "an orphaned kernel outlived its gateway"
            time.sleep(0.2)
        assert sb.run_code("2").text == "2"


@pytest.mark.slow
def test_a_kernel_sending_malformed_messages_ends_only_its_gateway():
    """The code drives its kernel's own iopub socket: a stream whose text is not a string."""
    with Sandbox() as sb:
        sb.run_code("1")
        forged = (
            "k = get_ipython().kernel\n"
            "k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 5}, parent=k.get_parent())"
        )
        with pytest.raises(InterpreterError, match=r"malformed line: stdout\.text"):
            sb.run_code(forged, timeout=20)
        assert sb.run_code("2").text == "2"


@pytest.mark.slow
def test_endless_output_and_results_are_bounded_per_execution(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(interpreter, "INTERPRETER_EXECUTION_MAX", 1 << 20)
    monkeypatch.setattr(interpreter, "INTERPRETER_RESULTS_MAX", 20)
    with Sandbox() as sb:
        sb.run_code("kept = 1")
        with pytest.raises(InterpreterError, match=f"over {1 << 20} bytes"):
            sb.run_code("while True: print('y' * 1000)", timeout=60)
        with pytest.raises(InterpreterError, match="was interrupted: it sent over 20 results"):
            sb.run_code("while True: display(1)", timeout=60)
        assert sb.run_code("kept").text == "1"  # interrupted, not killed: the context kept its state


# The run stops the gateway (the kernel's parent) and floods the kernel's PUB socket past its high-water
# mark, which drops the rest, the run's idle status too; the gateway goes on once the run is over.
DROPPED_END = """
import os, signal, subprocess
gateway = os.getppid()
os.kill(gateway, signal.SIGSTOP)
for i in range(5000):
    display(i)
subprocess.Popen(["sh", "-c", f"sleep 1; kill -CONT {gateway}"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("end", ["", "raise ValueError('after the flood')"], ids=["ok", "error"])
def test_a_run_whose_end_the_kernel_dropped_still_ends(monkeypatch: pytest.MonkeyPatch, end: str):
    """A display loop outruns the gateway under load and the kernel drops messages, the end of the run
    among them: the run's reply (on a socket that does not drop) ends it, with its error, and the
    context goes on. Before, the run waited for an end that never came, until it was killed."""
    monkeypatch.setattr(interpreter, "INTERPRETER_RESULTS_MAX", 10_000)
    with Sandbox() as sb:
        sb.run_code("kept = 1")
        run = sb.run_code(DROPPED_END + end, timeout=60)
        assert 0 < len(run.results) < 5000  # some of the output was dropped
        if end:
            assert run.error is not None and (run.error.name, run.error.value) == ("ValueError", "after the flood")
        else:
            assert run.error is None
        assert sb.run_code("kept").text == "1"


@pytest.mark.slow
def test_a_print_flood_costs_the_host_one_execution_bound():
    """At the default bounds: the host keeps at most an execution's 64 MiB (and a line) of what a tight
    print loop sends, and the interrupt ends the loop with the context's state kept."""
    me = psutil.Process()
    with Sandbox() as sb:
        sb.run_code("kept = 'yes'")
        base, peak, done = me.memory_info().rss, [0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], me.memory_info().rss)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            over = f"was interrupted: it sent over {interpreter.INTERPRETER_EXECUTION_MAX} bytes"
            with pytest.raises(InterpreterError, match=over):
                sb.run_code("while True: print('y' * 100000)", timeout=120)
        finally:
            done.set()
            watcher.join()
        slack = 32 << 20  # the interpreter's Python objects around the text, allocator slack
        bound = interpreter.INTERPRETER_EXECUTION_MAX + interpreter.INTERPRETER_LINE_MAX + slack
        assert peak[0] - base < bound, f"the host grew {(peak[0] - base) >> 20} MiB"  # measured: 65-71 MiB
        assert sb.run_code("kept").text == "yes"


@pytest.mark.slow
def test_a_stopped_gateway_is_killed_after_the_grace(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(interpreter, "INTERRUPT_GRACE", 1.0)
    with Sandbox() as sb:
        sb.run_code("1")
        started = time.monotonic()
        with pytest.raises(InterpreterTimeout, match="did not stop when interrupted"):
            sb.run_code(
                "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nimport time; time.sleep(60)", timeout=2
            )
        assert time.monotonic() - started < 2 + 1 + 5
        assert sb.run_code("3").text == "3"


def test_the_recipe_has_the_kernel_and_the_paper_trees_do_not():
    recipe = load_recipe("code-interpreter")
    for package in ("python3-ipykernel", "python3-jupyter-client", "python3-pandas", "python3-matplotlib"):
        assert package in recipe.packages
    for paper in ("default", "debian"):
        assert not [p for p in load_recipe(paper).packages if "ipykernel" in p or "jupyter" in p]


def test_the_host_rootfs_imports_matplotlib():
    with Sandbox() as sb:
        result = sb.exec(["python3", "-c", "import matplotlib; print(matplotlib.get_configdir() != '')"])
        assert result.exit_code == 0, result.stderr


# --- started ahead: SandboxPool(interpreter=True) and start_interpreter() ----------------------------


def _kernels(sb: Sandbox) -> list[psutil.Process]:
    """The sandbox's kernel processes, seen from the host."""
    procs = psutil.Process(sb.init_pid).children(recursive=True)
    return [p for p in procs if "ipykernel_launcher" in p.cmdline()]


def _started_kernel(sb: Sandbox) -> list[psutil.Process]:
    """The kernel a pool started before handing ``sb`` out, once its process exists (bounded: 30 s; it
    exists as soon as the gateway spawned it)."""
    deadline = time.monotonic() + 30
    while not (kernels := _kernels(sb)):
        assert time.monotonic() < deadline, "no kernel was started ahead"
        time.sleep(0.05)
    return kernels


@pytest.mark.slow
def test_a_pool_hands_out_sandboxes_with_a_kernel_started_and_nothing_of_the_last_user():
    """Each acquired sandbox has its kernel running before its first run_code, and that kernel has run
    nothing: no variable, module, environment variable, working directory or file of an earlier user,
    and its first cell is number 1. Closed sandboxes leave no kernel; the pool refills with warm ones."""
    with Sandbox():
        pass
    baseline = sorted(p.pid for p in host_tree())
    threads = set(threading.enumerate())  # an earlier test's may still be ending
    seen: list[psutil.Process] = []
    with SandboxPool(2, interpreter=True) as pool:
        assert pool.wait_ready(120)
        contexts = set()
        for user in range(4):  # more than the pool holds: it refilled in between
            assert pool.wait_ready(120)
            with pool.acquire() as sb:  # closed even when an assertion fails: no jail outlives the test
                [kernel] = _started_kernel(sb)  # before anything asked for it
                first = sb.run_code(
                    "import os, sys\n"
                    "[k for k in globals() if k.startswith('secret')], 'secretmod' in sys.modules, "
                    "os.environ.get('SECRET'), os.getcwd(), os.path.exists('/tmp/secret')"
                )
                assert first.error is None and first.execution_count == 1, first
                assert first.text == "([], False, None, '/testbed', False)", first.text
                assert [p.pid for p in _kernels(sb)] == [kernel.pid]  # the one started ahead answered
                sb.run_code(
                    f"secret_{user} = {user}\nimport json as secretmod\nsys.modules['secretmod'] = secretmod\n"
                    "os.environ['SECRET'] = 'x'\nos.chdir('/tmp')\nopen('/tmp/secret', 'w').write('x')"
                )
                [context] = sb.list_code_contexts()
                assert context.id not in contexts  # a kernel of its own, not one handed on
                contexts.add(context.id)
                seen.append(kernel)
                if user == 3:
                    assert pool.wait_ready(120)
                    sb.reset()  # a ready sandbox's jail swapped in, with its kernel started ahead
                    [fresh] = _started_kernel(sb)
                    again = sb.run_code("'secret_3' in globals(), 'secretmod' in __import__('sys').modules")
                    assert again.text == "(False, False)" and again.execution_count == 1, again
                    assert [p.pid for p in _kernels(sb)] == [fresh.pid]  # the old jail's: awaited below
                    seen.append(fresh)
            deadline = time.monotonic() + 30
            while [p for p in seen if p.is_running()]:  # every closed sandbox's kernel is gone (reaped
                assert time.monotonic() < deadline, seen  # with its jail, which the pool tears down)
                time.sleep(0.1)
        assert pool.wait_ready(120)
        assert pool.errors == []
    assert sorted(p.pid for p in host_tree()) == baseline
    assert not [t for t in set(threading.enumerate()) - threads if t.name.startswith("jailbox-interpreter-")]


@pytest.mark.slow
def test_an_interpreter_killed_while_it_starts_is_replaced_on_first_use():
    """The jail's code may kill the interpreter started ahead before it is up (the gateway alone, or
    with its kernel): the first run_code starts another rather than failing."""
    for what in ("import json", "python3"):  # the gateway (its source); the gateway and its kernel
        with Sandbox() as sb:
            sb.start_interpreter()
            deadline = time.monotonic() + 30
            while not [p for p in psutil.Process(sb.init_pid).children(recursive=True) if "-c" in p.cmdline()]:
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.01)
            sb.exec(["pkill", "-KILL", "-f", what])  # long before its kernel answers (a second or so)
            assert sb.run_code("1+1").text == "2"
            deadline = time.monotonic() + 10
            while len(_kernels(sb)) != 1:  # an orphaned kernel notices its gateway went
                assert time.monotonic() < deadline, "a kernel started ahead outlived its gateway"
                time.sleep(0.2)


@pytest.mark.slow
def test_start_interpreter_starts_the_kernel_without_waiting_and_close_ends_it():
    with Sandbox() as sb:
        sb.start_interpreter()
        [kernel] = _started_kernel(sb)
        sb.start_interpreter()  # once: a second call keeps the one running
        assert sb.run_code("1+1").text == "2" and [p.pid for p in _kernels(sb)] == [kernel.pid]
    for _ in range(3):  # closed while the kernel is still starting: nothing stays
        sb = Sandbox()
        sb.start_interpreter()
        sb.close()
        assert not [t for t in threading.enumerate() if t.name == f"jailbox-interpreter-{sb.id}"]
    assert not [p for p in psutil.process_iter(["cmdline"]) if "ipykernel_launcher" in (p.info["cmdline"] or [])
                and p.pid == kernel.pid]  # fmt: skip
