"""The agent loop against a scripted OpenAI-compatible server on 127.0.0.1 and real jails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, error, reply
from support.waits import wait_until

from jailbox.agent.llm import LLMConfig
from jailbox.agent.loop import CUT_OFF, NO_TOOL_CALL, AgentConfig
from jailbox.agent.prompts import PromptConfig, load
from jailbox.agent.run import run_task
from jailbox.agent.trajectory import load as load_trajectory

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"


def call(name: str, arguments: dict | str, call_id: str = "call_1") -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def tool_reply(*calls: dict, **fields):
    return reply(
        None,
        tool_calls=list(calls),
        finish_reason="tool_calls",
        usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        **fields,
    )


SOLVE = [
    tool_reply(
        call("str_replace_editor", {"command": "create", "path": "/testbed/solve.py", "file_text": "print(6 * 7)\n"})
    ),
    tool_reply(call("execute_bash", {"command": "python3 /testbed/solve.py > /testbed/output/answer.txt"})),
    tool_reply(call("submit", {})),
]


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


def run(server: ScriptedServer, tmp_path: Path, **agent):
    llm = LLMConfig(model="scripted", base_url=server.url, api_key="k", backoff_base=0.01)
    return run_task("What is 6*7?", llm, tmp_path / "out", agent=AgentConfig(**agent))


JAILBOX_RUN = [
    *JAILBOX,
    "run",
    "--query",
    "6*7?",
    "--network",
    "none",
]


def cli_run(server: ScriptedServer, out: Path, *extra: str) -> list[str]:
    """``jailbox run`` as a user types it, with the reference's underscore flags."""
    flags = ["--llm_name", "m", "--llm_base_url", server.url, "--api_key", "k", "--output_dir", str(out)]
    return [*JAILBOX_RUN, *flags, *extra]


def tool_messages(request) -> list[dict]:
    return [m for m in request.json["messages"] if m["role"] == "tool"]


def test_full_run_submits_and_lays_out_the_output(server, tmp_path):
    server.add(*SOLVE)
    traj = run(server, tmp_path)
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    out = tmp_path / "out"
    assert (out / "answer.txt").read_text() == "42\n"
    saved = load_trajectory(out / "trajectory.json")
    assert saved.exit_status == "submitted" and len(saved.steps) == 3
    assert saved.steps[1].exec[0].exit_code == 0 and saved.prompt_tokens == 300
    first, second = server.requests[0].json, server.requests[1].json
    assert [t["function"]["name"] for t in first["tools"]] == ["str_replace_editor", "execute_bash", "submit"]
    assert "Steps Remaining: 100" in first["messages"][1]["content"]
    answered = tool_messages(server.requests[1])
    assert answered[0]["tool_call_id"] == "call_1" and "Steps Remaining: 99" in answered[0]["content"]
    assert second["messages"][:2] == first["messages"][:2]


def test_reasoning_content_goes_back_and_parallel_calls_are_all_answered(server, tmp_path):
    server.add(
        tool_reply(
            call("execute_bash", {"command": "echo a"}, "c1"),
            call("execute_bash", {"command": "echo b"}, "c2"),
            reasoning_content="thinking about it",
        ),
        tool_reply(call("submit", {})),
    )
    traj = run(server, tmp_path)
    assert traj.exit_status == "submitted"
    assistant = [m for m in server.requests[1].json["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "thinking about it"
    answers = {m["tool_call_id"]: m["content"] for m in tool_messages(server.requests[1])}
    assert set(answers) == {"c1", "c2"} and "a" in answers["c1"] and "b" in answers["c2"]
    assert traj.steps[0].reasoning == "thinking about it"


def test_malformed_calls_and_replies_without_calls_are_recovered(server, tmp_path):
    server.add(
        tool_reply(call("execute_bash", "{not json")),
        tool_reply(call("rm_rf", {"path": "/"})),
        reply("I think the answer is 42."),
        reply("Let me write a very long", finish_reason="length"),
        *SOLVE,
    )
    traj = run(server, tmp_path, max_format_errors=5)
    assert traj.exit_status == "submitted"
    msgs = [r.json["messages"][-1] for r in server.requests]
    assert msgs[1]["role"] == "tool" and "JSON" in msgs[1]["content"]
    assert msgs[2]["role"] == "tool" and "rm_rf" in msgs[2]["content"]
    assert msgs[3]["role"] == "user" and msgs[3]["content"].startswith(NO_TOOL_CALL)
    assert msgs[4]["role"] == "user" and msgs[4]["content"].startswith(CUT_OFF)


def test_format_error_cap_ends_the_run(server, tmp_path):
    server.add(reply("no tools"), reply("still none"), reply("nope"))
    traj = run(server, tmp_path, max_format_errors=3)
    assert traj.exit_status == "format_errors" and len(traj.steps) == 3


def test_step_token_and_llm_limits(server, tmp_path):
    server.add(
        tool_reply(call("execute_bash", {"command": "true"})), tool_reply(call("execute_bash", {"command": "true"}))
    )
    traj = run(server, tmp_path / "a", max_steps=2)
    assert traj.exit_status == "max_steps"
    last = tool_messages(server.requests[1])[-1]["content"]
    assert "Steps Remaining: 1. This is your last step" in last
    big = {"prompt_tokens": 5000, "completion_tokens": 20, "total_tokens": 5020}
    server.add(reply(None, tool_calls=[call("execute_bash", {"command": "true"})], usage=big))
    assert run(server, tmp_path / "b", max_token_limit=4000).exit_status == "token_limit"
    server.add(error(401, "bad key"))
    traj = run(server, tmp_path / "c")
    assert traj.exit_status == "llm_error" and "401" in traj.error


@pytest.mark.needs("shared-data")
def test_reference_prompt_configs_load_unchanged():
    configs = sorted((SHARED / "reference-examples").glob("**/*.yaml"))
    assert configs, f"the reference examples are missing from {SHARED} (../shared/data beside the checkout)"
    for path in configs:
        config = load(path)
        assert "{output_dir}" not in config.system() and "/testbed" in config.instance("x")
    assert PromptConfig().instance("What?").count("What?") == 1


def test_trajectory_is_valid_after_a_crash_between_steps(tmp_path):
    with ScriptedServer() as server:
        slow = tool_reply(call("submit", {}))
        server.add(SOLVE[0], SOLVE[1], type(slow)(**{**slow.__dict__, "delay": 30.0}))
        out = tmp_path / "out"
        proc = subprocess.Popen(cli_run(server, out, "--quiet"), cwd=ROOT)
        wait_until(lambda: len(server.requests) >= 3, "the third request", 60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    [run] = out.iterdir()  # OUTPUT_DIR/YYYYMMDD_HHMMSS
    saved = load_trajectory(run / "trajectory.json")
    assert len(saved.steps) == 2 and saved.exit_status is None
    assert saved.steps[1].actions[0].function == "execute_bash"


@pytest.mark.slow
def test_cli_run_with_reference_flags(tmp_path):
    with ScriptedServer(SOLVE) as server:
        r = subprocess.run(
            cli_run(server, tmp_path / "o", "--max_steps", "5", "--json"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["answer"] == "42"
    [run] = (tmp_path / "o").iterdir()
    assert (run / "files" / "answer.txt").exists() and (run / "trajectory.json").exists()


def test_text_mode_for_models_without_tool_calling(server, tmp_path):
    fence = "```"
    server.add(
        reply(
            f'I will compute it.\n{fence}execute_bash\n{{"command": "echo 42 > /testbed/output/answer.txt"}}\n{fence}'
        ),
        reply("Two actions:\n```submit\n{}\n```\n```submit\n{}\n```"),
        reply("Done.\n```submit\n{}\n```"),
    )
    traj = run(server, tmp_path, text_mode=True)
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    first = server.requests[0].json
    assert "tools" not in first and "```<tool_name>" in first["messages"][0]["content"]
    assert server.requests[1].json["messages"][-1]["content"].startswith("Observation:\nExit code: 0")
    assert "could not be read" in server.requests[2].json["messages"][-1]["content"]


def test_settings_file_status_line_and_recorded_config(tmp_path):
    config_home = tmp_path / "config"
    (config_home / "jailbox").mkdir(parents=True)
    with ScriptedServer(SOLVE) as server:
        (config_home / "jailbox" / "config.yaml").write_text(
            f"run:\n  llm_base_url: {server.url}\n  llm_name: from-settings\n  api_key: secret-key\n"
        )
        env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
        r = subprocess.run(
            [*JAILBOX_RUN, "--output_dir", str(tmp_path / "o")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert server.requests[0].json["model"] == "from-settings"
    assert r.returncode == 0, r.stderr
    assert "[step 3/100 | 360 tokens |" in r.stdout and "> execute_bash" in r.stdout
    [run] = (tmp_path / "o").iterdir()
    saved = load_trajectory(run / "trajectory.json")
    assert saved.config["llm"]["model"] == "from-settings" and "secret-key" not in (run / "trajectory.json").read_text()
    assert saved.config["agent"]["max_steps"] == 100 and saved.config["sandbox"]["rootfs"] == "host"


def test_time_limit_ends_the_run(server, tmp_path):
    slow = tool_reply(call("execute_bash", {"command": "sleep 1.5"}))
    server.add(slow, slow)
    traj = run(server, tmp_path, time_limit=1.0)
    assert traj.exit_status == "time_limit" and len(traj.steps) == 1


DEEP = "[" * 300 + "]" * 300  # parses, but the record cannot be written past about 250 levels


def test_arguments_too_deep_to_parse_or_record_are_a_malformed_call(server, tmp_path):
    """Issue 37: nesting past the parser's recursion raised RecursionError out of the run, and nesting the
    parser took but the record's serialiser refused ended it when the trajectory was saved. Both are calls the
    tool refuses, in words naming what is wrong, and the run goes on to submit."""
    server.add(
        tool_reply(call("execute_bash", "[" * 100_000, "c1"), call("execute_bash", '{"command": ' + DEEP + "}", "c2")),
        tool_reply(call("str_replace_editor", '{"command": "view", "path": "/testbed", "view_range": ' + DEEP + "}")),
        *SOLVE,
    )
    traj = run(server, tmp_path / "native")
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    first, second = traj.steps[0].observations, traj.steps[1].observations
    assert "The arguments of `execute_bash` nest deeper than 64 levels" in first[0]
    assert "Parameter `command` of `execute_bash` nests deeper than 64 levels" in first[1]
    assert "Parameter `view_range` of `str_replace_editor` nests deeper than 64 levels" in second[0]
    saved = load_trajectory(tmp_path / "native" / "out" / "trajectory.json")
    assert saved.steps[0].actions[0].parameters == {"_raw": "[" * 2000}
    assert saved.steps[1].actions[0].parameters["_raw"].startswith('{"command": "view"')
    fence = "```"
    server.add(reply(f'{fence}execute_bash\n{{"command": {DEEP}}}\n{fence}'), reply(f"{fence}submit\n{{}}\n{fence}"))
    traj = run(server, tmp_path / "text", text_mode=True)
    assert traj.exit_status == "submitted"
    assert "Parameter `command` of `execute_bash` nests deeper than 64 levels" in traj.steps[0].observations[0]
    recorded = load_trajectory(tmp_path / "text" / "out" / "trajectory.json").steps[0].actions[0].parameters
    assert recorded == {"_raw": "arguments that are not a JSON object of at most 64 levels"}
