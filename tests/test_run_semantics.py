"""Run semantics as the reference has them, and its command lines, against a scripted server and real jails.

The token limit is the size of the current conversation, counted before each call; the reference's sampling
defaults go in every request; a reply without a tool call is nudged until ``max_steps``; ``submit`` names the
prompt config's answer file; the reference README's command lines run unchanged but for the program's name.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, reply
from support.oci_images import Layout, LocalRegistry

from jailbox.agent.llm import LLMConfig, route_model
from jailbox.agent.loop import NO_TOOL_CALL, AgentConfig, conversation_tokens
from jailbox.agent.prompts import PromptConfig, load
from jailbox.agent.run import run_task

ROOT = Path(__file__).resolve().parent.parent
WRITE = "echo 42 > /testbed/output/answer.txt"


def call(name: str, arguments: dict, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def calls(*pairs: tuple[str, dict], usage: dict | None = None):
    listed = [call(name, arguments, f"call_{i}") for i, (name, arguments) in enumerate(pairs)]
    return reply(None, tool_calls=listed, finish_reason="tool_calls", usage=usage)


def used(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def run(server: ScriptedServer, out: Path, prompts: PromptConfig | None = None, **agent):
    llm = LLMConfig(model="scripted", base_url=server.url, api_key="k", backoff_base=0.01)
    return run_task("What is 6*7?", llm, out, prompts=prompts, agent=AgentConfig(**agent))


# --- the token limit ---------------------------------------------------------------------------


def test_token_limit_is_the_conversation_not_the_sum_of_calls(tmp_path):
    """Six calls of 350 tokens each spend 2100, over a limit of 1000, but the conversation never holds 1000:
    the run goes on to submit (the sum ended it after the third call)."""
    with ScriptedServer() as server:
        server.add(
            *[calls(("execute_bash", {"command": "true"}), usage=used(300, 50)) for _ in range(4)],
            calls(("execute_bash", {"command": WRITE}), usage=used(320, 30)),
            calls(("submit", {}), usage=used(330, 20)),
        )
        traj = run(server, tmp_path / "o", max_token_limit=1000)
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    assert len(server.requests) == 6 and traj.prompt_tokens + traj.completion_tokens == 2100


def test_token_limit_stops_before_a_call_the_conversation_outgrew(tmp_path):
    """The server counted 1010 tokens in its reply to the first call: with a limit of 1000 no second request
    goes out, whatever the usage summed to (once as the server counts, once estimated without usage)."""
    with ScriptedServer() as server:
        server.add(calls(("execute_bash", {"command": "true"}), usage=used(980, 30)))
        traj = run(server, tmp_path / "a", max_token_limit=1000)
        assert traj.exit_status == "token_limit" and len(server.requests) == 1
        assert "over max_token_limit 1000" in (traj.error or "")

    big = "head -c 6000 /dev/zero | tr '\\0' x"  # each observation adds about 1500 tokens
    with ScriptedServer() as server:
        server.add(*[calls(("execute_bash", {"command": big})) for _ in range(6)])
        traj = run(server, tmp_path / "b", max_token_limit=5000)
        sent = [request.json["messages"] for request in server.requests]
    assert traj.exit_status == "token_limit" and 2 <= len(sent) < 6
    assert all(conversation_tokens(messages) <= 5000 for messages in sent)
    assert conversation_tokens(traj.messages) > 5000


# --- sampling defaults, nudges -----------------------------------------------------------------


def test_reference_sampling_defaults_in_every_request(tmp_path):
    script = [calls(("execute_bash", {"command": WRITE})), calls(("submit", {}))]
    with ScriptedServer(script) as server:
        r = subprocess.run(
            [*JAILBOX, "run", "--network", "none", "--query", "6*7?", "--llm_name", "m", "--llm_base_url", server.url],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        bodies = [request.json for request in server.requests]
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(b["temperature"], b["max_tokens"]) for b in bodies] == [(1.0, 65536)] * 2
    with ScriptedServer(script) as server:
        flags = ["--temperature", "0.2", "--max_tokens_per_call", "4096", "--llm_base_url", server.url]
        r = subprocess.run(
            [*JAILBOX, "run", "--network", "none", "--query", "6*7?", "--llm_name", "m", *flags],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        bodies = [request.json for request in server.requests]
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(b["temperature"], b["max_tokens"]) for b in bodies] == [(0.2, 4096)] * 2


def test_replies_without_a_tool_call_are_nudged_until_max_steps(tmp_path):
    """Five replies in a row without a call each get the nudge, and the run goes on to submit; with nothing but
    such replies it ends at max_steps; the cap on them stays an option."""
    chat = [reply(f"thinking aloud {i}") for i in range(5)]
    with ScriptedServer([*chat, calls(("execute_bash", {"command": WRITE})), calls(("submit", {}))]) as server:
        traj = run(server, tmp_path / "a")
        nudges = [request.json["messages"][-1] for request in server.requests[1:6]]
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    assert all(m["role"] == "user" and m["content"].startswith(NO_TOOL_CALL) for m in nudges)
    assert nudges[0]["content"] == NO_TOOL_CALL + "\nSteps Remaining: 99"  # the reference's suffix, one newline
    with ScriptedServer([reply("no") for _ in range(4)]) as server:
        assert run(server, tmp_path / "b", max_steps=4).exit_status == "max_steps"
    with ScriptedServer([reply("no") for _ in range(2)]) as server:
        assert run(server, tmp_path / "c", max_format_errors=2).exit_status == "format_errors"


# --- submit names the config's answer file -----------------------------------------------------


def submit_description(request) -> str:
    return next(t["function"]["description"] for t in request.json["tools"] if t["function"]["name"] == "submit")


def test_submit_names_the_answer_file_of_the_prompt_config(tmp_path):
    """A config whose output directory is /testbed (as the reference's benchmark configs have it) is told to
    write /testbed/answer.txt, and the answer written there is the one taken."""
    config = tmp_path / "flat.yaml"
    config.write_text(
        "system_prompt: Solve it and write the answer to {output_dir}/answer.txt.\n"
        "instance_prompt: '{problem_statement}'\n"
        'output_dir: "/testbed"\nworking_dir: "/testbed"\n'
    )
    script = [calls(("execute_bash", {"command": "echo 42 > /testbed/answer.txt"})), calls(("submit", {}))]
    with ScriptedServer(script) as server:
        traj = run(server, tmp_path / "o", prompts=load(config))
        described = submit_description(server.requests[0])
    assert (traj.exit_status, traj.answer) == ("submitted", "42")
    assert "/testbed/answer.txt" in described and "/testbed/output" not in described
    assert "/testbed/output/answer.txt" in submit_description_of(PromptConfig())


def submit_description_of(prompts: PromptConfig) -> str:
    return next(t["function"]["description"] for t in prompts.tool_schemas() if t["function"]["name"] == "submit")


@pytest.mark.needs("shared-data")
def test_submit_follows_the_reference_prompt_configs(tmp_path):
    configs = sorted((SHARED_DATA / "reference-examples").glob("**/*.yaml"))
    assert configs, f"no prompt configs under {SHARED_DATA / 'reference-examples'}"
    for path in configs:
        prompts = load(path)
        answer = f"{prompts.output_dir}/answer.txt"
        described = submit_description_of(prompts)
        assert answer in described, path
        assert "/testbed/output/answer.txt" not in described or prompts.output_dir == "/testbed/output", path
    math = load(SHARED_DATA / "reference-examples" / "config" / "benchmark_math.yaml")
    script = [calls(("execute_bash", {"command": f"echo 42 > {math.output_dir}/answer.txt"})), calls(("submit", {}))]
    with ScriptedServer(script) as server:
        traj = run(server, tmp_path / "o", prompts=math)
    assert (traj.exit_status, traj.answer) == ("submitted", "42")


# --- the reference's command lines ---------------------------------------------------------------

README_LINES = [
    # llm-in-sandbox/llm-in-sandbox README.md at 1c9f7a9, "Quick Start": each as written there
    'llm-in-sandbox run --query "write a hello world in python" --llm_name "openai/gpt-5" '
    '--llm_base_url "http://your-api-server/v1" --api_key "your-api-key"',
    'llm-in-sandbox run --query "write a hello world in python" --llm_name qwen3_coder '
    '--llm_base_url "http://localhost:8000/v1"  --temperature 0.7',
    'llm-in-sandbox run --query "write a hello world in python" --llm_name DeepSeek-V3.2 '
    '--llm_base_url "http://0.0.0.0:5678/v1" --extra_body \'{"chat_template_kwargs": {"thinking": True}}\'',
]
HELLO = [
    calls(("str_replace_editor", {"command": "create", "path": "/testbed/output/hello.py", "file_text": "print(1)"})),
    calls(("submit", {})),
]


@pytest.mark.needs("slirp4netns", "tun")  # unchanged, so run's default network: full
@pytest.mark.parametrize("line", README_LINES, ids=["api", "vllm", "sglang"])
def test_reference_readme_command_lines_run_unchanged(tmp_path, line):
    argv = shlex.split(line)
    url = argv[argv.index("--llm_base_url") + 1]
    with ScriptedServer(HELLO) as server:
        argv = [server.url if arg == url else arg for arg in argv[1:]]
        r = subprocess.run(
            [*JAILBOX, *argv, "--copy_out", "hello.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        first = server.requests[0]
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("submitted:")
    [run] = (tmp_path / "output").iterdir()  # the reference's layout: output/YYYYMMDD_HHMMSS/files
    assert (run / "files" / "hello.py").read_text() == "print(1)\n"  # create adds the newline, as the reference's
    model = argv[argv.index("--llm_name") + 1]
    assert first.json["model"] == model.removeprefix("openai/")
    if "--api_key" in argv:
        assert first.headers["authorization"] == "Bearer your-api-key"
    if "--temperature" in argv:
        assert first.json["temperature"] == 0.7
    if "--extra_body" in argv:
        assert first.json["chat_template_kwargs"] == {"thinking": True}


def test_reference_settings_file_fills_what_the_command_line_leaves_out(tmp_path):
    with ScriptedServer(HELLO) as server:
        settings = tmp_path / "llm-in-sandbox.yaml"
        settings.write_text(f"llm_name: hosted_vllm/from-settings\nllm_base_url: {server.url}\napi_key: s3cret\n")
        argv = ["run", "--network", "none", "--query", "q", "--settings", str(settings), "--save_litellm_response"]
        r = subprocess.run([*JAILBOX, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        first = server.requests[0]
    assert r.returncode == 0, r.stdout + r.stderr
    assert first.json["model"] == "from-settings" and first.headers["authorization"] == "Bearer s3cret"
    assert "--save_litellm_response" in r.stderr


@pytest.mark.slow
def test_run_and_bench_route_a_provider_prefix_alike(tmp_path):
    """A litellm provider prefix is dropped, and names the endpoint when no --llm_base_url does, for
    ``bench`` as for ``run`` (bench used to send "hosted_vllm/m" to the server as it was)."""
    assert route_model("openrouter/meta-llama/llama-3-8b") == ("meta-llama/llama-3-8b", "https://openrouter.ai/api/v1")
    assert route_model("openai/Qwen/Qwen3-8B") == ("Qwen/Qwen3-8B", None)
    assert route_model("Qwen/Qwen3-8B") == ("Qwen/Qwen3-8B", None)  # not a provider: sent whole
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "query": "q", "answer": "a"}) + "\n")
    for command in ("run", "bench"):
        with ScriptedServer(HELLO) as server:
            argv = ["--llm_name", "hosted_vllm/m", "--llm_base_url", server.url, "--network", "none"]
            where = ["--query", "q"] if command == "run" else [str(tasks), "--output_dir", str(tmp_path / "bench")]
            r = subprocess.run(
                [*JAILBOX, command, *where, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
            )
            first = server.requests[0]
        assert r.returncode == 0, (command, r.stdout + r.stderr)
        assert first.json["model"] == "m", command


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--extra_body", "[1, 2]"], "--extra-body"),
        (["--extra_body", "{'a': nope}"], "--extra-body"),
        (["--docker_image", "Not A Ref!"], "--docker_image"),
        (["--docker_image", "alpine", "--rootfs", "host"], "--docker_image"),
    ],
)
def test_bad_reference_flags_are_refused_in_one_line(tmp_path, flags, named):
    r = subprocess.run(
        [*JAILBOX, "run", "--query", "q", "--llm_name", "m", "--llm_base_url", "http://127.0.0.1:9/v1", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    [message] = [line for line in r.stderr.splitlines() if line.startswith(("Error:", "jailbox: "))]
    assert named in message and "e.g." in message


@pytest.mark.slow
@pytest.mark.needs("docker-registry", "skopeo")
def test_docker_image_is_pulled_once_and_run_in(tmp_path, mini_rootfs):
    """--docker_image REF pulls REF into the store and runs the task in it; a second run takes the stored copy
    without the registry (as Docker runs a local image)."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    (tmp_path / "mark").write_text("from the image\n")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tf:
        tf.add(mini_rootfs, arcname=".", filter=as_root)
        tf.add(tmp_path / "mark", arcname="etc/image-mark", filter=as_root)
    (tmp_path / "registry").mkdir()
    registry = LocalRegistry(tmp_path / "registry")
    try:
        layout = Layout(tmp_path / "layout")
        layout.tag("v1", layout.image([layer.getvalue()], {"Env": ["PATH=/bin"]}))
        registry.push(layout.path, "v1", "test/agent")
        ref = f"{registry.host}/test/agent:v1"
        env = {**os.environ, "JAILBOX_CACHE_DIR": str(tmp_path / "cache")}
        script = [
            calls(("execute_bash", {"command": "cat /etc/image-mark > /testbed/output/answer.txt"})),
            calls(("submit", {})),
        ]
        with ScriptedServer(script) as server:
            argv = [
                "run",
                "--network",
                "none",
                "--query",
                "q",
                "--llm_name",
                "m",
                "--llm_base_url",
                server.url,
                "--docker_image",
                ref,
            ]
            r = subprocess.run([*JAILBOX, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "answer='from the image'" in r.stdout.strip().splitlines()[-1]
    finally:
        registry.close()
    with ScriptedServer(script) as server:
        argv = [
            "run",
            "--network",
            "none",
            "--query",
            "q",
            "--llm_name",
            "m",
            "--llm_base_url",
            server.url,
            "--docker_image",
            ref,
        ]
        r = subprocess.run([*JAILBOX, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "answer='from the image'" in r.stdout.strip().splitlines()[-1]
