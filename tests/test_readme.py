"""Every code block of README.md and of each page in docs/ runs as written, in a fresh directory: shell
blocks with bash (the installed ``jailbox`` first on PATH, an empty rootfs store, no config file, the
servers' default ports held by another program), Python blocks with this
interpreter, YAML blocks load as rootfs recipes. ``text`` blocks are synopses, not commands.

A block is skipped only when the line before it is a marker comment,
``<!-- readme-test: needs an LLM endpoint -->`` or ``<!-- readme-test: needs a registry (...) -->``:
the reason is shown, and no other reason is accepted, so a failing block cannot be marked away. A block
using what a machine may lack (``--network full``'s slirp4netns, curl) goes through ``conftest.need``."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import need

from jailbox.sandbox.rootfs.build import load_recipe

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- readme-test: (.*?) -->\n$")
REASONS = ("needs an LLM endpoint", "needs a registry")
RUN = ("sh", "python", "yaml")
SHOWN = ("text",)
HANG_GUARD = 300
HELD_PORTS = (49982, 8000)  # jailbox serve's and jailbox mcp --http's defaults: no block may need them free
PREREQUISITES = {  # what a block's text uses -> what conftest.need checks (skip naming the fix; strict: fail)
    'mode="full"': ("slirp4netns", "tun"),
    "--network full": ("slirp4netns", "tun"),
    "curl ": ("curl",),
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    skip: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}:{self.language}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for match in FENCE.finditer(text):
            before = text[: match.start()]
            marker = MARKER.search(before)
            skip = marker.group(1) if marker else None
            found.append(Block(name, before.count("\n") + 1, match.group(1), match.group(2), skip))
    return found


def test_every_block_has_a_known_language_and_every_skip_a_known_reason() -> None:
    found = blocks()
    assert len(found) >= 10
    for block in found:
        assert block.language in RUN + SHOWN, f"{block}: a block says what it is: {RUN + SHOWN}"
        if block.skip is not None:
            assert block.skip.startswith(REASONS), f"{block}: skipped for {block.skip!r}; allowed: {REASONS}"
    assert sum(b.skip is None and b.language in RUN for b in found) >= 6  # most of the README does run


@pytest.mark.parametrize("block", [b for b in blocks() if b.language in RUN], ids=str)
def test_a_readme_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"{block} {block.skip}")
    for used, things in PREREQUISITES.items():
        if used in block.code:
            for thing in things:
                need(thing)
    if block.language == "yaml":
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(block.code)
        load_recipe(recipe)
        return
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "JAILBOX_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    argv = (
        ["bash", "-e", "-o", "pipefail", "-c", block.code]
        if block.language == "sh"
        else [sys.executable, "-c", block.code]
    )
    with contextlib.ExitStack() as stack:
        for port in HELD_PORTS:  # as a user's other server would; a port already taken is just as good
            held = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):
                held.bind(("127.0.0.1", port))
                held.listen()
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    assert r.returncode == 0, f"{block} failed:\n{block.code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
