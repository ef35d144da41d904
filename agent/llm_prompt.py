"""The prompt of ``--mode llm``: the same model answering without tools, the baseline a sandbox run is compared to.

As in the reference's plain-LLM mode, the model gets the task's text, with the task's documents written into
the prompt (it has no other way to read them), and is asked for a ``\\boxed{}`` answer only where the scorer
reads one (``math``); a multiple-choice or free-text task is not told to box its answer. The wording is
jailbox's own.

Runs where the task runs (a driver thread or a Ray worker). Documents are bounded: at most ``DOCUMENT_CHARS``
characters in all, each ``@path`` file read through ``inputs.open_beneath`` (beneath the inputs root, no symlink
followed) and at most as much as is still allowed; where one is cut the prompt says so and how much was left out.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from . import inputs
from .tasks import Task

DOCUMENT_CHARS = 1_000_000
BOXED_SCORERS = frozenset({"math"})
BOXED_SUFFIX = "\n\nReason step by step, and give the final answer in \\boxed{}."


def _read(task: Task, name: str, value: str, inputs_root: Path | None, room: int) -> tuple[str, bool] | None:
    """Up to ``room`` characters of one input, and whether there was more; None for a directory."""
    if not value.startswith(inputs.PREFIX):
        return value[:room], len(value) > room
    fd = inputs.open_beneath(inputs_root, task.id, name, value)
    try:
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            return None
        data = b""
        while len(data) < room * 4:  # a character is at most 4 bytes of UTF-8
            chunk = os.read(fd, room * 4 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    text = data.decode(errors="replace")
    return text[:room], len(text) > room or status.st_size > len(data)


def build(task: Task, inputs_root: Path | None = None) -> str:
    """The one user message a plain-LLM run sends for ``task``."""
    suffix = BOXED_SUFFIX if task.scorer in BOXED_SCORERS else ""
    if not task.input_files:
        return task.query + suffix
    room = DOCUMENT_CHARS
    parts = []
    for number, (name, value) in enumerate(task.input_files.items(), 1):
        read = _read(task, name, value, inputs_root, room)
        if read is None:
            text = "[a directory: its files are not in this prompt]"
        else:
            text, cut = read
            room -= len(text)
            if cut:
                text += f"\n[{name} is cut here: a prompt holds at most {DOCUMENT_CHARS} characters of documents]"
        parts.append(f"<document {number}: {name}>\n{text}\n</document {number}>")
    documents = "\n\n".join(parts)
    ask = "Answer the question below using the documents above."
    return f"Documents:\n\n{documents}\n\n{ask}\n\nQuestion:\n{task.query}{suffix}"
