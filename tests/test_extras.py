"""The core install (``pip install .``) runs ``jailbox exec`` and ``jailbox run``; each optional part
(``serve``, ``mcp``, the ``math`` scorer, the Ray executor) is an extra, and using the part without it is
one line naming the extra and the command that installs it: ``extras.py``'s table and message, checked
here against the package's metadata and in a venv of its own holding the core install only."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support.llm_server import ScriptedServer, reply
from support.wheels import build_wheel, new_venv, pip_install

from jailbox.extras import EXTRAS, missing

pytestmark = pytest.mark.once  # the extras' metadata and messages are the same whoever installs them

LINES = {
    "serve": "serve needs the 'serve' extra (protobuf): pip install 'jailbox[serve]'",
    "mcp": "mcp needs the 'mcp' extra (mcp): pip install 'jailbox[mcp]'",
    "math": "scorer 'math' needs the 'math' extra (sympy): pip install 'jailbox[math]'",
    "ray": "executor 'ray' needs the 'ray' extra (ray): pip install 'jailbox[ray]'",
    "secrets": "secrets needs the 'secrets' extra (cryptography): pip install 'jailbox[secrets]'",
    "openenv": "openenv needs the 'openenv' extra (websockets): pip install 'jailbox[openenv]'",
}
# Equal only symbolically (neither side is a plain number or fraction), so scoring them needs sympy.
ROOT_EIGHT, TWO_ROOT_TWO = r"\sqrt{8}", r"2\sqrt{2}"


# --- the table --------------------------------------------------------------------------------------


def _requirements() -> list[Requirement]:
    return [Requirement(text) for text in importlib.metadata.requires("jailbox") or []]


def _needed(extra: str) -> set[str]:
    """The distributions ``extra`` adds (jailbox's own extras named by it expanded), by pip's names."""
    names = set()
    for req in _requirements():
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        names |= set().union(*map(_needed, req.extras)) if req.name == "jailbox" else {req.name.lower()}
    return names


def test_each_extra_installs_its_distribution_the_core_none_and_test_all() -> None:
    core = {req.name.lower() for req in _requirements() if req.marker is None}
    assert core == {"httpx", "pydantic", "click", "psutil", "python-ptrace", "pyyaml"}
    for extra, distribution in EXTRAS.values():
        assert _needed(extra) == {distribution}, extra
    assert {distribution for _, distribution in EXTRAS.values()} <= _needed("test")


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("google", "serve"),  # no google package at all
        ("google.protobuf", "serve"),  # another google package, not protobuf
        ("google.protobuf.runtime_version", "serve"),  # a protobuf too old for the generated code
        ("mcp", "mcp"),
        ("mcp.server.mcpserver", "mcp"),  # mcp 1.x: the 2.x server API is missing
        ("sympy", "math"),
        ("ray", "ray"),
        ("cryptography", "secrets"),
        ("cryptography.x509", "secrets"),
        ("websockets", "openenv"),
        ("websockets.asyncio.server", "openenv"),  # websockets before 13: no asyncio implementation
    ],
)
def test_a_module_of_an_extra_names_the_extra(name: str, extra: str) -> None:
    exc = ModuleNotFoundError(f"No module named {name!r}", name=name)  # as the import system raises it
    part = {
        "serve": "serve",
        "mcp": "mcp",
        "math": "scorer 'math'",
        "ray": "executor 'ray'",
        "secrets": "secrets",
        "openenv": "openenv",
    }[extra]
    assert missing(part, exc) == LINES[extra]


@pytest.mark.parametrize("name", ["jailbox_no_such_module", "googleapiclient", "mcpx", "sympy_extras", "rayon"])
def test_any_other_failed_import_is_raised_again_as_it_was(name: str) -> None:
    with pytest.raises(ImportError) as failed:
        __import__(name)
    with pytest.raises(ImportError) as again:
        missing("serve", failed.value)
    assert again.value is failed.value


# --- the core install -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def core(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding ``pip install .``'s install (the core dependencies from the index): its bin/."""
    python = new_venv(tmp_path_factory.mktemp("core") / "venv")
    pip_install(python, str(wheel))
    return python.parent


def _run(argv: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    # a part whose extra is there would start serving: the timeout turns that into a failure, not a hang
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def _tasks(path: Path, **row: str) -> Path:
    path.write_text(json.dumps({"id": "t1", "query": "Simplify sqrt(8).", **row}) + "\n")
    return path


def _bench(bin_dir: Path, tasks: Path, url: str, out: Path, *options: str) -> list[str | Path]:
    return [bin_dir / "jailbox", "bench", tasks, "--llm-name", "m", "--llm-base-url", url, "--api-key", "k",
            "--output-dir", out, "--mode", "llm", "--network", "none", *options]  # fmt: skip


@pytest.mark.slow
@pytest.mark.network
def test_the_core_install_has_none_of_the_extras(core: Path) -> None:
    code = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps([d.metadata['Name'].lower() for d in m.distributions()]))\n"
        f"for name in {sorted(EXTRAS)!r}:\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    print('importable:', name)\n"
    )
    done = _run([core / "python", "-c", code], core)
    assert done.returncode == 0, done.stderr
    installed = set(json.loads(done.stdout.splitlines()[0]))
    assert installed.isdisjoint(distribution for _, distribution in EXTRAS.values()), installed
    assert done.stdout.splitlines()[1:] == []


@pytest.mark.slow
@pytest.mark.network
def test_exec_run_and_help_work_in_the_core_install(core: Path, tmp_path: Path) -> None:
    done = _run([core / "jailbox", "exec", "--", "python3", "-c", "print(6*7)"], tmp_path)
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr

    def call(name: str, arguments: dict[str, str], call_id: str) -> dict[str, object]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"id": call_id, "type": "function", "function": function}

    with ScriptedServer() as server:
        server.add(
            reply(None, tool_calls=[call("execute_bash", {"command": "echo 42 > /testbed/output/answer.txt"}, "c1")]),
            reply(None, tool_calls=[call("submit", {}, "c2")]),
        )
        out = tmp_path / "out"
        done = _run([core / "jailbox", "run", "--query", "6*7?", "--network", "none", "--llm-name", "m",
                     "--llm-base-url", server.url, "--api-key", "k", "--output-dir", out], tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [answer] = out.glob("*/files/answer.txt")  # the run's directory is named by when it started
    assert answer.read_text() == "42\n"

    done = _run([core / "jailbox", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    commands = done.stdout.partition("\nCommands:\n")[2]
    assert {"exec", "run", "bench", "serve", "mcp"} <= {line.split()[0] for line in commands.splitlines()}


@pytest.mark.slow
@pytest.mark.network
def test_each_part_without_its_extra_is_one_line_and_nothing_runs(core: Path, tmp_path: Path) -> None:
    math_tasks = _tasks(tmp_path / "math.jsonl", answer=TWO_ROOT_TWO, scorer="math")
    exact_tasks = _tasks(tmp_path / "exact.jsonl", answer="x", scorer="exact")
    with ScriptedServer() as server:
        commands = {
            "serve": [core / "jailbox", "serve"],
            "mcp": [core / "jailbox", "mcp"],
            "openenv": [core / "jailbox", "openenv"],
            "math": _bench(core, math_tasks, server.url, tmp_path / "out-math"),
            "ray": _bench(core, exact_tasks, server.url, tmp_path / "out-ray", "--executor", "ray"),
        }
        for extra, argv in commands.items():
            done = _run(argv, tmp_path)
            line = LINES[extra].replace("scorer", "task 't1': scorer")
            assert (done.returncode, done.stdout, done.stderr) == (2, "", f"jailbox: {line}\n"), extra
        assert server.requests == []
    assert not (tmp_path / "out-math").exists() and not (tmp_path / "out-ray").exists()

    # from Python: the scorer when a comparison needs sympy, the executor when it is looked up
    code = (
        "from jailbox.agent.batch import find_executor\n"
        "from jailbox.agent.executors import ExecutorError\n"
        "from jailbox.agent.scoring import ScoringError, score\n"
        "print(score('4', '4', 'math'))\n"  # the same text: no sympy needed
        "for attempt in (lambda: score(r'\\sqrt{8}', r'2\\sqrt{2}', 'math'), lambda: find_executor('ray')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except (ScoringError, ExecutorError) as exc:\n"
        "        print(exc)\n"
    )
    done = _run([core / "python", "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1.0", LINES["math"], LINES["ray"]]


@pytest.fixture
def core_and_math(wheel: Path, tmp_path: Path) -> Path:
    """A core install to which the math line's own command was then applied: its bin/."""
    python = new_venv(tmp_path / "venv")
    pip_install(python, str(wheel))
    command = LINES["math"].rpartition(": ")[2].split()
    assert command == ["pip", "install", "'jailbox[math]'"]
    pip_install(python, command[2].strip("'"))  # as the shell passes it, through this pip (the venv has none)
    return python.parent


@pytest.mark.slow
@pytest.mark.network
def test_the_command_the_line_gives_installs_the_extra(core_and_math: Path, tmp_path: Path) -> None:
    tasks = _tasks(tmp_path / "math.jsonl", answer=TWO_ROOT_TWO, scorer="math")
    with ScriptedServer() as server:
        server.add(reply(f"\\boxed{{{ROOT_EIGHT}}}"))
        done = _run(_bench(core_and_math, tasks, server.url, tmp_path / "out"), tmp_path)
    assert done.returncode == 0, done.stderr
    [result] = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert (result["id"], result["score"], result["error"]) == ("t1", 1.0, None)
