"""`jailbox run` against servers that answer as real ones do (vLLM, SGLang, llama.cpp, Ollama, OpenAI, OpenRouter).

Each test is a whole run in a real jail (host rootfs) driven by a scripted server on 127.0.0.1 that is strict
about what comes back, as vLLM and OpenAI are: a turn that echoes a reply in a shape the API does not define is
refused with a 400. Each run must end ``submitted``, and a request sent again must say why on the status line.
"""

from __future__ import annotations

import email.utils
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, Step, error, reply

from jailbox.agent.llm import LLMClient, LLMConfig, Retry
from jailbox.agent.loop import NO_TOOL_CALL
from jailbox.agent.trajectory import load as load_trajectory

pytestmark = pytest.mark.once  # the reply shapes are the same whoever runs them (the jails' side: test_agent)

ROOT = Path(__file__).resolve().parent.parent
JAILBOX_RUN = [
    *JAILBOX,
    "run",
    "--query",
    "6*7?",
    "--network",
    "none",
]
WRITE = "echo 42 > /testbed/output/answer.txt"
USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def strict(messages: list[dict[str, Any]]) -> str | None:
    """What a strict server objects to in the conversation it is sent, or None."""
    open_ids: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            if open_ids:
                return f"tool calls {sorted(open_ids)} were not answered"
            if not isinstance(message.get("content"), str | None):
                return "assistant content must be a string"
            calls = message.get("tool_calls")
            if calls is not None and not calls:
                return "tool_calls must not be empty"
            for call in calls or []:
                if not isinstance(call.get("id"), str) or not call["id"]:
                    return "tool call without an id"
                if call.get("type") != "function":
                    return "tool call type must be 'function'"
                arguments = call.get("function", {}).get("arguments")
                if not isinstance(arguments, str):
                    return "function.arguments must be a string"
                json.loads(arguments)
                open_ids.add(call["id"])
        elif role == "tool":
            if message.get("tool_call_id") not in open_ids:
                return f"tool message answers unknown id {message.get('tool_call_id')!r}"
            open_ids.discard(message["tool_call_id"])
        elif open_ids and role == "user":
            return f"tool calls {sorted(open_ids)} were not answered"
    return None


class StrictServer(ScriptedServer):
    """Plays ``replies`` in order, answering a request the strict checks refuse with a 400 instead."""

    def __init__(self, replies: list[Any], refuse: Any = None) -> None:
        self.replies = list(replies)
        self.refuse = refuse  # a standing condition of the server: body -> Step to refuse with, or None
        self.refusals: list[str] = []
        super().__init__(responder=self._answer)

    def _answer(self, body: Any) -> Step:
        problem = strict(body["messages"])
        if problem is not None:
            self.refusals.append(problem)
            return error(400, problem)
        refused = None if self.refuse is None else self.refuse(body)
        if refused is not None:
            return refused
        if not self.replies:
            return Step(status=410, json={"error": "script exhausted"})
        step = self.replies[0]
        if isinstance(step, Until):
            answer = step.answer(body)
            if answer.status < 300:
                self.replies.pop(0)
            return answer
        self.replies.pop(0)
        return step(body) if callable(step) else step


class Until:
    """A scripted reply that answers every request until one succeeds (a server's standing condition)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer


def message(content: Any = None, *, calls: list[Any] | None = None, **fields: Any) -> Step:
    extra = {} if calls is None else {"tool_calls": calls}
    return reply(content, usage=USAGE, finish_reason="tool_calls" if calls else "stop", **extra, **fields)


def call(name: str, arguments: Any, call_id: str | None = "call_1") -> dict[str, Any]:
    raw: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        raw["id"] = call_id
    return raw


def jailbox_run(server: ScriptedServer, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    flags = ["--llm_name", "m", "--llm_base_url", server.url, "--api_key", "k", "--output_dir", str(out)]
    return subprocess.run(
        [*JAILBOX_RUN, *flags, *extra], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )


def the_run(out: Path) -> Path:
    """The one run directory ``jailbox run`` made beneath ``out`` (``OUTPUT_DIR/YYYYMMDD_HHMMSS``)."""
    [run] = out.iterdir()
    return run


def submitted(r: subprocess.CompletedProcess[str], out: Path) -> None:
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("submitted: answer='42'"), r.stdout
    assert (the_run(out) / "files" / "answer.txt").read_text() == "42\n"


def status_lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("[LLM request failed")]


def test_content_as_a_list_of_parts_is_one_string(tmp_path):
    """OpenRouter and Mistral-style servers send content as parts; echoed as parts, a strict server refused."""
    parts = [{"type": "text", "text": "I will write "}, {"type": "text", "text": "the answer."}]
    thinking = [{"type": "thinking", "thinking": "6*7=42"}, {"type": "output_text", "text": "Done."}]
    with StrictServer(
        [
            message(parts, calls=[call("execute_bash", json.dumps({"command": WRITE}))]),
            message(thinking, calls=[call("submit", "{}", "call_2")]),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
        sent = [m for m in server.requests[-1].json["messages"] if m["role"] == "assistant"]
    submitted(r, tmp_path / "o")
    assert server.refusals == []
    assert sent[0]["content"] == "I will write the answer."
    saved = json.loads((the_run(tmp_path / "o") / "trajectory.json").read_text())
    assert saved["steps"][1]["thought"] == "Done." and saved["steps"][1]["reasoning"] == "6*7=42"


def test_tool_calls_without_ids_and_with_object_arguments_come_back_well_formed(tmp_path):
    """Ollama returns arguments as an object, and some servers no id (or an empty one): each call gets an id
    that its answer carries, and arguments go back as a JSON string."""
    with StrictServer(
        [
            message(None, calls=[call("execute_bash", {"command": WRITE}, call_id=None)]),
            message(None, calls=[call("execute_bash", {"command": "cat /testbed/output/answer.txt"}, call_id="")]),
            message(
                None,
                calls=[call("execute_bash", {"command": "true"}, call_id=None), call("submit", {}, call_id=None)],
            ),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
        last = server.requests[-1].json["messages"]
    submitted(r, tmp_path / "o")
    assert server.refusals == [] and len(server.requests) == 3
    ids = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert len(set(ids)) == 2 and ids == answered


@pytest.mark.slow
def test_openrouter_errors_carried_in_http_200_are_retried(tmp_path):
    """OpenRouter relays a provider's failure as HTTP 200 with an error body, or as a choice that ended in
    error; both are retried like the status they stand for, and the status line says so."""
    upstream = Step(json={"error": {"code": 502, "message": "Provider returned error", "metadata": {}}})
    in_choice = Step(
        json={
            "id": "gen-1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": "error",
                    "error": {"code": 429, "message": "Rate limit exceeded upstream"},
                }
            ],
        }
    )
    with StrictServer(
        [
            upstream,
            message(None, calls=[call("execute_bash", json.dumps({"command": WRITE}))]),
            in_choice,
            message(None, calls=[call("submit", "{}", "call_2")]),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
    submitted(r, tmp_path / "o")
    lines = status_lines(r)
    assert any("retry 1/6" in line and "carrying error 502: Provider returned error" in line for line in lines), (
        r.stdout
    )
    assert any("carrying error 429: Rate limit exceeded upstream" in line for line in lines), r.stdout


LLAMA_CPP_OLDER = "the request exceeds the available context size, try increasing it"  # no numbers in it


def context_limited(kind: str, window: int, then: Step) -> Until:
    """A server with a ``window``-token context that refuses a prompt plus ``max_tokens`` above it, in the words
    of SGLang, llama.cpp or an older llama.cpp (prompt tokens taken as a quarter of the characters)."""

    def answer(body: dict[str, Any]) -> Step:
        prompt = len(json.dumps(body["messages"])) // 4
        wanted = body["max_tokens"]
        if prompt + wanted <= window:
            return then
        if kind == "sglang":
            text = (
                f"Requested token count exceeds the model's maximum context length of {window} tokens. You requested "
                f"a total of {prompt + wanted} tokens: {prompt} tokens from the input messages and {wanted} tokens "
                "for the completion. Please reduce the number of tokens in the input messages or the completion to "
                "fit within the limit."
            )
            return Step(
                status=400,
                json={"object": "error", "message": text, "type": "BadRequestError", "param": None, "code": 400},
            )
        total = prompt + wanted
        text = f"request ({total} tokens) exceeds the available context size ({window} tokens), try increasing it"
        text = LLAMA_CPP_OLDER if kind == "llama.cpp, older" else text
        return Step(
            status=400,
            json={
                "error": {
                    "code": 400,
                    "message": text,
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": prompt,
                    "n_ctx": window,
                }
            },
        )

    return Until(answer)


def test_sglang_and_llama_cpp_context_messages_shrink_max_tokens(tmp_path):
    """The reference's default of 65536 completion tokens does not fit a 32768-token context: SGLang's and
    llama.cpp's refusals say how much room is left, and the call is sent again asking for that much."""
    with StrictServer(
        [
            context_limited(
                "sglang", 32768, message(None, calls=[call("execute_bash", json.dumps({"command": WRITE}))])
            ),
            context_limited("sglang", 32768, message(None, calls=[call("execute_bash", '{"command": "true"}', "c2")])),
            context_limited("llama.cpp", 32768, message(None, calls=[call("submit", "{}", "call_3")])),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
    submitted(r, tmp_path / "o")
    asked = [request.json["max_tokens"] for request in server.requests]
    assert asked[0] == 65536 and all(0 < tokens < 32768 for tokens in asked[1::2]) and len(asked) == 6, asked
    shrinks = [line for line in status_lines(r) if "context length exceeded: max_tokens 65536 ->" in line]
    assert len(shrinks) == 3, r.stdout


def test_llama_cpp_context_error_whose_words_give_no_numbers(tmp_path):
    """Older llama.cpp says only "the request exceeds the available context size, try increasing it": the room
    left is n_ctx less n_prompt_tokens, the fields beside the message, and the call is sent again asking for it."""
    with StrictServer(
        [
            context_limited(
                "llama.cpp, older", 32768, message(None, calls=[call("execute_bash", json.dumps({"command": WRITE}))])
            ),
            context_limited("llama.cpp, older", 32768, message(None, calls=[call("submit", "{}", "call_2")])),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
    submitted(r, tmp_path / "o")
    asked = [request.json["max_tokens"] for request in server.requests]
    prompts = [len(json.dumps(request.json["messages"])) // 4 for request in server.requests]
    assert asked == [65536, 32768 - prompts[0] - 16, 65536, 32768 - prompts[2] - 16], asked
    shrinks = [line for line in status_lines(r) if "context length exceeded: max_tokens 65536 ->" in line]
    assert len(shrinks) == 2, r.stderr


@pytest.mark.slow
def test_retry_after_as_an_http_date_is_waited(tmp_path):
    """A 429 or 503 whose Retry-After is an HTTP date (what proxies in front of OpenAI-compatible servers send)
    is waited out as the date says, and the status line says the server asked for the wait."""

    def later(seconds: float) -> dict[str, str]:
        return {"Retry-After": email.utils.formatdate(time.time() + seconds, usegmt=True)}

    def limited(body: dict[str, Any]) -> Step:
        return error(429, "Rate limit reached for requests", headers=later(2))

    def unavailable(body: dict[str, Any]) -> Step:
        return error(503, "Service Unavailable", headers=later(1))

    with StrictServer(
        [
            limited,
            message(None, calls=[call("execute_bash", json.dumps({"command": WRITE}))]),
            unavailable,
            message(None, calls=[call("submit", "{}", "call_2")]),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
    submitted(r, tmp_path / "o")
    assert len(server.requests) == 4
    waits = [line for line in status_lines(r) if "(Retry-After)" in line]
    assert len(waits) == 2 and "HTTP 429" in waits[0] and "HTTP 503" in waits[1], r.stdout
    first = float(waits[0].split(" in ")[1].split("s")[0])
    assert 0.0 <= first <= 2.0


def test_retry_after_date_is_the_wait():
    """The client's own wait, without a run: a date ahead is waited until, a date past is not waited."""
    ahead = email.utils.formatdate(time.time() + 5, usegmt=True)
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    sleeps: list[float] = []
    causes: list[Retry] = []
    with ScriptedServer(
        [error(429, "slow", headers={"Retry-After": ahead}), error(429, "slow", headers={"Retry-After": past}), reply()]
    ) as server:
        config = LLMConfig(model="m", base_url=server.url, api_key="k", backoff_base=100, backoff_max=60)
        with LLMClient(config, sleep=sleeps.append, on_retry=causes.append) as client:
            client.complete([{"role": "user", "content": "hi"}])
    assert 3.0 <= sleeps[0] <= 5.0 and sleeps[1] == 0.0
    assert all(retry.hinted and "HTTP 429" in retry.cause for retry in causes)


def test_tool_calls_left_as_text_are_taken_as_calls(tmp_path):
    """vLLM or SGLang without the model's tool parser return the calls as text with ``tool_calls: []``: Hermes
    JSON in <tool_call> tags, and Qwen3-Coder's XML form; both become calls and go back as calls."""
    hermes = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "' + WRITE + '"}}\n</tool_call>'
    qwen = (
        "Checking.\n<tool_call>\n<function=execute_bash>\n<parameter=command>\ncat /testbed/output/answer.txt\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    with StrictServer(
        [
            message(hermes, calls=[]),
            message(qwen, calls=[]),
            message('<tool_call>{"name": "submit", "arguments": {}}</tool_call>'),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
        second = server.requests[2].json["messages"]
    submitted(r, tmp_path / "o")
    assert server.refusals == []
    assistant = [m for m in second if m["role"] == "assistant"]
    assert assistant[0]["content"] is None and assistant[0]["tool_calls"][0]["function"]["name"] == "execute_bash"
    assert assistant[1]["content"] == "Checking."
    assert json.loads(assistant[1]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "cat /testbed/output/answer.txt"
    }
    tool = [m for m in second if m["role"] == "tool"]
    assert "42" in tool[1]["content"]


def test_calls_written_as_text_run_and_the_trajectory_says_so(tmp_path):
    """Issue 36: a server without its tool parser returns a call as text with ``tool_calls: []``, in Hermes tags
    or as a bare JSON object naming a tool (in a json fence or not, "parameters" for "arguments"). Each runs as
    a call, goes back to the server as one, and its step is marked in the trajectory; JSON naming no offered
    tool, or JSON among prose, stays a message and is answered with the nudge."""
    hermes = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'
    bare = '\n{"name": "execute_bash", "arguments": {"command": "' + WRITE + '"}}\n'
    unknown = '{"name": "python", "arguments": {"code": "print(6*7)"}}'
    prose = 'I would call {"name": "execute_bash", "arguments": {"command": "ls"}} but let me think first.'
    fenced = '```json\n{"name": "submit", "parameters": {}}\n```'
    with StrictServer(
        [
            message(hermes, calls=[]),
            message(bare, calls=[]),
            message(unknown, calls=[]),
            message(prose),
            message(None, calls=[call("execute_bash", json.dumps({"command": "cat /testbed/output/answer.txt"}))]),
            message(fenced, calls=[]),
        ]
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
        last = server.requests[-1].json["messages"]
    submitted(r, tmp_path / "o")
    assert server.refusals == [] and len(server.requests) == 6
    steps = load_trajectory(the_run(tmp_path / "o") / "trajectory.json").steps
    assert [step.calls_from_text for step in steps] == [True, True, False, False, False, True]
    assert [[(a.function, a.parameters) for a in step.actions] for step in steps] == [
        [("execute_bash", {"command": "ls"})],
        [("execute_bash", {"command": WRITE})],
        [],
        [],
        [("execute_bash", {"command": "cat /testbed/output/answer.txt"})],
        [("submit", {})],
    ]
    assert (steps[2].thought, steps[3].thought) == (unknown, prose)
    assert steps[2].note == steps[3].note == NO_TOOL_CALL
    assistant = [m for m in last if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == [None, None, unknown, prose, None]
    assert [len(m.get("tool_calls", [])) for m in assistant] == [1, 1, 0, 0, 1]
    assert json.loads(assistant[1]["tool_calls"][0]["function"]["arguments"]) == {"command": WRITE}


def openai_refusal(message: str, code: str) -> Step:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": "max_tokens", "code": code}}
    return Step(status=400, json=body)


def small_output(body: dict[str, Any]) -> Step | None:
    """gpt-4o's words for a max_tokens above its 16384-token output."""
    wanted = body.get("max_tokens", 0)
    if wanted <= 16384:
        return None
    return openai_refusal(
        f"max_tokens is too large: {wanted}. This model supports at most 16384 completion tokens, whereas you "
        f"provided {wanted}.",
        "invalid_value",
    )


def reasoning_model(body: dict[str, Any]) -> Step | None:
    """o-series and gpt-5 words for max_tokens, which they do not take."""
    if "max_tokens" not in body:
        return None
    return openai_refusal(
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        "unsupported_parameter",
    )


@pytest.mark.parametrize(
    ("refuse", "key", "limit"), [(small_output, "max_tokens", 16384), (reasoning_model, "max_completion_tokens", 65536)]
)
def test_openai_refusals_of_the_output_limit_are_learned_once(tmp_path, refuse, key, limit):
    """The reference's 65536-token default meets OpenAI's per-model output caps and its reasoning models'
    max_completion_tokens: the first call is sent again as the refusal asks, and later calls ask so at once."""
    with StrictServer(
        [
            message(None, calls=[call("execute_bash", json.dumps({"command": WRITE}))]),
            message(None, calls=[call("submit", "{}", "call_2")]),
        ],
        refuse=refuse,
    ) as server:
        r = jailbox_run(server, tmp_path / "o")
        asked = [request.json.get(key) for request in server.requests]
    submitted(r, tmp_path / "o")
    assert len(asked) == 3 and asked[1:] == [limit, limit], asked
    assert [line for line in status_lines(r) if "refused the output limit" in line], r.stdout
