"""The chat client against hostile servers on 127.0.0.1: a reply is read within its bounds (its size as it is
decoded, and the whole request's deadline) whatever the server sends and however slowly it sends it. Going past
one is LLMReplyLimitError, naming the setting, and the request is not sent again. What the agent run and the
host make of it (memory, the record) is measured in test_attacks_agent.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import zlib

import pytest
from support.llm_server import COMPLETION_HEAD, MiB, ScriptedServer, Step, filled, filler, gzipped, reply

from jailbox.agent.llm import (
    MAX_REPLY_BYTES,
    AsyncLLMClient,
    LLMClient,
    LLMConfig,
    LLMReplyLimitError,
    LLMResponseError,
    Timeouts,
)

pytestmark = pytest.mark.once  # the client's HTTP handling is the same whoever runs it

MESSAGES = [{"role": "user", "content": "6*7?"}]
LIMIT = MiB  # the tests' bound; the default is MAX_REPLY_BYTES
GiB = 1 << 30
TOO_LARGE = r"the reply \(HTTP \d+\) is larger than max_reply_bytes \(1048576 bytes\)"


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


def config(server: ScriptedServer, **fields) -> LLMConfig:
    settings = {"model": "m", "base_url": server.url, "api_key": "k", "max_reply_bytes": LIMIT, **fields}
    return LLMConfig(**settings)


def calls(n: int) -> Step:
    """A valid completion holding ``n`` tool calls."""
    call = {"id": "c", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "true"}'}}
    return reply(None, tool_calls=[call] * n, finish_reason="tool_calls")


HUGE = [
    pytest.param(Step(stream=filler(GiB), length=filled(GiB)), id="content-length"),
    pytest.param(Step(stream=filler(GiB), close=True), id="no-length-until-close"),
    pytest.param(Step(stream=filler(GiB)), id="chunked"),
    pytest.param(Step(raw=gzipped(GiB), headers={"Content-Encoding": "gzip"}), id="gzip-inflating-to-a-gib"),
    pytest.param(Step(stream=lambda: [gzipped(GiB)], headers={"Content-Encoding": "gzip"}), id="gzip-chunked"),
    pytest.param(Step(status=503, stream=filler(GiB)), id="error-page"),
    pytest.param(reply("a" * (LIMIT + 1)), id="giant-content-in-valid-json"),
    pytest.param(calls(20_000), id="thousands-of-tool-calls"),
]


@pytest.mark.parametrize("step", HUGE)
def test_a_reply_over_the_limit_is_refused_and_not_sent_again(server, step):
    server.add(step, reply("never sent"))
    with LLMClient(config(server), sleep=lambda _: None) as client:
        with pytest.raises(LLMReplyLimitError, match=TOO_LARGE):
            client.complete(MESSAGES)
    assert len(server.requests) == 1


@pytest.mark.parametrize("step", [HUGE[2], HUGE[3]])
def test_the_async_client_holds_the_same_limit(server, step):
    server.add(step, reply("never sent"))

    async def main() -> None:
        async with AsyncLLMClient(config(server)) as client:
            await client.complete(MESSAGES)

    with pytest.raises(LLMReplyLimitError, match=TOO_LARGE):
        asyncio.run(main())
    assert len(server.requests) == 1


def test_replies_up_to_the_limit_are_read_whole_compressed_or_not(server):
    """The limit counts the decoded body: exactly LIMIT bytes is a reply, gzip and deflate are decoded, and
    the client asks for no encoding it cannot decode itself."""
    body = json.dumps(reply("").json).encode()
    exact = body.replace(b'"content": ""', b'"content": "' + b"a" * (LIMIT - len(body)) + b'"')
    assert len(exact) == LIMIT
    deflated = zlib.compress(body)
    server.add(
        Step(raw=exact),
        Step(raw=gzipped(2 * MiB), headers={"Content-Encoding": "gzip"}),
        Step(raw=deflated, headers={"Content-Encoding": "deflate"}),
    )
    with LLMClient(config(server)) as client:
        assert len(client.complete(MESSAGES).message["content"]) == LIMIT - len(body)
        with pytest.raises(LLMReplyLimitError, match=TOO_LARGE):
            client.complete(MESSAGES)
    with LLMClient(config(server, max_reply_bytes=3 * MiB)) as client:
        assert client.complete(MESSAGES).message["content"] == ""
    assert [r.headers["accept-encoding"] for r in server.requests] == ["gzip, deflate"] * 3
    assert LLMConfig(model="m", base_url="http://x").max_reply_bytes == MAX_REPLY_BYTES == 16 * MiB


def test_a_reply_of_many_small_values_is_refused_before_it_is_parsed(server):
    """Parsed and recorded, each JSON value costs the host a few hundred bytes: a reply within the limit that is
    nothing but "[]," would cost it a GiB. A reply holds at most one "[", "{" or "," per 64 bytes of the limit,
    counted in its text too, which a reply's worth of text does not come near."""
    values = COMPLETION_HEAD + b'x", "x": [' + b",".join([b"[]"] * 100_000) + b"]}}]}"
    commas = "," * (LIMIT // 64 - 100)
    server.add(
        Step(raw=values), reply(commas), reply(None, tool_calls=calls(5000).json["choices"][0]["message"]["tool_calls"])
    )
    with LLMClient(config(server)) as client:
        with pytest.raises(LLMReplyLimitError, match=r"holds 200\d{3} JSON values, more than one per 64 bytes of"):
            client.complete(MESSAGES)
        assert client.complete(MESSAGES).message["content"] == commas
        with pytest.raises(LLMReplyLimitError, match=r"max_reply_bytes \(1048576 bytes\) allows"):
            client.complete(MESSAGES)
    assert len(server.requests) == 3


@pytest.mark.parametrize("encoding", ["gzip, gzip", "br", "zstd"])
def test_encodings_it_did_not_ask_for_are_refused_unread(server, encoding):
    """httpx would decode "gzip, gzip" whole, a GiB per 64 KiB read and squared; no server is asked for it."""
    server.add(Step(raw=gzipped(GiB), headers={"Content-Encoding": encoding}), reply("never sent"))
    with LLMClient(config(server)) as client:
        with pytest.raises(LLMResponseError, match="asked for gzip or deflate"):
            client.complete(MESSAGES)
    assert len(server.requests) == 1


OK = json.dumps(reply("ok").json).encode()
TRICKLES = [
    pytest.param(Step(stream=lambda: itertools.repeat(b" ", 100_000), close=True, gap=0.1), id="body"),
    pytest.param(Step(stream=lambda: [OK], length=len(OK), trickle_head=True, gap=0.1), id="status-line-and-headers"),
]


@pytest.mark.parametrize("step", TRICKLES)
def test_a_trickling_server_holds_a_request_no_longer_than_its_deadline(server, step):
    """A byte every 0.1 s keeps every read within its wait (5 s here, ten minutes by default): only the deadline
    on the whole request ends it. Not sent again: it would cost the whole deadline once more."""
    server.add(step, reply("never sent"))
    started = time.monotonic()
    with LLMClient(config(server, timeout={"read": 5, "total": 1.5})) as client:
        with pytest.raises(LLMReplyLimitError, match=r"no whole reply within timeout\.total \(1\.5 s\)"):
            client.complete(MESSAGES)
    assert time.monotonic() - started < 30  # a hang guard: the server would trickle for hours
    assert len(server.requests) == 1
    assert Timeouts().total == 1800.0


@pytest.mark.parametrize("step", TRICKLES)
def test_the_async_client_holds_the_same_deadline(server, step):
    server.add(step, reply("never sent"))

    async def main() -> None:
        async with AsyncLLMClient(config(server, timeout={"read": 5, "total": 1.5})) as client:
            await client.complete(MESSAGES)

    with pytest.raises(LLMReplyLimitError, match=r"timeout\.total \(1\.5 s\)"):
        asyncio.run(main())
    assert len(server.requests) == 1


def test_the_flags_defaults_are_the_clients():
    """`run`'s and `bench`'s --llm-max-reply and --llm-timeout default to what LLMConfig does."""
    from jailbox.cli import bench_cmd, run_cmd
    from jailbox.sandbox.config import parse_size

    for command in (run_cmd, bench_cmd):
        defaults = {param.name: param.default for param in command.params}
        assert parse_size(defaults["llm_max_reply"]) == MAX_REPLY_BYTES
        assert defaults["llm_timeout"] == Timeouts().total
