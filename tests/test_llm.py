"""The chat client against a real HTTP server on 127.0.0.1 that plays scripted replies (no mocked transport)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import ValidationError
from support.llm_server import DROP, ScriptedServer, Step, error, reply

from jailbox.agent.llm import (
    AsyncLLMClient,
    Completion,
    ContextLengthError,
    LLMClient,
    LLMConfig,
    LLMConnectionError,
    LLMHTTPError,
    LLMResponseError,
    normalise_message,
    parse_text_action,
)

pytestmark = pytest.mark.once  # the client's HTTP handling is the same whoever runs it

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "6*7?"}]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
VLLM_CONTEXT = (
    "This model's maximum context length is 8192 tokens. However, you requested 10000 tokens "
    "(5904 in the messages, 4096 in the completion). Please reduce the length of the messages or completion."
)


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
def sleeps() -> list[float]:
    return []


def client_for(server: ScriptedServer, sleeps: list[float], **config) -> LLMClient:
    """A client whose sleeps are recorded, not waited."""
    settings = {"model": "test-model", "base_url": server.url, "api_key": "sk-test", **config}
    return LLMClient(LLMConfig(**settings), sleep=sleeps.append)


def test_completion_sends_the_request_and_keeps_the_whole_message(server, sleeps):
    server.add(
        reply(
            "42",
            reasoning_content="6*7 is 42",
            provider_field={"kept": True},
            usage={"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
        )
    )
    with client_for(server, sleeps, temperature=0.5, max_tokens=256) as client:
        done = client.complete(MESSAGES, tools=TOOLS)
    assert isinstance(done, Completion)
    assert done.message == {
        "role": "assistant",
        "content": "42",
        "reasoning_content": "6*7 is 42",
        "provider_field": {"kept": True},
    }
    assert done.finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (11, 3, 14)
    assert done.max_tokens_used == 256
    assert done.attempts == 1
    assert done.latency >= 0
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.json == {
        "model": "test-model",
        "messages": MESSAGES,
        "tools": TOOLS,
        "temperature": 0.5,
        "max_tokens": 256,
    }
    assert sleeps == []


def test_trailing_slash_in_base_url_and_no_key_means_no_authorization(server, sleeps):
    server.add(reply())
    with client_for(server, sleeps, base_url=server.url + "/", api_key="") as client:
        client.complete(MESSAGES)
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert "authorization" not in request.headers
    assert {key: request.json[key] for key in set(request.json) - {"messages"}} == {
        "model": "test-model",
        "temperature": 1.0,
        "max_tokens": 65536,
    }


def test_429_waits_what_retry_after_says(server, sleeps):
    server.add(error(429, "slow down", headers={"Retry-After": "7"}), reply("after wait"))
    with client_for(server, sleeps) as client:
        done = client.complete(MESSAGES)
    assert done.message["content"] == "after wait"
    assert done.attempts == 2
    assert sleeps == [7.0]
    assert len(server.requests) == 2


def test_retry_after_is_capped_by_backoff_max(server, sleeps):
    server.add(error(429, "slow down", headers={"Retry-After": "3600"}), reply())
    with client_for(server, sleeps, backoff_max=5) as client:
        client.complete(MESSAGES)
    assert sleeps == [5.0]


def test_500_then_success(server, sleeps):
    server.add(Step(status=500, raw=b"<html>upstream crashed</html>"), reply("fine"))
    with client_for(server, sleeps, backoff_base=0.5) as client:
        done = client.complete(MESSAGES)
    assert done.message["content"] == "fine"
    assert done.attempts == 2
    [waited] = sleeps
    assert 0 <= waited <= 0.5


def test_dropped_connection_then_success(server, sleeps):
    server.add(DROP, reply("reconnected"))
    with client_for(server, sleeps) as client:
        done = client.complete(MESSAGES)
    assert done.message["content"] == "reconnected"
    assert done.attempts == 2
    assert len(server.requests) == 2
    assert len(sleeps) == 1


def test_read_timeout_then_success(server, sleeps):
    server.add(Step(json={}, delay=30), reply("on time"))
    with client_for(server, sleeps, timeout=0.2) as client:
        done = client.complete(MESSAGES)
    assert done.message["content"] == "on time"
    assert done.attempts == 2
    assert len(sleeps) == 1


def test_transport_failures_exhaust_retries_with_growing_backoff(server, sleeps):
    server.add(DROP, DROP, DROP, DROP)
    with client_for(server, sleeps, max_retries=3, backoff_base=1.0, backoff_max=3.0) as client:
        with pytest.raises(LLMConnectionError, match="RemoteProtocolError") as caught:
            client.complete(MESSAGES)
    assert "attempt 4" in str(caught.value)
    assert len(server.requests) == 4
    assert len(sleeps) == 3
    assert all(0 <= waited <= cap for waited, cap in zip(sleeps, [1.0, 2.0, 3.0], strict=True))


def test_5xx_exhausts_retries_into_an_http_error(server, sleeps):
    server.add(*[error(503, "overloaded")] * 3)
    with client_for(server, sleeps, max_retries=2) as client:
        with pytest.raises(LLMHTTPError) as caught:
            client.complete(MESSAGES)
    assert caught.value.status == 503
    assert "overloaded" in caught.value.body
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_raise_after_one_request(server, sleeps, status):
    server.add(error(status, "no"), reply("never sent"))
    with client_for(server, sleeps) as client:
        with pytest.raises(LLMHTTPError) as caught:
            client.complete(MESSAGES)
    assert caught.value.status == status
    assert not isinstance(caught.value, ContextLengthError)
    assert f"HTTP {status}" in str(caught.value)
    assert len(server.requests) == 1
    assert sleeps == []


@pytest.mark.parametrize(
    ("message", "room"),
    [
        (VLLM_CONTEXT, 8192 - 5904 - 16),
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum context length is "
            "8192 tokens and your request has 6000 input tokens (4096 > 8192 - 6000).",
            8192 - 6000 - 16,
        ),
        (
            "This model's maximum context length is 8192 tokens. However, you requested 8200 tokens "
            "(8190 in the messages, 10 in the completion).",
            1,
        ),
    ],
)
def test_context_length_error_shrinks_max_tokens_for_that_call(server, sleeps, message, room):
    server.add(error(400, message), reply("short"), reply("next call"))
    with client_for(server, sleeps, max_tokens=4096) as client:
        done = client.complete(MESSAGES)
        client.complete(MESSAGES)
    assert done.max_tokens_used == room
    assert done.attempts == 2
    assert [r.json["max_tokens"] for r in server.requests] == [4096, room, 4096]
    assert sleeps == []


def test_context_length_error_that_cannot_be_fixed(server, sleeps):
    openai_style = {
        "error": {
            "message": "Your messages resulted in 9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    server.add(Step(status=400, json=openai_style))
    with client_for(server, sleeps, max_tokens=100) as client:
        with pytest.raises(ContextLengthError) as caught:
            client.complete(MESSAGES)
    assert caught.value.status == 400
    assert len(server.requests) == 1


def test_context_length_error_nested_too_deep_to_read(server, sleeps):
    """llama.cpp's fields are read from the body; a body nested deeper than the parser recurses has none."""
    body = '{"error": {"type": "exceed_context_size_error", "n_ctx": 8192, "x": ' + "[" * 100_000
    server.add(Step(status=400, raw=body.encode()), reply("never sent"))
    with client_for(server, sleeps, max_tokens=100) as client:
        with pytest.raises(ContextLengthError):
            client.complete(MESSAGES)
    assert len(server.requests) == 1


def test_context_length_error_twice_gives_up(server, sleeps):
    server.add(error(400, VLLM_CONTEXT), error(400, VLLM_CONTEXT), reply("never sent"))
    with client_for(server, sleeps, max_tokens=4096) as client:
        with pytest.raises(ContextLengthError, match="maximum context length"):
            client.complete(MESSAGES)
    assert len(server.requests) == 2


def test_reasoning_goes_back_to_the_server_unless_stripped(server, sleeps):
    server.add(reply("first", reasoning_content="thinking", reasoning="also thinking"), reply("second"))
    with client_for(server, sleeps) as client:
        first = client.complete(MESSAGES)
        client.complete([*MESSAGES, first.message, {"role": "user", "content": "and 7*8?"}])
    sent = server.requests[1].json["messages"][2]
    assert sent["reasoning_content"] == "thinking"
    assert sent["reasoning"] == "also thinking"

    server.add(reply("third"))
    user_with_field = {"role": "user", "content": "hi", "reasoning": "not an assistant turn"}
    with client_for(server, sleeps, strip_reasoning=True) as client:
        client.complete([*MESSAGES, first.message, user_with_field])
    stripped = server.requests[2].json["messages"]
    assert stripped[2] == {"role": "assistant", "content": "first"}
    assert stripped[3] == user_with_field
    assert "reasoning_content" in first.message


def test_usage_accumulates_across_calls(server, sleeps):
    server.add(
        reply(usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
        reply(usage={"prompt_tokens": 20, "completion_tokens": None, "total_tokens": 20}),
        reply(),
    )
    with client_for(server, sleeps) as client:
        client.complete(MESSAGES)
        client.complete(MESSAGES)
        last = client.complete(MESSAGES)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (0, 0, 0)
    totals = client.usage
    assert (totals.prompt_tokens, totals.completion_tokens, totals.total_tokens, totals.calls) == (30, 5, 35, 3)


def test_extra_body_and_headers_reach_the_server(server, sleeps):
    server.add(reply())
    extra = {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    with client_for(server, sleeps, extra_body=extra, headers={"X-Trace": "abc"}) as client:
        client.complete(MESSAGES)
    [request] = server.requests
    assert request.json["top_k"] == 20
    assert request.json["chat_template_kwargs"] == {"enable_thinking": False}
    assert request.headers["x-trace"] == "abc"


@pytest.mark.parametrize(
    ("step", "what"),
    [
        (Step(raw=b"this is not json"), "not JSON"),
        (Step(raw=b"[" * 100_000), "not JSON"),  # deeper than the parser recurses: RecursionError, not ValueError
        (reply("x", extra=json.loads("[" * 300 + "]" * 300)), "nests deeper than 64 levels"),  # kept, unrecordable
        (Step(json={"object": "chat.completion"}), "no 'choices'"),
        (Step(json={"choices": []}), "no choices"),
        (Step(json={"choices": [{"index": 0, "finish_reason": "stop"}]}), "no 'message'"),
    ],
)
def test_malformed_success_bodies_raise_without_retry(server, sleeps, step, what):
    server.add(step, reply("never sent"))
    with client_for(server, sleeps) as client:
        with pytest.raises(LLMResponseError, match=what) as caught:
            client.complete(MESSAGES)
    assert caught.value.status == 200
    assert "HTTP 200" in str(caught.value)
    assert caught.value.body[:10] in str(caught.value)
    assert len(server.requests) == 1


def test_error_message_quotes_at_most_500_characters_of_the_body(server, sleeps):
    server.add(Step(raw=b"x" * 2000))
    with client_for(server, sleeps) as client:
        with pytest.raises(LLMResponseError) as caught:
            client.complete(MESSAGES)
    assert "x" * 500 in str(caught.value)
    assert "x" * 501 not in str(caught.value)
    assert len(caught.value.body) == 2000


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("LLM_BASE_URL", raising=False)
    with pytest.raises(ValidationError, match=r"OPENAI_BASE_URL.*LLM_BASE_URL"):
        LLMConfig(model="m")
    monkeypatch.setenv("LLM_BASE_URL", "http://llm.local/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    config = LLMConfig(model="m")
    assert config.base_url == "http://llm.local/v1"
    assert config.api_key.get_secret_value() == "sk-env"
    assert "sk-env" not in repr(config)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://openai.local/v1")
    assert LLMConfig(model="m").base_url == "http://openai.local/v1"


def test_config_defaults_and_timeouts():
    config = LLMConfig(model="m", base_url="http://x/v1", api_key="")
    assert (config.timeout.connect, config.timeout.read) == (10.0, 600.0)
    assert (config.max_retries, config.backoff_base, config.backoff_max) == (6, 1.0, 60.0)
    assert config.strip_reasoning is False
    assert LLMConfig(model="m", base_url="http://x/v1", timeout=30).timeout.read == 30.0
    with pytest.raises(ValidationError):
        LLMConfig(model="m", base_url="http://x/v1", max_token=5)


def async_client_for(server: ScriptedServer, sleeps: list[float], **config) -> AsyncLLMClient:
    async def record(seconds: float) -> None:
        sleeps.append(seconds)

    settings = {"model": "test-model", "base_url": server.url, "api_key": "sk-test", **config}
    return AsyncLLMClient(LLMConfig(**settings), sleep=record)


def test_async_completion(server, sleeps):
    server.add(reply("42", reasoning_content="r", usage={"prompt_tokens": 4, "completion_tokens": 2}))

    async def main() -> Completion:
        async with async_client_for(server, sleeps, max_tokens=64) as client:
            done = await client.complete(MESSAGES, tools=TOOLS)
            assert client.usage.calls == 1
            return done

    done = asyncio.run(main())
    assert done.message == {"role": "assistant", "content": "42", "reasoning_content": "r"}
    assert done.usage.prompt_tokens == 4
    [request] = server.requests
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.json["tools"] == TOOLS
    assert request.json["max_tokens"] == 64


def test_async_retries(server, sleeps):
    server.add(error(429, "slow down", headers={"Retry-After": "2"}), DROP, Step(status=502, raw=b""), reply("ok"))

    async def main() -> Completion:
        async with async_client_for(server, sleeps, backoff_base=0.25) as client:
            return await client.complete(MESSAGES)

    done = asyncio.run(main())
    assert done.attempts == 4
    assert sleeps[0] == 2.0
    assert 0 <= sleeps[1] <= 0.5
    assert 0 <= sleeps[2] <= 1.0


def test_async_401_raises_after_one_request(server, sleeps):
    server.add(error(401, "bad key"), reply("never sent"))

    async def main() -> None:
        async with async_client_for(server, sleeps) as client:
            await client.complete(MESSAGES)

    with pytest.raises(LLMHTTPError) as caught:
        asyncio.run(main())
    assert caught.value.status == 401
    assert len(server.requests) == 1
    assert sleeps == []


def test_async_context_length_shrinks(server, sleeps):
    server.add(error(400, VLLM_CONTEXT), reply())

    async def main() -> Completion:
        async with async_client_for(server, sleeps, max_tokens=4096) as client:
            return await client.complete(MESSAGES)

    assert asyncio.run(main()).max_tokens_used == 8192 - 5904 - 16


TOOL_NAMES = {"bash", "submit"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('Let me look.\n```bash\n{"command": "ls -la"}\n```\n', ("bash", {"command": "ls -la"})),
        ("Done.\n```submit\n```", ("submit", {})),
        ('```json\n{"name": "bash", "arguments": {"command": "pwd"}}\n```', ("bash", {"command": "pwd"})),
        ('```json\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}\n```', ("bash", {"command": "pwd"})),
        ('Example:\n```python\nprint(1)\n```\nthen\n  ```bash\n  {"command": "x"}\n  ```', ("bash", {"command": "x"})),
        ('Data:\n```json\n{"answer": 42}\n```', None),
        ("```\nplain block\n```", None),
        ("The answer is 42.", None),
    ],
)
def test_parse_text_action(content, expected):
    assert parse_text_action(content, TOOL_NAMES) == expected


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ('```bash\n{"command": "ls"}\n```\n```submit\n{}\n```', "found 2 actions"),
        ("```bash\nls -la\n```", "invalid JSON"),
        ('```bash\n["ls"]\n```', "JSON object"),
        ('```json\n{"name": "bash", "arguments": {"command": }\n```', "invalid JSON"),
        ('```json\n{"name": "python", "arguments": {}}\n```', "unknown tool 'python'"),
        ('```json\n{"name": "bash", "arguments": [1]}\n```', "must be a JSON object"),
        ("```json\n" + "[" * 100_000 + "\n```", "invalid JSON"),
        ("```bash\n" + "[" * 100_000 + "\n```", "invalid JSON"),
    ],
)
def test_parse_text_action_rejects(content, complaint):
    with pytest.raises(ValueError, match=complaint):
        parse_text_action(content, TOOL_NAMES)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("```x\n" * 20_000, None),  # 100 kB of openings never closed: each searched the rest, 20 s and more
        ("```x\n```\n" * 10_000 + '```bash\n{"command": "ls"}\n```', ("bash", {"command": "ls"})),
        ("```bash\n" + "  ```x\n" * 20_000 + "```", "invalid JSON"),
    ],
)
def test_text_actions_are_read_in_linear_time(content, expected):
    """Text mode reads a hostile reply's fences in one pass over its lines."""
    started = time.monotonic()
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            parse_text_action(content, TOOL_NAMES)
    else:
        assert parse_text_action(content, TOOL_NAMES) == expected
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("content", "calls"),
    [
        ("<tool_call>x" + " " * 200_000 + "y", []),  # `\s*(.*?)\s*` backtracked over the spaces: minutes
        ("<tool_call><function=f>" + "<parameter=a>" * 20_000 + "</function>", ["f"]),  # each open tag read the rest
        ("<tool_call>" + "[" * 200_000, []),  # json.loads raised RecursionError through the client
    ],
)
def test_calls_left_as_text_are_read_in_linear_time(server, sleeps, content, calls):
    """A reply is hostile: whatever its text, reading the calls in it takes time in proportion to its length
    (these took a minute and more, or raised), and what cannot be read stays text."""
    server.add(reply(content))
    started = time.monotonic()
    with client_for(server, sleeps) as client:
        done = client.complete(MESSAGES, tools=TOOLS)
    assert time.monotonic() - started < 5
    assert [call["function"]["name"] for call in done.message.get("tool_calls", [])] == calls
    assert done.message["content"] == (None if calls else content)


OFFERED = {"execute_bash", "submit"}
LS = {"command": "ls"}


@pytest.mark.parametrize(
    ("content", "arguments"),
    [
        ('{"name": "execute_bash", "arguments": {"command": "ls"}}', LS),
        ('  \n{"name": "execute_bash", "parameters": {"command": "ls"}}\n\n', LS),
        ('```json\n{"type": "function", "name": "execute_bash", "arguments": {"command": "ls"}}\n```', LS),
        ('```\n{"name": "execute_bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n```', LS),
        ('{"name": "execute_bash", "arguments": {"command": "echo <tool_call>"}}', {"command": "echo <tool_call>"}),
    ],
)
def test_a_reply_that_is_one_json_call_of_an_offered_tool_is_a_call(content, arguments):
    out, from_text = normalise_message({"role": "assistant", "content": content, "tool_calls": []}, OFFERED)
    assert from_text and out["content"] is None
    [call] = out["tool_calls"]
    assert call["function"]["name"] == "execute_bash" and json.loads(call["function"]["arguments"]) == arguments


@pytest.mark.parametrize(
    ("content", "offered"),
    [
        ('{"name": "python", "arguments": {"code": "print(42)"}}', OFFERED),  # no such tool
        ('{"name": "execute_bash", "arguments": {"command": "ls"}}', set()),  # no tools offered
        ('Run this: {"name": "execute_bash", "arguments": {"command": "ls"}}', OFFERED),  # prose around it
        ('```python\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n```', OFFERED),
        ('{"name": "execute_bash", "arguments": {"command": "ls"}, "answer": 42}', OFFERED),  # more than a call
        ('{"name": "execute_bash", "arguments": ["ls"]}', OFFERED),
        ('{"type": "tool", "name": "execute_bash", "arguments": {"command": "ls"}}', OFFERED),
        ('{"name": "execute_bash", "arguments": {}, "parameters": {"command": "ls"}}', OFFERED),  # which one?
        ('{"name": ["execute_bash"], "arguments": {}}', OFFERED),
        ('{"name": "execute_bash", "arguments": {"command": "' + "x" * (1 << 20) + '"}}', OFFERED),  # too long
        ('{"name": "execute_bash", "arguments": ' + "[" * 100_000 + "}", OFFERED),
        ('[{"name": "execute_bash", "arguments": {"command": "ls"}}]', OFFERED),
    ],
)
def test_any_other_reply_stays_a_message(content, offered):
    """Only the whole reply, one JSON object naming an offered tool and nothing else, is a call."""
    out, from_text = normalise_message({"role": "assistant", "content": content, "tool_calls": []}, offered)
    assert (out["content"], from_text) == (content, False) and "tool_calls" not in out


def test_calls_the_server_parsed_are_not_from_text():
    """With calls in tool_calls, the content is left as the model wrote it, even when it reads as a call."""
    content = '{"name": "submit", "arguments": {}}'
    native = {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}}
    out, from_text = normalise_message({"role": "assistant", "content": content, "tool_calls": [native]}, OFFERED)
    assert (out["content"], from_text, out["tool_calls"]) == (content, False, [native])
