"""Every code block of README.md and of each page in docs/ runs as written, in a fresh directory: shell
blocks with bash (the installed ``jailbox`` first on PATH, an empty rootfs store, no config file, the
servers' default ports held by another program), Python blocks with this
interpreter, YAML blocks load as rootfs recipes. ``text`` blocks are synopses, not commands.

What a comment states a line prints (``# 42``, ``# 403``) is compared with what the block printed
(``STATED``); a comment that opens with a value must be listed there, so a new one is compared too.

A block is skipped only when the line before it is a marker comment,
``<!-- readme-test: needs an LLM endpoint -->`` or ``<!-- readme-test: needs a registry (...) -->``:
no other reason is accepted, so a failing block cannot be marked away. A registry block runs where
the registry answers (``conftest.need("registry")``: skipped naming the fix elsewhere, also under
``JAILBOX_TEST_STRICT=1``, since no install step gives CI the Internet). A block that needs an LLM
endpoint runs against a scripted one on the port it names (``tests/support/llm_server.py``). The two install
blocks are what ``.ci/run`` runs (checked here letter for letter), and a registry block holds
commands as they run, not placeholders. A block using what a machine may lack (``--network full``'s
slirp4netns, curl) goes through ``conftest.need``."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import need, require
from support.llm_server import ScriptedServer, reply
from support.service_probe import own_service

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
CI_SCRIPT = ROOT / ".ci" / "run"
CI_COMMANDS = ("README_MAIN_COMMAND", "README_TEST_COMMAND")  # .ci/run's copies of the install blocks
# a placeholder a reader fills in: an upper-case word as an argument, ``[--option]``, ``a | b`` choices
PLACEHOLDER = re.compile(r"(?<=\s)[A-Z][A-Z_]*(?=\s|$)|\[--|\s\|\s(?!\w+=)")
# a fragment of a README line -> what the block must print for it (stdout and stderr): all of a tuple,
# or all of one tuple of a list where the README states outcomes per host
STATED: dict[str, tuple[str, ...] | list[tuple[str, ...]]] = {
    "-c 'print(6*7)'    # 42": ("\n42\n",),
    'nosuchcmd || echo "exit $?"': ("jailbox: exec nosuchcmd: command not found", "exit 127\n"),
    "r.timed_out)  # 0 '42\\n' '' False": ("0 '42\\n' '' False\n",),
    'cat data/notes.txt").stdout)  # hi, from the host': ("hi\nfrom the host\n",),
    'bytearray(256 << 20)\' || echo "exit $?"  # 137': [("exit 137\n",), ("MemoryError", "exit 1\n")],  # no cgroup
    'print(ran.structured_content["stdout"], end="")  # Linux': ("Linux\n",),
    'http://bad.example.com/").stdout)  # 403': ("403",),
    'CapEff /proc/self/status").stdout)  # CapEff: 0000000000000021': ("CapEff:\t0000000000000021\n",),
    """print(sb.run_code("df['y'].sum()").text)  # 14""": ("14\n",),
    "print(exc)  # sandbox ... is paused": ("is paused: call resume() first (CLI: jailbox resume ", "running again\n"),
}
# One worker runs every block (pytest-xdist): the blocks hold the servers' default ports and one of
# them serves an LLM endpoint on one, and a registry block uses the image the one before it pulled.
pytestmark = pytest.mark.xdist_group("readme")
RUN_SCRIPT = (  # the scripted LLM's turns for `jailbox run`: write an answer, then submit
    reply(None, tool_calls=[{"id": "c1", "type": "function", "function": {
        "name": "execute_bash", "arguments": '{"command": "echo 541 > /testbed/output/answer.txt"}'}}]),
    reply(None, tool_calls=[{"id": "c2", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]),
)  # fmt: skip
VALUE_COMMENT = re.compile(r"\s#\s+(\d|'|\"|Linux|CapEff)")  # a comment that opens with what a line prints
HELD_PORTS = (49982, 8000)  # jailbox serve's and jailbox mcp --http's defaults: no block may need them free
PREREQUISITES = {  # what a block's text uses -> what conftest.need checks (skip naming the fix; strict: fail)
    'mode="full"': ("slirp4netns", "tun"),
    "--network full": ("slirp4netns", "tun"),
    "curl ": ("curl",),
    "run_code(": ("kernel",),
    "npm install": ("node", "npm"),
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


def test_every_stated_output_is_compared() -> None:
    code = "\n".join(b.code for b in blocks() if b.language in RUN)
    for fragment in STATED:
        assert code.count(fragment) >= 1, f"STATED names {fragment!r}, which no runnable README block holds"
    for line in code.splitlines():
        if VALUE_COMMENT.search(line):
            assert any(f in line for f in STATED), f"README states an output that is not compared: {line.strip()}"


def test_the_install_blocks_are_what_ci_runs_and_registry_blocks_hold_no_placeholders() -> None:
    ci = CI_SCRIPT.read_text()
    commands = [re.search(rf'^{name}="(.*)"$', ci, re.MULTILINE) for name in CI_COMMANDS]
    assert all(commands), f"{CI_SCRIPT} no longer sets {CI_COMMANDS}"
    installs = [b for b in blocks() if "pip install" in b.code and b.skip is not None]
    assert [b.code.splitlines()[-1] for b in installs] == [m.group(1) for m in commands if m]
    for block in blocks():
        if block.skip is not None and block.skip.startswith("needs a registry"):
            for line in block.code.splitlines():
                command = re.split(r"\s#\s", line)[0]
                assert not PLACEHOLDER.search(command), f"{block}: a placeholder, not a command: {line.strip()}"


def _endpoint(port: int) -> ScriptedServer:
    """A scripted LLM endpoint on the port a block names. Another test's program may hold it for a
    moment (CI saw one once, with four workers): the port is tried for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return ScriptedServer(port=port)
        except OSError as exc:
            if time.monotonic() >= deadline:
                require(False, f"port {port} free for a scripted LLM endpoint ({exc})", "stop its server")
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def registry_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry-cache")


@pytest.mark.parametrize("block", [b for b in blocks() if b.language in RUN], ids=str)
@pytest.mark.slow
def test_a_readme_block_runs_as_written(block: Block, tmp_path: Path, registry_cache: Path) -> None:
    if block.skip is not None:
        if "pip install" in block.code:  # .ci/run runs it as written (the test above)
            return
        if block.skip.startswith("needs a registry"):
            need("registry")
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
        # the registry blocks share a store: the Python one uses the image the shell one pulled
        "JAILBOX_CACHE_DIR": str(registry_cache if block.skip else tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    argv = (
        ["bash", "-e", "-o", "pipefail", "-c", block.code]
        if block.language == "sh"
        else [sys.executable, "-c", block.code]
    )
    with contextlib.ExitStack() as stack:
        # a state directory (so a per-user service) of the block's own: the service a block starts
        # serves that block's store, and is stopped with it
        own = stack.enter_context(own_service())
        env.update({k: own[k] for k in ("JAILBOX_STATE_DIR", "JAILBOX_SERVICE_IDLE")})
        endpoint = re.search(r"http://localhost:(\d+)/v1", block.code)
        if block.skip == "needs an LLM endpoint":
            assert endpoint, f"{block}: needs an LLM endpoint but names no http://localhost:PORT/v1"
            llm = stack.enter_context(_endpoint(int(endpoint.group(1))))
            llm.add(*RUN_SCRIPT)
        for port in HELD_PORTS:
            if block.skip == "needs an LLM endpoint" and endpoint and port == int(endpoint.group(1)):
                continue  # as a user's other server would; a port already taken is just as good
            held = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):
                held.bind(("127.0.0.1", port))
                held.listen()
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    said = f"{block}:\n{block.code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    assert r.returncode == 0, f"failed: {said}"
    if block.skip == "needs an LLM endpoint":
        assert [p.read_text() for p in work.glob("out/*/files/answer.txt")] == ["541\n"], said
    for fragment, printed in STATED.items():
        if fragment in block.code:
            options = printed if isinstance(printed, list) else [printed]
            shown = "\n" + r.stdout + r.stderr
            assert any(all(t in shown for t in texts) for texts in options), f"README says {fragment!r}: {said}"
