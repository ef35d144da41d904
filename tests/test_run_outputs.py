"""`jailbox run`'s setup and outputs as the reference does them: inputs copied in writable (bounded, no link
followed out of the input directory), a fresh timestamped directory per run, the reference's trajectory format
beside jailbox's record, and the paper's defaults (environment, network); real jails, a scripted server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, Step, reply

from jailbox.agent import inputs
from jailbox.agent.environment import Environment
from jailbox.agent.run import FILES, REFERENCE_TRAJECTORY, TRAJECTORY
from jailbox.agent.tasks import Task
from jailbox.agent.trajectory import load as load_trajectory
from jailbox.cli import default_rootfs
from jailbox.sandbox import Sandbox, SandboxConfig

ROOT = Path(__file__).resolve().parent.parent
JAILBOX_RUN = [*JAILBOX, "run"]
RUN_NAME = re.compile(r"^\d{8}_\d{6}(_\d+)?$")


def obeying(request: dict) -> Step:
    """A model that runs the shell command its task states (``RUN: <command>``), then submits."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        call = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    else:
        command = re.search(r"RUN: (.*?)\n</task>", messages[1]["content"], re.S).group(1)
        arguments = json.dumps({"command": command})
        call = {"id": "c", "type": "function", "function": {"name": "execute_bash", "arguments": arguments}}
    return reply("I run it.", tool_calls=[call], finish_reason="tool_calls", usage={"total_tokens": 3})


@pytest.fixture
def server():
    with ScriptedServer(responder=obeying) as scripted:
        yield scripted


def jailbox_run(server: ScriptedServer, out: Path, command: str, *options: str) -> subprocess.CompletedProcess:
    flags = ["--query", f"RUN: {command}", "--llm_name", "m", "--llm_base_url", server.url, "--api_key", "k"]
    return subprocess.run(
        [*JAILBOX_RUN, *flags, "--output_dir", str(out), "--json", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_dir(result: subprocess.CompletedProcess) -> Path:
    assert result.returncode == 0, result.stderr
    return Path(json.loads(result.stdout)["output_dir"])


def observation(directory: Path) -> str:
    return load_trajectory(directory / TRAJECTORY).steps[0].observations[0]


# --- input files: copied in, writable, the host's copy untouched, no link followed out ------------------


def test_input_files_are_copied_in_writable_and_the_hosts_stay_as_they_were(tmp_path, server):
    given = tmp_path / "in"
    (given / "sub").mkdir(parents=True)
    (given / "a.txt").write_text("hello\n")
    (given / "sub" / "b.txt").write_text("deep\n")
    command = (
        "echo more >> /testbed/input/a.txt && echo new > /testbed/input/sub/c.txt && rm /testbed/input/sub/b.txt"
        " && cat /testbed/input/a.txt > /testbed/output/answer.txt"
    )
    directory = run_dir(jailbox_run(server, tmp_path / "out", command, "--input_dir", str(given), "--network", "none"))
    assert (directory / FILES / "answer.txt").read_text() == "hello\nmore\n"
    assert (given / "a.txt").read_text() == "hello\n" and (given / "sub" / "b.txt").read_text() == "deep\n"
    assert sorted(p.name for p in given.rglob("*")) == ["a.txt", "b.txt", "sub"]


def test_links_in_the_input_directory_arrive_as_links_never_read_through(tmp_path, server):
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text("host-secret\n")
    (outside / "dir" / "deeper").write_text("host-secret-too\n")
    given = tmp_path / "in"
    (given / "sub").mkdir(parents=True)
    (given / "file-link").symlink_to(outside / "secret")
    (given / "dir-link").symlink_to(outside / "dir")
    (given / "sub" / "up").symlink_to("../../outside/secret")
    command = (
        "cd /testbed/input && readlink file-link dir-link sub/up; cat file-link dir-link/deeper sub/up 2>&1;"
        " ls -R 2>&1; true"
    )
    directory = run_dir(jailbox_run(server, tmp_path / "out", command, "--input_dir", str(given), "--network", "none"))
    seen = observation(directory)
    assert str(outside / "secret") in seen and "../../outside/secret" in seen  # the links themselves
    assert "host-secret" not in seen.replace(str(outside / "secret"), "")


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_an_input_directory_holding_a_special_file_is_refused_before_the_run(tmp_path, server, kind):
    given = tmp_path / "in"
    (given / "sub").mkdir(parents=True)
    (given / "ok.txt").write_text("ok\n")
    special = given / "sub" / "special"
    out = tmp_path / "out"
    with socket.socket(socket.AF_UNIX) as sock:
        if kind == "fifo":
            os.mkfifo(special)
        else:
            sock.bind(str(special))
        options = ("--input_dir", str(given), "--network", "none")
        result = jailbox_run(server, out, "echo 1 > /testbed/output/answer.txt", *options)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--input-dir" in lines[-1] and "sub/special" in lines[-1], result.stderr
    assert not server.requests and list(out.iterdir()) == []  # nothing asked of the model, no run directory left


def test_the_input_copy_is_bounded_by_bytes_and_refused_before_anything_is_copied(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    (big / "one").write_bytes(b"x" * 5000)
    many = tmp_path / "many"
    (many / "a" / "b").mkdir(parents=True)
    for n in range(6):
        (many / "a" / "b" / f"f{n}").write_bytes(b"y" * 900)
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    with open(sparse / "hole", "wb") as f:
        f.truncate(1 << 40)  # a terabyte that costs no disk on the host: what it would be in the jail is bounded
    with Sandbox(SandboxConfig()) as sb:
        for src in (big, many, sparse):
            with pytest.raises(inputs.InputDirError, match="holds more than 4096 bytes"):
                inputs.copy_dir(sb, src, f"/testbed/{src.name}", limit=4096)
            assert sb.exec(["test", "-e", f"/testbed/{src.name}"]).exit_code == 1
        inputs.copy_dir(sb, big, "/testbed/big", limit=5000)
        assert sb.exec(["stat", "-c", "%s", "/testbed/big/one"]).stdout.strip() == "5000"


# --- a directory of its own for each run, the reference's layout ------------------------------------------


@pytest.mark.slow
def test_each_run_gets_a_fresh_timestamped_directory_and_a_stale_answer_is_never_this_runs(tmp_path, server):
    out = tmp_path / "out"
    first = run_dir(jailbox_run(server, out, "echo 41 > /testbed/output/answer.txt", "--network", "none"))
    second = run_dir(jailbox_run(server, out, "echo no answer", "--network", "none"))
    assert first != second and first.parent == second.parent == out.resolve()
    assert RUN_NAME.match(first.name) and RUN_NAME.match(second.name)
    assert (first / FILES / "answer.txt").read_text() == "41\n"
    assert not (second / FILES / "answer.txt").exists()
    assert load_trajectory(second / TRAJECTORY).answer is None
    for directory in (first, second):
        assert {p.name for p in directory.iterdir()} == {TRAJECTORY, REFERENCE_TRAJECTORY, FILES}


def test_a_link_planted_where_the_next_run_directory_goes_is_never_written_through(tmp_path, server):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    now = time.time()
    for ahead in range(-1, 30):  # every name a run started in the next half minute could take, and a suffix
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now + ahead))
        (out / stamp).symlink_to(outside)
        (out / f"{stamp}_2").symlink_to(outside / "missing")
    directory = run_dir(jailbox_run(server, out, "echo 7 > /testbed/output/answer.txt", "--network", "none"))
    assert not directory.is_symlink() and directory.is_dir() and directory.name.endswith("_3")
    assert (directory / FILES / "answer.txt").read_text() == "7\n"
    assert list(outside.iterdir()) == []


# --- the reference's trajectory format beside jailbox's record --------------------------------------------


def shape(value: object) -> object:
    """Keys and types, the values left out."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


@pytest.mark.needs("shared-data")
def test_the_reference_trajectory_has_the_published_ones_keys_and_types(tmp_path, server):
    published = [json.loads(p.read_text()) for p in sorted((SHARED_DATA / "reference-trajectories").glob("*.json"))]
    assert published
    top = {shape({k: v for k, v in t.items() if k != "steps"}).__repr__() for t in published}
    steps = {repr(shape({k: v for k, v in s.items() if k != "action"})) for t in published for s in t["steps"]}
    actions = {tuple(s["action"]) for t in published for s in t["steps"]}
    directory = run_dir(
        jailbox_run(server, tmp_path / "out", "echo 3 > /testbed/output/answer.txt", "--network", "none")
    )
    ours = json.loads((directory / REFERENCE_TRAJECTORY).read_text())
    assert repr(shape({k: v for k, v in ours.items() if k != "steps"})) in top
    assert len(ours["steps"]) == 2 and ours["metadata"]["total_steps"] == 2
    for step in ours["steps"]:
        assert repr(shape({k: v for k, v in step.items() if k != "action"})) in steps
        assert tuple(step["action"]) in actions and isinstance(step["action"]["parameters"], dict)
    first = ours["steps"][0]
    assert first["thought"] == "I run it." and first["action"]["function"] == "execute_bash"
    assert first["observation"] == observation(directory)
    assert [s["metadata"]["step"] for s in ours["steps"]] == [1, 2]
    again = load_trajectory(directory / REFERENCE_TRAJECTORY)  # jailbox's own tools read it back
    assert [a.function for s in again.steps for a in s.actions] == ["execute_bash", "submit"]


def test_a_reply_with_several_calls_or_none_maps_to_the_references_one_action_steps(tmp_path):
    bash = {"id": "a", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "echo 1"}'}}
    bash2 = {"id": "b", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "echo 2"}'}}
    submit = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    script = [reply("two at once", tool_calls=[bash, bash2]), reply("no call"), reply("", tool_calls=[submit])]
    with ScriptedServer(script) as scripted:
        result = jailbox_run(scripted, tmp_path / "out", "x", "--network", "none")
    ours = json.loads((run_dir(result) / REFERENCE_TRAJECTORY).read_text())
    assert [(s["action"]["function"], s["thought"], s["metadata"]["step"]) for s in ours["steps"]] == [
        ("execute_bash", "two at once", 1),
        ("execute_bash", "", 1),
        ("", "no call", 2),
        ("submit", "", 3),
    ]
    assert "1" in ours["steps"][0]["observation"] and "2" in ours["steps"][1]["observation"]
    assert ours["steps"][2]["observation"] and ours["steps"][2]["action"]["parameters"] == {}


# --- the paper's defaults ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.needs("slirp4netns", "tun")
def test_run_defaults_to_the_papers_environment_and_network_and_none_locks_down(tmp_path, server):
    default = run_dir(jailbox_run(server, tmp_path / "a", "echo 1 > /testbed/output/answer.txt"))
    sandbox = load_trajectory(default / TRAJECTORY).config["sandbox"]
    assert sandbox["rootfs"] == default_rootfs() and sandbox["network"]["mode"] == "full"
    locked = run_dir(jailbox_run(server, tmp_path / "b", "echo 1 > /testbed/output/answer.txt", "--network", "none"))
    assert load_trajectory(locked / TRAJECTORY).config["sandbox"]["network"]["mode"] == "none"
    for command in ("run", "bench", "replay"):
        shown = subprocess.run([*JAILBOX, command, "--help"], capture_output=True, text=True, timeout=60).stdout
        flat = " ".join(shown.split())
        assert "[default: full]" in flat and "never the host or its LAN" in flat, command
        assert "the paper's environment" in flat, command


# --- the RL environment offers what `jailbox run` offers -----------------------------------------------------


def test_the_environments_submit_schema_follows_the_tasks_prompt_config(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text("system_prompt: s\ninstance_prompt: '{problem_statement}'\noutput_dir: /testbed\n")
    other = tmp_path / "elsewhere.yaml"
    other.write_text("system_prompt: s\ninstance_prompt: '{problem_statement}'\noutput_dir: /work/out\n")

    def submit_text(env: Environment) -> str:
        return next(s["function"]["description"] for s in env.tools_schema if s["function"]["name"] == "submit")

    with Environment() as env:
        assert "/testbed/output/answer.txt" in submit_text(env)
        for path, answer in ((config, "/testbed/answer.txt"), (other, "/work/out/answer.txt")):
            env.reset(Task(id="t", query="q", answer="1", scorer="exact", prompt_config=str(path)))
            assert answer in submit_text(env) and "/testbed/output/answer.txt" not in submit_text(env)
            env.step("execute_bash", {"command": f"echo 1 > {answer}"})
            assert env.step("submit", {}).reward == 1.0


def test_a_reply_holding_lone_surrogates_is_recorded_in_both_formats_not_fatal(tmp_path):
    """JSON may escape a lone surrogate (``"\\ud800"``), which no UTF-8 encoder takes: in the text and in the
    reasoning of the reply that submits, the run still ends submitted, and both records read back as sent."""
    submit = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    message = {"role": "assistant", "content": "bad \ud800 text", "reasoning_content": "odd \udfff"}
    message["tool_calls"] = [submit]
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}).encode()
    with ScriptedServer([Step(raw=body)]) as scripted:
        result = jailbox_run(scripted, tmp_path / "out", "x", "--network", "none")
    directory = run_dir(result)
    assert json.loads(result.stdout)["exit_status"] == "submitted"
    saved = load_trajectory(directory / TRAJECTORY)
    assert (saved.steps[0].thought, saved.steps[0].reasoning) == ("bad \ud800 text", "odd \udfff")
    ours = json.loads((directory / REFERENCE_TRAJECTORY).read_text())
    assert (ours["steps"][0]["thought"], ours["steps"][0]["reasoning_content"]) == ("bad \ud800 text", "odd \udfff")
