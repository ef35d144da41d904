"""The live display of `jailbox bench`: in a pseudo-terminal, and with stdout a pipe."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import termios

import pytest
from support.batch_tasks import ROOT, bench_command, jails_left, responder, tasks_file
from support.llm_server import ScriptedServer

from jailbox.agent.batch import Batch, BatchConfig
from jailbox.agent.llm import LLMConfig
from jailbox.agent.progress import Progress
from jailbox.agent.tasks import load_tasks

pytestmark = pytest.mark.once  # the display is the same whoever runs it

ESC = "\x1b"


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_display_in_a_pseudo_terminal(tmp_path, _state_dir):
    path = tasks_file(tmp_path / "tasks.jsonl", 12)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    with ScriptedServer(responder=responder(delay=0.4)) as server:
        proc = subprocess.Popen(
            bench_command(path, server.url, tmp_path / "out", "--workers", "4"),
            cwd=ROOT,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm"},
        )
        os.close(slave)
        screen = read_all(master)
        proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0, screen
    assert re.search(rf"{ESC}\[\d+F", screen), "the region is redrawn in place"
    assert re.search(r"\[#*-+\] \d+/12 \d+%  0:\d\d  ETA (-|0:\d\d)", screen), "a bar with the ETA"
    assert re.search(r"  t\d+  step [012]  0:0\d", screen), "a status line per running task"
    assert re.search(r"submitted \d+; tokens [\d,]+", screen), "counts by exit status and tokens"
    assert re.search(r"\[#{30}\] 12/12 100%", screen) and "submitted 12; tokens 360" in screen
    assert "| arith | sandbox | 6 | 1.0 |" in screen, "the summary table at the end"
    assert jails_left(_state_dir) == []


def test_plain_lines_when_not_a_terminal(tmp_path, _state_dir):
    path = tasks_file(tmp_path / "tasks.jsonl", 12)
    with ScriptedServer(responder=responder()) as server:
        r = subprocess.run(
            bench_command(path, server.url, tmp_path / "out", "--workers", "4"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "TERM": "xterm"},
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    assert ESC not in r.stdout
    finished = re.findall(r"^(t\d+): submitted score=1 steps=2 tokens=30 [\d.]+s$", r.stdout, re.MULTILINE)
    assert sorted(finished) == sorted(f"t{i}" for i in range(12))
    assert "progress: 12/12 done, 0 running, submitted 12; tokens 360" in r.stdout
    assert "| mult | sandbox | 6 | 1.0 |" in r.stdout


@pytest.mark.slow
def test_plain_summary_lines_come_while_tasks_run(tmp_path):
    tasks = load_tasks(tasks_file(tmp_path / "tasks.jsonl", 8))
    stream = io.StringIO()
    with ScriptedServer(responder=responder(delay=0.3)) as server:
        llm = LLMConfig(model="m", base_url=server.url, api_key="k")
        with Progress(8, stream, summary_every=0.2) as progress:
            Batch(tasks, llm, tmp_path / "out", BatchConfig(workers=2), observer=progress).run()
    text = stream.getvalue()
    assert ESC not in text
    assert re.search(r"progress: [0-7]/8 done, [12] running", text), "a periodic summary mid-run"
    assert text.rstrip().splitlines()[-1].startswith("progress: 8/8 done, 0 running, submitted 8; tokens 240")


def test_a_note_from_ctrl_c_never_waits_for_the_display_lock():
    """Ctrl-C's handler runs in the main thread, which it may interrupt while that holds the lock
    (printing a finished task): the note must not wait for it (it did, and `jailbox bench` hung)."""
    out = io.StringIO()
    with Progress(1, out, tty=False) as progress:
        with progress._lock:  # the main thread, interrupted inside it
            progress.note("jailbox: finishing the running tasks")
    assert "jailbox: finishing the running tasks\n" in out.getvalue()
