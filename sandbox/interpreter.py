"""Host side of the code interpreter: ``Sandbox.run_code`` and its contexts, in the caller's process.

A gateway (``interpreter_gateway.py``, handed to ``python3 -c``) runs as one long-lived command of the
sandbox and drives a Jupyter kernel per context; the host talks to it in JSON lines over that command's
stdin and stdout. One thread per sandbox reads the gateway's stdout and hands each line to the call
waiting for it.

The gateway shares the jail with the code it runs, so everything it says is untrusted: a line is at
most ``INTERPRETER_LINE_MAX`` bytes, an execution at most ``INTERPRETER_EXECUTION_MAX`` bytes and
``INTERPRETER_RESULTS_MAX`` results, every wait has a deadline, and every line is checked against the
typed records below before anything uses it. A gateway that breaks a rule is killed (with its kernels)
and the call raises ``InterpreterError``; the next call starts a fresh one. An execution's records are
e2b-code-interpreter's ``/execute`` lines one for one (``to_line(record)``), so a server can stream
them unchanged.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import InterpreterError, InterpreterTimeout, SandboxClosed
from .execution import ExecRun, run_sync
from .limits import (
    INTERPRETER_EXECUTION_MAX,
    INTERPRETER_LINE_MAX,
    INTERPRETER_LINE_VALUES,
    INTERPRETER_RESULTS_MAX,
    INTERPRETER_START,
    INTERPRETER_WAIT,
)
from .rootfs.image import json_values

if TYPE_CHECKING:
    from .execution import Stdin
    from .jail import Jail


class Host(Protocol):
    """What the interpreter needs of its sandbox (a ``Sandbox``, which holds it): its jail, and a
    long-lived command in it."""

    _jail: Jail

    @property
    def id(self) -> str: ...

    def begin_exec(
        self, cmd: list[str], *, stdin: Stdin | None = None, on_stdout: Callable[[bytes], None] | None = None
    ) -> ExecRun: ...


DEFAULT_TIMEOUT = 300.0  # seconds an execution may run, as e2b's SDK
INTERRUPT_GRACE = 10.0  # seconds an interrupted execution has to end before the gateway is killed
PACKAGES = "python3-ipykernel python3-jupyter-client"
GATEWAY = (Path(__file__).parent / "interpreter_gateway.py").read_text()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Result(BaseModel):
    """One displayed value of an execution, by format (e2b's ``Result``): ``execute_result`` is the
    main result (the cell's value), ``display_data`` (a figure, ``display(...)``) is not."""

    model_config = ConfigDict(frozen=True)

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None  # base64, as Jupyter sends it
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json_: dict[str, Any] | list[Any] | None = Field(None, alias="json")
    javascript: str | None = None
    data: dict[str, Any] | None = None  # a data frame's columns: DataFrame.to_dict(orient="list")
    chart: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None  # formats with no field of their own, by MIME type
    is_main_result: bool = False

    def formats(self) -> list[str]:
        """The formats present, as e2b names them."""
        names = ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json_", "javascript"]
        found = [name.rstrip("_") for name in names if getattr(self, name) is not None]
        found += [name for name in ("data", "chart") if getattr(self, name) is not None]
        return found + list(self.extra or {})


class ExecutionError(_Strict):
    """An exception the code raised: its class name, message, and the formatted traceback."""

    name: str
    value: str
    traceback: str


class OutputMessage(_Strict):
    """One chunk of a stream, as the kernel sent it (usually a line with its newline)."""

    line: str
    timestamp: str | None = None
    error: bool = False


class Logs(BaseModel):
    stdout: list[str] = Field(default_factory=list)
    stderr: list[str] = Field(default_factory=list)


class Execution(BaseModel):
    """What one ``run_code`` produced (e2b's ``Execution``)."""

    results: list[Result] = Field(default_factory=list)
    logs: Logs = Field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The main result's text: the cell's value as ``repr`` shows it."""
        return next((r.text for r in self.results if r.is_main_result), None)


class CodeContext(_Strict):
    """A kernel of its own: variables, imports and working directory not shared with other contexts."""

    id: str
    language: str
    cwd: str


# --- the wire: what the gateway may say ------------------------------------------------------------


class StreamRecord(_Strict):
    type: Literal["stdout", "stderr"]
    text: str
    timestamp: str | None = None


class ResultRecord(Result):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    type: Literal["result"]


class ErrorRecord(ExecutionError):
    type: Literal["error"]


class CountRecord(_Strict):
    type: Literal["number_of_executions"]
    execution_count: int


class EndRecord(_Strict):
    type: Literal["end_of_execution"]


Record = StreamRecord | ResultRecord | ErrorRecord | CountRecord | EndRecord
"""One line of an execution, as e2b-code-interpreter's ``/execute`` streams it."""


def to_line(record: Record) -> str:
    """The record as e2b's server writes it: JSON, absent fields left out, no newline."""
    return record.model_dump_json(by_alias=True, exclude_none=True)


class ContextReply(_Strict):
    type: Literal["context"]
    context: CodeContext


class ContextsReply(_Strict):
    type: Literal["contexts"]
    contexts: list[CodeContext] = Field(max_length=10_000)


class DoneReply(_Strict):
    type: Literal["done"]


class FailureReply(_Strict):
    type: Literal["failure"]
    kind: Literal["not_found", "failed"]
    message: str = Field(max_length=4096)


Reply = Annotated[ContextReply | ContextsReply | DoneReply | FailureReply, Field(discriminator="type")]
_RECORD: TypeAdapter[Record] = TypeAdapter(Annotated[Record, Field(discriminator="type")])
_REPLY: TypeAdapter[ContextReply | ContextsReply | DoneReply | FailureReply] = TypeAdapter(Reply)


class _Broken:
    """Put in a waiting call's queue when the gateway broke a rule or ended: the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Over:
    """Put in a waiting call's queue once its execution went over a bound: which."""

    def __init__(self, bound: str) -> None:
        self.bound = bound


class _Waiter:
    """A call waiting for lines: its queue, and what its execution has cost so far."""

    def __init__(self) -> None:
        self.lines: queue.SimpleQueue[dict[str, Any] | _Broken | _Over] = queue.SimpleQueue()
        self.size = 0
        self.results = 0
        self.over: str | None = None
        self.ended = False  # the execution's last line came


class Gateway:
    """The gateway command of one jail and the thread that reads it."""

    def __init__(self, sb: Host) -> None:
        self.jail = sb._jail
        self.paused_for = sb._jail.pausing.paused_for  # seconds the sandbox spent paused: no timeout counts them
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.waiters: dict[str, _Waiter] = {}
        self.buffer = bytearray()
        self.broken: str | None = None
        self.closed = False
        self.started = _Waiter()
        self.send_lock = threading.Lock()  # whole request lines, one caller at a time
        read_end, self.stdin = os.pipe2(os.O_CLOEXEC)
        # the command's stdin is copied from this pipe by the reading thread, as the gateway reads
        self.source = os.fdopen(read_end, "rb", buffering=0)
        try:
            self.run: ExecRun = sb.begin_exec(["python3", "-c", GATEWAY], stdin=self.source, on_stdout=self._feed)
        except BaseException:
            self.source.close()
            os.close(self.stdin)
            raise
        os.set_blocking(self.stdin, False)
        self.start_deadline = time.monotonic() + INTERPRETER_START
        self.default: str | None = None  # the default context's id, once the gateway said it is ready
        self.ready_lock = threading.Lock()
        self.waiters[""] = self.started
        self.thread = threading.Thread(target=self._pump, name=f"jailbox-interpreter-{sb.id}", daemon=True)
        self.thread.start()

    def wait_ready(self) -> str:
        """The default context's id, waiting (until ``INTERPRETER_START`` after the start) for the
        gateway to say it is ready; on failure the gateway is closed and ``InterpreterError`` raised.
        A gateway started ahead of its first call (a pool's) costs that call only what is left."""
        with self.ready_lock:
            if self.default is not None:
                return self.default
            try:
                self.default = self._ready()
            except BaseException:
                self.close()  # the command killed, its reader joined, both pipe ends closed
                raise
            finally:
                with self.lock:
                    self.waiters.pop("", None)
            return self.default

    def _ready(self) -> str:
        """Wait for the gateway's first line; the default context's id."""
        try:
            first = self._next(self.started, self.start_deadline)
        except TimeoutError:
            raise InterpreterError(f"the interpreter did not start in {INTERPRETER_START:g} s") from None
        if isinstance(first, _Over):
            first = {}
        if first.get("type") == "missing":
            raise InterpreterError(
                f"the jail's python3 has no Jupyter kernel ({str(first.get('message'))[:200]}): install "
                f"it in the root filesystem (the host's, for rootfs='host': apt-get install {PACKAGES}), "
                "or build the recipe: jailbox rootfs build code-interpreter"
            )
        default = first.get("default")
        if first.get("type") != "ready" or not isinstance(default, str):
            raise InterpreterError("the interpreter did not start: its first line was not 'ready'")
        return default

    # --- the reading thread ---

    def _pump(self) -> None:
        try:
            result = run_sync(self.run, None)
            said = result.stderr[-300:].strip()
            why = f"the interpreter ended (exit {result.exit_code})" + (f": {said}" if said else "")
        except SandboxClosed:
            why = "the sandbox was closed"
        except BaseException as exc:
            why = f"the interpreter's reader failed: {type(exc).__name__}: {exc}"
        self._break(why, kill=False)

    def _feed(self, data: bytes) -> None:
        if self.broken is not None:
            return
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self.buffer += data[start:]
                if len(self.buffer) > INTERPRETER_LINE_MAX:
                    self._break(f"the interpreter sent a line over {INTERPRETER_LINE_MAX} bytes")
                return
            if len(self.buffer) + end - start > INTERPRETER_LINE_MAX:
                self._break(f"the interpreter sent a line over {INTERPRETER_LINE_MAX} bytes")
                return
            line = bytes(self.buffer) + data[start:end]
            self.buffer.clear()
            start = end + 1
            self._line(line)
            if self.broken is not None:
                return

    def _line(self, raw: bytes) -> None:
        values = json_values(raw, strings_blanked=False)
        if values > INTERPRETER_LINE_VALUES:  # a line of empty lists builds twenty times its size
            self._break(f"the interpreter sent a line of {values} JSON values, over {INTERPRETER_LINE_VALUES}")
            return
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            self._break(f"the interpreter sent a line that is not JSON: {raw[:80]!r}")
            return
        if not isinstance(line, dict):
            self._break(f"the interpreter sent a line that is not a JSON object: {raw[:80]!r}")
            return
        rid = line.pop("id", "")
        with self.lock:
            waiter = self.waiters.get(rid) if isinstance(rid, str) else None
        if waiter is None:
            return  # an answer nobody waits for any more (a call that timed out): dropped
        waiter.size += len(raw)
        waiter.results += line.get("type") == "result"
        if waiter.over is None and (
            waiter.size > INTERPRETER_EXECUTION_MAX or waiter.results > INTERPRETER_RESULTS_MAX
        ):
            big = waiter.size > INTERPRETER_EXECUTION_MAX
            waiter.over = (
                f"over {INTERPRETER_EXECUTION_MAX} bytes" if big else f"over {INTERPRETER_RESULTS_MAX} results"
            )
            waiter.lines.put(_Over(waiter.over))
        if waiter.over is None or line.get("type") == "end_of_execution":
            waiter.lines.put(line)  # past a bound the rest is dropped: the caller interrupts the run

    def _break(self, reason: str, kill: bool = True) -> None:
        with self.lock:
            if self.broken is None:
                self.broken = reason
            waiters = list(self.waiters.values())
        for waiter in waiters:
            waiter.lines.put(_Broken(self.broken))
        if kill:
            self.kill()

    def kill(self) -> None:
        """End the gateway and its kernels (the command's whole tree)."""
        with contextlib.suppress(SandboxClosed, OSError):
            self.run.kill()

    def close(self) -> None:
        """Kill the gateway, join its reader, close both ends of its stdin pipe; once."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.kill()
        os.close(self.stdin)
        self.thread.join(timeout=INTERRUPT_GRACE)
        if not self.thread.is_alive():  # else the reader still polls it: the end goes with the object
            self.source.close()

    # --- calls ---

    def _send(self, request: dict[str, Any], deadline: float) -> None:
        data = memoryview((json.dumps(request, separators=(",", ":")) + "\n").encode())
        with self.send_lock:
            while data:
                if self.broken is not None:
                    raise InterpreterError(self.broken)
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [self.stdin], [], left)[1]:
                    self._break("the interpreter stopped reading its requests")
                    raise InterpreterError(self.broken or "the interpreter stopped reading")
                try:
                    data = data[os.write(self.stdin, data) :]
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise InterpreterError(f"the interpreter is gone: {exc}") from None

    def _next(self, waiter: _Waiter, deadline: float | None) -> dict[str, Any] | _Over:
        """The next line for ``waiter``; ``TimeoutError`` past ``deadline``, ``InterpreterError`` if
        the gateway broke."""
        try:
            line = waiter.lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if isinstance(line, _Broken):
            raise InterpreterError(line.reason)
        return line

    @contextlib.contextmanager
    def _call(self, request: dict[str, Any], deadline: float) -> Iterator[_Waiter]:
        rid = str(next(self.ids))
        waiter = _Waiter()
        with self.lock:
            if self.broken is not None:
                raise InterpreterError(self.broken)
            self.waiters[rid] = waiter
        try:
            self._send({**request, "id": rid}, deadline)
            yield waiter
        finally:
            with self.lock:
                self.waiters.pop(rid, None)

    def ask(self, request: dict[str, Any]) -> ContextReply | ContextsReply | DoneReply:
        deadline = time.monotonic() + INTERPRETER_WAIT
        with self._call(request, deadline) as waiter:
            try:
                line = self._next(waiter, deadline)
            except TimeoutError:
                raise InterpreterError(
                    f"the interpreter did not answer {request['op']!r} in {INTERPRETER_WAIT:g} s"
                ) from None
        if isinstance(line, _Over):
            self._break(f"the interpreter's answer to {request['op']!r} was {line.bound}")
            raise InterpreterError(self.broken or line.bound)
        try:
            reply = _REPLY.validate_python(line)
        except ValidationError as exc:
            self._break(f"the interpreter sent a malformed reply: {_first(exc)}")
            raise InterpreterError(self.broken or "malformed reply") from None
        if isinstance(reply, FailureReply):
            if reply.kind == "not_found":
                raise InterpreterError(f"context {request.get('context')} not found")
            raise InterpreterError(f"the interpreter could not {request['op']}: {reply.message}")
        return reply

    def execute(
        self, code: str, context: str | None, envs: dict[str, str] | None, timeout: float | None
    ) -> Iterator[Record]:
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        request = {"op": "execute", "code": code, "context": context, "env_vars": envs}
        with self._call(request, started + INTERPRETER_WAIT) as waiter:
            try:
                yield from self._records(waiter, context, timeout, deadline)
            finally:
                if not waiter.ended and self.broken is None:  # the caller stopped listening: stop the code too
                    with contextlib.suppress(InterpreterError):
                        self._interrupt(context)

    def _records(
        self, waiter: _Waiter, context: str | None, timeout: float | None, deadline: float | None
    ) -> Iterator[Record]:
        interrupted = False
        paused = self.paused_for()
        while True:
            try:
                line = self._next(waiter, deadline)
            except TimeoutError:
                assert deadline is not None  # no deadline, no timeout
                if self.paused_for() > paused:  # the code could not run meanwhile: its deadline moves on
                    deadline += self.paused_for() - paused
                    paused = self.paused_for()
                    continue
                if interrupted:
                    self._break("an interrupted execution did not end: the interpreter was killed")
                    gone = "did not stop when interrupted; its context is gone with the interpreter"
                    if waiter.over is not None:
                        raise InterpreterError(f"the execution sent {waiter.over} and {gone}") from None
                    raise InterpreterTimeout(f"the code ran past its {timeout:g} s timeout and {gone}") from None
                self._interrupt(context)
                interrupted, deadline = True, time.monotonic() + INTERRUPT_GRACE
                continue
            if isinstance(line, _Over):
                if not interrupted:
                    self._interrupt(context)
                    interrupted, deadline = True, time.monotonic() + INTERRUPT_GRACE
                continue
            if line.get("type") == "failure":
                waiter.ended = True
                try:
                    failure = FailureReply.model_validate(line)
                except ValidationError as exc:
                    self._break(f"the interpreter sent a malformed failure: {_first(exc)}")
                    raise InterpreterError(self.broken or "malformed failure") from None
                if failure.kind == "not_found":
                    raise InterpreterError(f"context {context} not found")
                raise InterpreterError(f"the interpreter could not run the code: {failure.message}")
            try:
                record = _RECORD.validate_python(line)
            except ValidationError as exc:
                self._break(f"the interpreter sent a malformed line: {_first(exc)}")
                raise InterpreterError(self.broken or "malformed line") from None
            if isinstance(record, EndRecord):
                waiter.ended = True
                if waiter.over is not None:
                    raise InterpreterError(f"the execution was interrupted: it sent {waiter.over}")
                if interrupted:
                    raise InterpreterTimeout(f"the code ran past its {timeout:g} s timeout and was interrupted")
                yield record
                return
            yield record

    def _interrupt(self, context: str | None) -> None:
        """SIGINT to the context's kernel (through jupyter_client), sent without waiting for the
        answer: the execution's own end says it stopped."""
        target = context or self.default
        if target is None:  # the default kernel is still starting: nothing runs in it yet
            return
        rid = str(next(self.ids))
        self._send({"op": "interrupt", "context": target, "id": rid}, time.monotonic() + 5)


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"[:200]


class Interpreter:
    """A sandbox's code interpreter: started on the first call, ended with the sandbox."""

    def __init__(self, sb: Host) -> None:
        self.sb = sb
        self.lock = threading.Lock()
        self.gateway: Gateway | None = None

    def start(self) -> None:
        """Start the gateway and its default kernel without waiting for them, unless one runs: the
        first call then waits only for what is left of the start."""
        with self.lock:
            gateway = self.gateway
            if gateway is None or gateway.broken is not None or gateway.closed or gateway.jail is not self.sb._jail:
                if gateway is not None:
                    gateway.close()
                self.gateway = None
                self.gateway = Gateway(self.sb)

    def _gateway(self) -> Gateway:
        with self.lock:
            gateway = self.gateway
            if gateway is not None and gateway.default is None and not gateway.closed and gateway.jail is self.sb._jail:
                try:  # started ahead (start()): if it did not come up (the jail's code may kill it), afresh
                    gateway.wait_ready()
                    return gateway
                except InterpreterError:
                    gateway = self.gateway = None  # closed by its wait
            if gateway is None or gateway.broken is not None or gateway.closed or gateway.jail is not self.sb._jail:
                if gateway is not None:
                    gateway.close()
                self.gateway = None
                gateway = Gateway(self.sb)
                gateway.wait_ready()  # closes it if it does not come up
                self.gateway = gateway
            return gateway

    def close(self) -> None:
        with self.lock:
            gateway, self.gateway = self.gateway, None
        if gateway is not None:
            gateway.close()

    def stream(
        self,
        code: str,
        language: str | None,
        context: CodeContext | str | None,
        envs: dict[str, str] | None,
        timeout: float | None,
    ) -> Iterator[Record]:
        """The execution's records as they come (e2b's ``/execute`` lines)."""
        if language is not None and context is not None:
            raise InterpreterError("run_code: give language= or context=, not both (e.g. context=ctx)")
        if language is not None and _language(language) != "python":
            raise InterpreterError(f"run_code: language {language!r} has no kernel here; use language='python'")
        if not isinstance(code, str):
            raise InterpreterError(f"run_code: code must be a string, e.g. run_code('1+1'), not {type(code).__name__}")
        if envs is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise InterpreterError("run_code: envs must map strings to strings, e.g. envs={'MODE': 'test'}")
        limit = DEFAULT_TIMEOUT if timeout is None else timeout
        if not isinstance(limit, (int, float)) or isinstance(limit, bool) or not 0 <= limit < math.inf:
            raise InterpreterError(f"run_code: timeout must be seconds, e.g. timeout=30 (0: no limit), not {timeout!r}")
        context_id = context.id if isinstance(context, CodeContext) else context
        # 0 is no limit, as in e2b's SDK: the caller ends the run by closing the stream
        return self._gateway().execute(code, context_id, envs or None, float(limit) or None)

    def run(
        self,
        code: str,
        language: str | None = None,
        context: CodeContext | str | None = None,
        on_stdout: Callable[[OutputMessage], Any] | None = None,
        on_stderr: Callable[[OutputMessage], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        execution = Execution()
        for record in self.stream(code, language, context, envs, timeout):
            if isinstance(record, StreamRecord):
                message = OutputMessage(line=record.text, timestamp=record.timestamp, error=record.type == "stderr")
                if record.type == "stdout":
                    execution.logs.stdout.append(record.text)
                    if on_stdout is not None:
                        on_stdout(message)
                else:
                    execution.logs.stderr.append(record.text)
                    if on_stderr is not None:
                        on_stderr(message)
            elif isinstance(record, ResultRecord):
                result = Result.model_validate(record.model_dump(exclude={"type"}, by_alias=True))
                execution.results.append(result)
                if on_result is not None:
                    on_result(result)
            elif isinstance(record, ErrorRecord):
                execution.error = ExecutionError(name=record.name, value=record.value, traceback=record.traceback)
                if on_error is not None:
                    on_error(execution.error)
            elif isinstance(record, CountRecord):
                execution.execution_count = record.execution_count
        return execution

    def interrupt(self, context: CodeContext | str | None) -> None:
        """SIGINT to the context's kernel, if the gateway runs: what runs there raises KeyboardInterrupt."""
        gateway = self.gateway
        if gateway is not None and gateway.broken is None:
            with contextlib.suppress(InterpreterError):
                gateway._interrupt(context.id if isinstance(context, CodeContext) else context)

    def create(self, cwd: str | None, language: str | None) -> CodeContext:
        lang = _language(language)
        if lang != "python":
            raise InterpreterError(f"create_code_context: language {language!r} has no kernel here; use 'python'")
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise InterpreterError(f"create_code_context: cwd must be an absolute path, e.g. cwd='/tmp', not {cwd!r}")
        reply = self._gateway().ask({"op": "create", "language": lang, "cwd": cwd})
        if not isinstance(reply, ContextReply):
            raise InterpreterError("the interpreter answered 'create' with something else")
        return reply.context

    def list(self) -> list[CodeContext]:
        reply = self._gateway().ask({"op": "list"})
        if not isinstance(reply, ContextsReply):
            raise InterpreterError("the interpreter answered 'list' with something else")
        return reply.contexts

    def control(self, op: Literal["restart", "remove"], context: CodeContext | str) -> None:
        context_id = context.id if isinstance(context, CodeContext) else context
        if not isinstance(context_id, str):
            raise InterpreterError(f"{op}_code_context: give a context or its id, e.g. sb.{op}_code_context(ctx)")
        reply = self._gateway().ask({"op": op, "context": context_id})
        if not isinstance(reply, DoneReply):
            raise InterpreterError(f"the interpreter answered {op!r} with something else")


def _language(language: str | None) -> str:
    """e2b's names: None is Python; ``js`` is ``javascript``, ``ts`` ``typescript``."""
    lang = (language or "python").lower()
    return {"js": "javascript", "ts": "typescript"}.get(lang, lang)
