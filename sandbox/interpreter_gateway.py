"""The code interpreter's gateway: runs INSIDE the jail, never imported by the host.

The host hands this file's text to ``python3 -c`` as one long-lived command of the sandbox (so nothing
in the jail's filesystem holds it), and talks to it in JSON lines over that command's stdin and
stdout. It drives one Jupyter kernel (ipykernel, through jupyter_client) per context, over unix
sockets in a private directory: no network is needed, and jails have none by default.

Requests carry an ``id`` the replies repeat. An execution answers with e2b-code-interpreter's
``/execute`` lines (``number_of_executions``, ``stdout``, ``stderr``, ``result``, ``error``,
``end_of_execution``); the other requests with one ``context``, ``contexts``, ``done`` or ``failure``
line. Each context runs its executions one after another on a thread of its own, so a long run in
one context does not hold up another, and an ``interrupt`` reaches a run in flight.

This process shares the jail with the code it runs: the host trusts nothing it says, bounds every
line and wait, and treats what comes back as data.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

# ipykernel's bundled debugger warns on stderr that CPython's frozen modules may hide breakpoints (the
# kernel inherits this; its stderr goes nowhere, but this process's is the host's reason if it ends)
os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
try:
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    if importlib.util.find_spec("ipykernel_launcher") is None:  # found, not imported: the kernel imports it
        raise ImportError("No module named 'ipykernel_launcher'")
except ImportError as exc:  # the host turns this into a one-line error naming the packages
    sys.stdout.write(json.dumps({"type": "missing", "message": str(exc)}) + "\n")
    sys.stdout.flush()
    sys.exit(3)

KERNEL_START = 60.0  # seconds a kernel may take to answer its first request
REPLY_WAIT = 30.0  # seconds a silent helper request (env vars) may take
# Kept under the host's bound on a line (INTERPRETER_LINE_MAX, 32 MiB), which ends this process: a
# kernel buffers a tight print loop into one message of any size, so streams go out in pieces, and a
# result too large to send is named on stderr instead.
STREAM_PIECE = 1 << 20  # characters
RESULT_MAX = 30 << 20  # bytes of a result's line
# A run ends on its idle status, which comes on the kernel's PUB socket: past that socket's high-water
# mark (a display loop outruns this reader under load) messages are dropped, the idle status too. So
# while the output pauses the shell socket is asked for the run's reply every REPLY_POLL seconds, and
# once that came, output silent for IOPUB_TAIL seconds ends the run (kept under the host's grace for
# an interrupted run, INTERRUPT_GRACE, 10 s).
REPLY_POLL = 0.5
IOPUB_TAIL = 3.0
# An interrupted run ends on its reply, asked for every QUIET_POLL seconds while it drains: a print loop
# outrunning this reader leaves up to the high-water mark of messages queued (1,227 of 1.1 MB each, 3.6 s
# to read, beside eight busy loops; past the host's grace under CI's load). What it left queued is read
# and dropped once its end is sent, before the next run starts (a full queue would drop that run's
# messages), until the socket is silent for QUIET_POLL seconds or for at most DRAIN_MAX seconds (a
# thread of the kernel printing on would otherwise hold the context's next run for ever).
QUIET_POLL = 0.1
DRAIN_MAX = 60.0
RESTART_WAIT = 5.0  # seconds a restart or removal waits for the run in flight to leave the kernel's sockets
# the error a run in flight ends with when its context is restarted or removed
RESTARTED = ("ContextRestarted", "the context was restarted while the code ran")
REMOVED = ("ContextRemoved", "the context was removed while the code ran")
# Run silently in each new kernel: tracebacks without colour codes, data frames also as
# e2b's ``e2b/data`` (a dict of columns, ``DataFrame.to_dict(orient="list")`` in JSON types).
SETUP = r"""
def __jailbox_setup():
    ip = get_ipython()
    ip.run_line_magic("colors", "NoColor")
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("__jailbox_no_method__")

        def __call__(self, obj):
            import json, sys
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame) or obj.size > 500_000:
                return None  # a larger frame would pass the host's bound on a line's values
            return {str(c): json.loads(obj[c].to_json(orient="values", date_format="iso")) for c in obj.columns}

    ip.display_formatter.formatters["e2b/data"] = DataFormatter(parent=ip.display_formatter)

    # ipykernel buffers a stream for 0.2 s and sends it as one message, however large: a print loop
    # made messages of hundreds of MB that took seconds to cross, even after an interrupt. Past 1 MiB
    # the writer waits for its buffer to be sent, as a pipe's writer would.
    import sys
    for stream in (sys.stdout, sys.stderr):
        write = type(stream).write

        def bounded(self, text, write=write):
            written = write(self, text)
            if self._buffer.tell() > 1 << 20:
                self.flush()
            return written

        stream.write = bounded.__get__(stream)
__jailbox_setup()
del __jailbox_setup
"""
# Jupyter MIME types and the e2b result field each fills; anything else goes to ``extra``.
FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

out_lock = threading.Lock()


class NativeSpec(KernelSpecManager):
    """ipykernel's own kernel spec (``ipykernel.kernelspec.get_kernel_dict``: this Python, ``-m
    ipykernel_launcher``), given without a search: jupyter_client's finds it by importing ipykernel
    into this process, which took 0.6-1.1 s of every start, before the kernel (which imports it
    again) was even spawned."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return KernelSpec(argv=argv, display_name="Python 3 (ipykernel)", language="python")


def send(line: dict[str, Any]) -> None:
    data = json.dumps(line, separators=(",", ":"), default=str) + "\n"
    if line.get("type") == "result" and len(data) > RESULT_MAX:
        note = f"a result of {len(data)} bytes was dropped: over the interpreter's {RESULT_MAX} bytes\n"
        data = json.dumps({"id": line["id"], "type": "stderr", "text": note}) + "\n"
    with out_lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def replied(client: Any, msg_id: str) -> dict[str, Any] | None:
    """The execute_reply to ``msg_id`` if it is in (the shell socket does not drop), else None."""
    while True:
        try:
            msg = client.get_shell_msg(timeout=0)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return dict(msg["content"])


def error_line(content: dict[str, Any]) -> dict[str, Any]:
    """An ``error`` line from an error message's content, or an execute_reply's (the same fields)."""
    return {
        "type": "error",
        "name": content.get("ename") or "",
        "value": content.get("evalue") or "",
        "traceback": "\n".join(content.get("traceback") or []),
    }


def result_line(content: dict[str, Any], main: bool) -> dict[str, Any]:
    line: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in content.get("data", {}).items():
        field = FIELDS.get(mime)
        if field is None:
            extra[mime] = value
            continue
        if field == "text" and isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] in "'\"":
            value = value[1:-1]  # as e2b's server: a string's repr loses its quotes
        line[field] = value
    if extra:
        line["extra"] = extra
    return line


class Context:
    """One kernel and the thread that runs its executions in order."""

    def __init__(self, sockets: str, language: str, cwd: str) -> None:
        self.language = language
        self.cwd = cwd
        self.jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # set by an interrupt: the run ends on its reply, and its backlog of output (a print loop can
        # queue a GB in the kernel's socket) is dropped unsent after its end (``settle``)
        self.quiet = threading.Event()
        # set by a restart (until it is done) or a removal: a run in flight ends with ``ended_by`` (its
        # kernel is about to go), and the kernel's sockets are closed only once the run has left them
        self.ending = threading.Event()
        self.ended_by = RESTARTED
        self.idle = threading.Event()
        self.idle.set()
        self.manager = KernelManager(
            kernel_name="python3",
            transport="ipc",
            ip=os.path.join(sockets, uuid.uuid4().hex),
            kernel_spec_manager=NativeSpec(),
        )
        self.start()
        self.id = uuid.uuid4().hex
        threading.Thread(target=self.serve, daemon=True).start()

    def start(self) -> None:
        # figures as PNG: matplotlib_inline hooks itself into the kernel when matplotlib is first imported
        env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
        # the kernel's own fd 1 and 2 never reach the protocol on this process's stdout, nor its stderr (the
        # host's reason when this process ends): ipykernel sends what is written to them as stream messages
        self.manager.start_kernel(cwd=self.cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=KERNEL_START)
        self.silent(SETUP)

    def silent(self, code: str, expressions: dict[str, str] | None = None) -> dict[str, Any]:
        msg_id = self.client.execute(
            code, silent=True, store_history=False, user_expressions=expressions or {}, stop_on_error=False
        )
        while True:
            reply = self.client.get_shell_msg(timeout=REPLY_WAIT)
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply["content"])

    def restart(self) -> None:
        self.end_run(RESTARTED)
        try:
            self.client.stop_channels()
            self.manager.restart_kernel(now=True)
            self.client = self.manager.client()
            self.client.start_channels()
            self.client.wait_for_ready(timeout=KERNEL_START)
            self.silent(SETUP)
        finally:
            self.ending.clear()

    def end_run(self, why: tuple[str, str]) -> None:
        """End the run in flight, if any, with ``why`` as its error, and wait (bounded) until it has."""
        self.ended_by = why
        self.ending.set()
        self.idle.wait(RESTART_WAIT)

    def serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.quiet.clear()
            self.idle.clear()
            try:
                self.execute(job)
            except Exception as exc:
                send({"id": job["id"], "type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": ""})
            finally:
                try:
                    send({"id": job["id"], "type": "end_of_execution"})
                finally:  # a restart or removal waits on it, whether or not the host still listens
                    self.settle()

    def execute(self, job: dict[str, Any]) -> None:
        rid = job["id"]
        envs = job.get("env_vars") or {}
        saved = None
        if envs:
            names = json.dumps(sorted(envs))
            reply = self.silent("", {"saved": f"{{k: __import__('os').environ.get(k) for k in {names}}}"})
            saved = reply["user_expressions"]["saved"]["data"]["text/plain"]
            self.silent(f"__import__('os').environ.update({json.dumps(envs)})")
        try:
            self.run(rid, job["code"])
        finally:
            if saved is not None and not self.ending.is_set():  # a restarted kernel has its own
                self.silent(
                    "exec('import os as o\\nfor k, v in s.items():\\n"
                    " o.environ.pop(k, None) if v is None else o.environ.__setitem__(k, v)', "
                    f"{{'s': {saved}}})"
                )

    def run(self, rid: str, code: str) -> None:
        # stop_on_error off: after an error (an interrupt too) ipykernel would otherwise abort the requests
        # that reach it next, and runs here are one at a time per context anyway
        client = self.client
        msg_id = client.execute(code, store_history=True, stop_on_error=False)
        reply: dict[str, Any] | None = None  # the execute_reply, once it came
        failed = False  # an error line was sent
        asked = 0.0  # when the shell was last asked for the reply while quiet
        while True:
            if self.ending.is_set():
                name, value = self.ended_by
                send({"id": rid, "type": "error", "name": name, "value": value, "traceback": ""})
                return
            if self.quiet.is_set() and reply is None and time.monotonic() - asked >= QUIET_POLL:
                asked = time.monotonic()
                reply = replied(client, msg_id)
                if reply is not None:  # interrupted and answered: its output still queued is not read
                    if reply.get("status") == "error" and not failed:
                        send({"id": rid, **error_line(reply)})
                    return
            try:
                msg = client.get_iopub_msg(timeout=REPLY_POLL if reply is None else IOPUB_TAIL)
            except queue.Empty:
                if reply is None:
                    reply = replied(client, msg_id)
                    continue
                # the reply came and the kernel published nothing since: its end (and maybe output before
                # it) was dropped, as a PUB socket drops past its high-water mark when this reader lags
                if reply.get("status") == "error" and not failed:
                    send({"id": rid, **error_line(reply)})
                return
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            stamp = msg["header"].get("date")
            stamp = stamp.isoformat() if hasattr(stamp, "isoformat") else stamp
            if kind == "execute_input":
                send({"id": rid, "type": "number_of_executions", "execution_count": content["execution_count"]})
            elif kind in ("stream", "execute_result", "display_data") and self.quiet.is_set():
                continue
            elif kind == "stream":
                text = content["text"]  # the host judges what the kernel (the jail's code) sent: passed as is
                pieces = [text]
                if isinstance(text, str) and len(text) > STREAM_PIECE:
                    pieces = [text[at : at + STREAM_PIECE] for at in range(0, len(text), STREAM_PIECE)]
                for piece in pieces:
                    send({"id": rid, "type": content["name"], "text": piece, "timestamp": stamp})
            elif kind in ("execute_result", "display_data"):
                send({"id": rid, **result_line(content, kind == "execute_result")})
            elif kind == "error":
                send({"id": rid, **error_line(content)})
                failed = True
            elif kind == "status" and content["execution_state"] == "idle":
                return

    def settle(self) -> None:
        """After a run: read and drop what an interrupted one left queued on the kernel's PUB socket
        (a full queue would drop the next run's messages), then mark the context idle. A restart or
        removal stops the drain: it waits for the mark before it closes the sockets read here."""
        client, end = self.client, time.monotonic() + DRAIN_MAX
        try:
            while self.quiet.is_set() and not self.ending.is_set() and time.monotonic() < end:
                try:
                    client.get_iopub_msg(timeout=QUIET_POLL)
                except queue.Empty:
                    return
        finally:
            self.idle.set()

    def shutdown(self) -> None:
        self.jobs.put(None)
        self.end_run(REMOVED)
        try:
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
        except Exception:
            pass  # the jail ends it anyway


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for a kernel, not for this process
    sockets = tempfile.mkdtemp(prefix="jailbox-interpreter-")
    contexts: dict[str, Context] = {}
    try:
        default = Context(sockets, "python", os.getcwd())
        contexts[default.id] = default
        send({"type": "ready", "default": default.id})
        for raw in sys.stdin:
            request = json.loads(raw)
            rid, op = request["id"], request["op"]
            try:
                if op == "execute":
                    context = contexts.get(request.get("context") or default.id)
                    if context is None:
                        send({"id": rid, "type": "failure", "kind": "not_found", "message": "context not found"})
                    else:
                        context.jobs.put(request)
                elif op == "create":
                    new = Context(sockets, request["language"], request["cwd"] or os.getcwd())
                    contexts[new.id] = new
                    send({"id": rid, "type": "context", "context": describe(new)})
                elif op == "list":
                    send({"id": rid, "type": "contexts", "contexts": [describe(c) for c in contexts.values()]})
                elif op in ("restart", "remove", "interrupt"):
                    context = contexts.get(request["context"])
                    if context is None:
                        send({"id": rid, "type": "failure", "kind": "not_found", "message": "context not found"})
                        continue
                    if op == "restart":
                        context.restart()
                    elif op == "interrupt":
                        context.quiet.set()
                        context.manager.interrupt_kernel()
                    else:
                        contexts.pop(context.id).shutdown()
                    send({"id": rid, "type": "done"})
            except Exception as exc:
                send({"id": rid, "type": "failure", "kind": "failed", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        for context in contexts.values():
            context.shutdown()
        shutil.rmtree(sockets, ignore_errors=True)


def describe(context: Context) -> dict[str, str]:
    return {"id": context.id, "language": context.language, "cwd": context.cwd}


main()
