"""OpenAI-compatible chat client for the agent loop: one request/retry/parse core, a sync and an async transport.

The core is a generator that yields what to do next (send this body, sleep this long) and is sent back what
happened, so the retry policy, context-length recovery and response validation exist once; `LLMClient` and
`AsyncLLMClient` only perform the I/O it asks for.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import os
import random
import re
import secrets
import socket
import threading
import time
import weakref
import zlib
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..sandbox.errors import AgentError
from .text import MAX_DEPTH, nests_deeper


class LLMError(AgentError):
    """Base of every error this module raises."""


class _StatusError(LLMError):
    """An error about a reply the server did send: its status and whole body are kept for the caller."""

    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class LLMHTTPError(_StatusError):
    """The server answered with an error status (after any retries it deserved)."""


class LLMBodyError(LLMHTTPError):
    """A 2xx reply whose body is an error, not a completion; ``status`` is the code the error gives (else 502)."""


class ContextLengthError(LLMHTTPError):
    """The conversation does not fit the model's context, even with ``max_tokens`` shrunk to what is left."""


class LLMResponseError(_StatusError):
    """A success status with a body that is not a chat completion (not retried: asking again rarely helps)."""


class LLMConnectionError(LLMError):
    """Connecting, sending or reading failed on every attempt (refused, dropped, timed out)."""


class LLMCancelled(LLMError):
    """``cancel()`` ended the client: a request in flight was cut off, and no other is sent."""


class LLMReplyLimitError(LLMError):
    """A reply went past a bound the client holds every reply to: ``max_reply_bytes``, or ``timeout.total``
    for the whole request. Not retried: each attempt could cost the whole bound again, and a server that went
    past it once is likely to again; the message names the setting that raises it."""


_RETRY_STATUSES = frozenset({408, 409, 429})  # besides 5xx; 408 and 409 are transient too, as the OpenAI SDK has it
_CONTEXT_PHRASES = (
    "maximum context length",
    "context_length_exceeded",
    "context length exceeded",
    "reduce the length",
    "too many tokens",
    "exceeds the available context size",  # llama.cpp
    "exceed_context_size_error",  # llama.cpp's error type
    "longer than the model's context length",  # SGLang, a prompt that alone is too long
)
# vLLM "maximum context length is N", SGLang "... of N tokens", llama.cpp "available context size (N tokens)"
_CONTEXT_LIMIT = re.compile(
    r"maximum context length (?:is|of) (\d+)|available context size \((\d+) tokens\)", re.IGNORECASE
)
_PROMPT_TOKENS = re.compile(
    r"(\d+) in the messages|(\d+) input tokens|messages resulted in (\d+) tokens|(\d+) tokens from the input",
    re.IGNORECASE,
)
_CONTEXT_MARGIN = 16
_OUTPUT_CAP = re.compile(r"supports at most (\d+) completion tokens", re.IGNORECASE)
_USE_COMPLETION_TOKENS = re.compile(r"'max_tokens' is not supported.*use 'max_completion_tokens'", re.I | re.S)
_TEXT_PARTS = frozenset({"text", "output_text"})
# The patterns below read the model's text in linear time: no two neighbouring parts can take the same run of
# characters (``\s*(.*?)\s*`` could, and a hostile reply of spaces made its search quadratic).
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_XML_FUNCTION = re.compile(r"^<function=([\w.-]+)>(.*?)</function>$", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([\w.-]+)>")
_XML_PARAMETER_END = "</parameter>"
_CALL_KEYS = frozenset({"type", "name", "arguments", "parameters"})  # all a JSON object written as a call holds
_TEXT_CALL_LIMIT = 1 << 20  # characters; a longer reply is not parsed as a JSON call, which bounds the work
_REASONING_KEYS = frozenset({"reasoning_content", "reasoning"})
_BODY_EXCERPT = 500
MAX_REPLY_BYTES = 16 << 20
"""The default ``max_reply_bytes``: bytes of a reply's body the client takes, counted as they are decoded (a
compressed body by what it inflates to). A reply of the default 65536 tokens is about 256 KiB of text and at
most about 1.5 MiB of JSON with every character escaped, twice that where a server sends the reasoning in two
fields; 16 MiB leaves room for that several times over. Logprobs asked for through ``extra_body`` can need more."""
BYTES_PER_VALUE = 64
"""A reply may hold one byte that opens or separates JSON values (``[``, ``{`` or ``,``, counted in its strings
too) per this many bytes of ``max_reply_bytes``: 262,144 by default, several times what 65536 tokens of
comma-separated numbers hold. Parsed and recorded, each value costs the host a few hundred bytes: a 16 MiB reply
of nothing but ``[],`` would cost it about a GiB. Counting is a scan of the bytes, before anything is parsed."""
_ENCODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
_NOT_JSON = object()


class Timeouts(BaseModel):
    """Seconds to connect, to wait for each read (self-hosted servers queue requests, so reads wait long), and
    for the whole request, from connecting to the reply's last byte: a server sending a byte within each read's
    wait would otherwise hold a request for ever. A server answers without streaming once it is done, so a
    reply starts within one read wait; ``total`` is three read waits, leaving two to send a reply of any size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect: float = Field(default=10.0, gt=0)
    read: float = Field(default=600.0, gt=0)
    total: float = Field(default=1800.0, gt=0)


# litellm's provider prefixes as the reference passes model names through it: the prefix picks the API (these
# are all OpenAI-compatible) and, with no --llm_base_url, the provider's endpoint; the server sees the rest.
PROVIDERS: dict[str, str | None] = {
    "openai": None,
    "hosted_vllm": None,
    "custom_openai": None,
    "text-completion-openai": None,
    "openrouter": "https://openrouter.ai/api/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "ollama": "http://localhost:11434/v1",
    "ollama_chat": "http://localhost:11434/v1",
    "lm_studio": "http://localhost:1234/v1",
    "groq": "https://api.groq.com/openai/v1",
    "together_ai": "https://api.together.xyz/v1",
    "fireworks_ai": "https://api.fireworks.ai/inference/v1",
    "mistral": "https://api.mistral.ai/v1",
    "xai": "https://api.x.ai/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai",
}


def route_model(name: str) -> tuple[str, str | None]:
    """(model as the server knows it, the provider's endpoint if the prefix names one). Only a known provider
    prefix goes, as in litellm: "openai/Qwen/Qwen3-8B" sends "Qwen/Qwen3-8B", "Qwen/Qwen3-8B" is sent whole."""
    provider, slash, rest = name.partition("/")
    if slash and rest and provider in PROVIDERS:
        return rest, PROVIDERS[provider]
    return name, None


class LLMConfig(BaseModel):
    """Where and how to ask; ``base_url`` and ``api_key`` default to the usual environment variables.

    ``temperature`` and ``max_tokens`` default to the reference package's (1.0 and 65536: models trained in its
    setting were sampled so); None leaves a field out of the request, to the server's default.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    base_url: str
    api_key: SecretStr = Field(default_factory=lambda: SecretStr(os.environ.get("OPENAI_API_KEY", "")))
    temperature: float | None = 1.0
    max_tokens: int | None = Field(default=65536, ge=1)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: Timeouts = Field(default_factory=Timeouts)
    max_retries: int = Field(default=6, ge=0)
    strip_reasoning: bool = False
    backoff_base: float = Field(default=1.0, ge=0)
    backoff_max: float = Field(default=60.0, ge=0)
    max_reply_bytes: int = Field(default=MAX_REPLY_BYTES, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _base_url_from_env(cls, data: Any) -> Any:
        """Fill ``base_url`` from the environment here, so a missing one fails with the variables to set."""
        if isinstance(data, dict) and not data.get("base_url"):
            url = os.environ.get("OPENAI_BASE_URL") or os.environ.get("LLM_BASE_URL")
            if not url:
                raise ValueError("no base_url given and neither OPENAI_BASE_URL nor LLM_BASE_URL is set")
            data = {**data, "base_url": url}
        return data

    @field_validator("timeout", mode="before")
    @classmethod
    def _read_timeout_from_number(cls, value: Any) -> Any:
        """A bare number is the read timeout, the one worth tuning."""
        if isinstance(value, int | float):
            return {"read": value}
        return value


class Usage(BaseModel):
    """Token counts of one completion; zeros where the server did not say."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class UsageTotals(Usage):
    """Token counts summed over a client's successful calls."""

    calls: int = 0


class Completion(BaseModel):
    """One answer: the assistant message as returned (reasoning and unknown fields included), in the shape a
    server accepts back (``normalise_message``).

    ``max_tokens_used`` is what the answering request asked for (smaller after a context-length shrink),
    ``latency`` the whole call's wall time with retries and back-off, ``attempts`` the requests sent;
    ``calls_from_text`` says the message's tool calls were read from its text, where the server left them.
    """

    message: dict[str, Any]
    finish_reason: str | None
    usage: Usage
    max_tokens_used: int | None
    latency: float
    attempts: int
    calls_from_text: bool = False


@dataclass(frozen=True)
class _Send:
    body: dict[str, Any]


@dataclass(frozen=True)
class Retry:
    """A failed attempt that will be retried: told to ``on_retry`` before the back-off starts, so a user
    waiting on a dead endpoint sees why (the last failure is the raised error)."""

    attempt: int  # the request that failed, from 1
    retries: int  # how many retries the client makes at most (``max_retries``)
    seconds: float  # the back-off before the next attempt
    cause: str  # what went wrong: ``ConnectError: [Errno 111] Connection refused``, ``HTTP 503: ...``
    hinted: bool = False  # the wait is the server's Retry-After
    backoff: bool = True  # False: sent again at once, changed (a shorter output limit), not after a failure count


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Reply:
    """A whole reply, read within the client's bounds (its body decoded)."""

    status: int
    headers: httpx.Headers
    body: bytes

    @property
    def text(self) -> str:
        """JSON is UTF-8 (RFC 8259); an error page in another charset is only shown, so replacement will do."""
        return self.body.decode("utf-8", errors="replace")


class _Body:
    """Takes a reply's body as it comes, decoding gzip or deflate itself with a cap on each step's output:
    httpx inflates a whole read at once (64 KiB can inflate to 64 MiB, and "gzip, gzip" to 64 GiB), before
    anything could be counted. Raises LLMReplyLimitError past ``limit`` decoded bytes."""

    def __init__(self, url: str, response: httpx.Response, limit: int) -> None:
        self.url, self.status, self.limit = url, response.status_code, limit
        codings = [c.strip().lower() for c in response.headers.get_list("content-encoding", split_commas=True)]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in _ENCODINGS):
            shown = ", ".join(codings)[:100]
            raise LLMResponseError(f"{url}: the reply is encoded {shown!r}; asked for gzip or deflate", self.status, "")
        self._inflate = zlib.decompressobj(_ENCODINGS[codings[0]]) if codings else None
        self._chunks: list[bytes] = []
        self._size = 0

    def feed(self, raw: bytes) -> None:
        if self._inflate is None:
            self._take(raw)
            return
        try:
            self._take(self._inflate.decompress(raw, self.limit - self._size + 1))
            while self._inflate.unconsumed_tail and not self._inflate.eof:
                self._take(self._inflate.decompress(self._inflate.unconsumed_tail, self.limit - self._size + 1))
        except zlib.error as exc:
            raise LLMResponseError(f"{self.url}: the reply does not decode ({exc})", self.status, "") from None

    def _take(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self.limit:
            raise LLMReplyLimitError(
                f"{self.url}: the reply (HTTP {self.status}) is larger than max_reply_bytes ({self.limit} bytes)"
            )
        self._chunks.append(data)

    def reply(self, response: httpx.Response) -> _Reply:
        """The whole body, once it holds no more values than ``BYTES_PER_VALUE`` allows (counted before it is
        parsed, which is where a reply of many small values would cost the host)."""
        if self._inflate is not None:
            self._take(self._inflate.flush())
        body = b"".join(self._chunks)
        values = body.count(b"[") + body.count(b"{") + body.count(b",")
        if values > self.limit // BYTES_PER_VALUE:
            raise LLMReplyLimitError(
                f"{self.url}: the reply (HTTP {self.status}) holds {values} JSON values, more than one per "
                f"{BYTES_PER_VALUE} bytes of max_reply_bytes ({self.limit} bytes) allows"
            )
        return _Reply(self.status, response.headers, body)


_Outcome = _Reply | httpx.TransportError | LLMError | None
_Flow = Generator[_Send | _Sleep, _Outcome, Completion]


def _excerpt(status: int, text: str) -> str:
    return f"HTTP {status}: {text[:_BODY_EXCERPT]}"


def _failure(outcome: _Outcome) -> str:
    """A failed attempt in one line: the transport error, or the status and the start of the body."""
    if isinstance(outcome, _Reply):
        return " ".join(_excerpt(outcome.status, outcome.text)[:200].split())
    return f"{type(outcome).__name__}: {str(outcome) or 'no detail'}"


def _is_context_error(text: str) -> bool:
    """Matched on the raw body, which holds both the message and the error code, whatever the JSON shape."""
    lowered = text.lower()
    return any(phrase in lowered for phrase in _CONTEXT_PHRASES)


def _cause(exc: LLMError) -> str:
    """One line naming what went wrong, for the status line: the status and the start of the server's words."""
    if isinstance(exc, LLMBodyError):
        return " ".join(f"HTTP 200 carrying error {exc.status}: {exc.body}".split())[:200]
    if isinstance(exc, _StatusError):
        return " ".join(f"HTTP {exc.status}: {exc.body}".split())[:200]
    return " ".join(str(exc).split())[:200]


def _retryable(exc: LLMError) -> bool:
    if isinstance(exc, LLMHTTPError):
        return exc.status in _RETRY_STATUSES or exc.status >= 500
    return isinstance(exc, LLMConnectionError)


def _first(match: re.Match[str] | None) -> int | None:
    return None if match is None else int(next(group for group in match.groups() if group))


def _json_or_none(text: str) -> Any:
    """``text`` parsed as JSON, or None when it is not JSON; nesting deeper than the parser recurses (a hostile
    ``[[[[...``, which raises RecursionError) counts as not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _llama_cpp_counts(text: str) -> tuple[int | None, int | None]:
    """llama.cpp puts the numbers beside its message: ``{"error": {"n_ctx": N, "n_prompt_tokens": P, ...}}``."""
    data = _json_or_none(text)
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None, None
    counts = [error.get(key) for key in ("n_ctx", "n_prompt_tokens")]
    limit, prompt = (value if isinstance(value, int) and not isinstance(value, bool) else None for value in counts)
    return limit, prompt


def _room_left(text: str) -> int | None:
    """Completion tokens that still fit, from messages like vLLM's "maximum context length is N tokens ...
    (X in the messages, Y in the completion)", SGLang's "... of N tokens ... X tokens from the input messages"
    or llama.cpp's ``n_ctx``/``n_prompt_tokens``; None when the message does not say or nothing fits."""
    limit, prompt = _llama_cpp_counts(text)
    limit = limit if limit is not None else _first(_CONTEXT_LIMIT.search(text))
    prompt = prompt if prompt is not None else _first(_PROMPT_TOKENS.search(text))
    if limit is None or prompt is None:
        return None
    room = limit - prompt
    return max(1, room - _CONTEXT_MARGIN) if room > 0 else None


def _limit_key(body: dict[str, Any]) -> str:
    """Which key bounds the completion in this body ("" when none does)."""
    return next((key for key in ("max_tokens", "max_completion_tokens") if isinstance(body.get(key), int)), "")


def _within_output_cap(body: dict[str, Any], text: str) -> tuple[dict[str, Any], str] | None:
    """The body changed as a refusal of its output limit asks, and what changed; None for other refusals.

    OpenAI caps completions per model ("... supports at most N completion tokens") and its reasoning models
    take only ``max_completion_tokens``; the reference's defaults (65536 tokens) meet both, which litellm
    smoothed over for it.
    """
    key = _limit_key(body)
    if not key:
        return None
    if key == "max_tokens" and _USE_COMPLETION_TOKENS.search(text):
        rest = {name: value for name, value in body.items() if name != "max_tokens"}
        return {**rest, "max_completion_tokens": body["max_tokens"]}, "max_completion_tokens"
    cap = _OUTPUT_CAP.search(text)
    if cap is None or int(cap.group(1)) >= body[key]:
        return None
    return {**body, key: int(cap.group(1))}, f"{key} {cap.group(1)}"


def _retry_after(response: _Reply) -> float | None:
    """Retry-After in seconds, or as an HTTP date (RFC 9110 allows both; proxies and CDNs send dates)."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": a date without a zone, which HTTP dates are in GMT anyway
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def _usage(data: Any) -> Usage:
    """Servers omit usage, or send nulls; both count as zero."""
    if not isinstance(data, dict):
        return Usage()
    return Usage(**{field: int(data.get(field) or 0) for field in Usage.model_fields})


def _error_in_body(data: Any) -> tuple[int, str] | None:
    """An error a 2xx body carries instead of a completion (OpenRouter relays a provider's failure as HTTP 200
    with ``{"error": {"code": 502, "message": ...}}``, or as a choice whose ``finish_reason`` is "error"):
    the status it stands for (its code when that is an HTTP status, else 502) and its message."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    choices = data.get("choices")
    if error is None and isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        if choice.get("finish_reason") == "error" or choice.get("error") is not None:
            error = choice.get("error") or {"message": "the choice ended with finish_reason 'error'"}
    if error is None:
        return None
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599 else 502
    message = error.get("message") if isinstance(error, dict) else error
    return status, str(message)


def _parsed(body: bytes) -> Any:
    """``body`` as JSON, or ``_NOT_JSON``; nesting deeper than the parser recurses (RecursionError) is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _parse_choice(status: int, text: str, data: Any) -> tuple[dict[str, Any], Usage]:
    """The first choice of a 2xx body (``data``, parsed from ``text``) and its usage, or LLMResponseError saying
    what is wrong with the body."""
    if data is _NOT_JSON:
        raise LLMResponseError(f"response is not JSON ({_excerpt(status, text)})", status, text)
    if not isinstance(data, dict) or "choices" not in data:
        raise LLMResponseError(f"response has no 'choices' ({_excerpt(status, text)})", status, text)
    if nests_deeper(data, MAX_DEPTH):  # the message is kept in the record, which cannot be written so deep
        shown = _excerpt(status, text)
        raise LLMResponseError(f"response nests deeper than {MAX_DEPTH} levels ({shown})", status, text)
    choices = data["choices"]
    if not isinstance(choices, list) or not choices:
        raise LLMResponseError(f"response has no choices ({_excerpt(status, text)})", status, text)
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise LLMResponseError(f"choice has no 'message' ({_excerpt(status, text)})", status, text)
    return choice, _usage(data.get("usage"))


def _text_of(content: Any) -> tuple[str | None, str]:
    """``content`` as one string, and any thinking parts: servers in the Responses or Anthropic style send a
    list of parts, which a strict server refuses when it comes back in an assistant turn as it was."""
    if not isinstance(content, list):
        return (None if content is None else str(content)), ""
    texts, thoughts = [], []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("thinking"), str):
            thoughts.append(part["thinking"])
    return "".join(texts), "".join(thoughts)


def _string_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _arguments(value: Any) -> str:
    """Arguments as the JSON string the API defines; Ollama and some templates return the object itself."""
    if isinstance(value, str):
        return value
    return json.dumps({} if value is None else value, ensure_ascii=False)


def _tool_call(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    given = raw.get("function")
    function: dict[str, Any] = given if isinstance(given, dict) else {}
    call_id = raw.get("id")
    return {
        **raw,
        "id": call_id if isinstance(call_id, str) and call_id else _call_id(),
        "type": "function",
        "function": {
            **function,
            "name": str(function.get("name") or ""),
            "arguments": _arguments(function.get("arguments")),
        },
    }


def _xml_parameters(body: str) -> dict[str, str]:
    """``<parameter=KEY>VALUE</parameter>`` pairs, one newline after the opening and before the closing tag
    dropped; each find starts where the last ended, so the text is read once, however many tags stay open."""
    parameters: dict[str, str] = {}
    start = 0
    while (opening := _XML_PARAMETER.search(body, start)) is not None:
        end = body.find(_XML_PARAMETER_END, opening.end())
        if end < 0:
            break
        value = body[opening.end() : end]
        value = value[1:] if value.startswith("\n") else value
        parameters[opening.group(1)] = value[:-1] if value.endswith("\n") else value
        start = end + len(_XML_PARAMETER_END)
    return parameters


def _function_call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": _call_id(), "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


def _tagged_call(block: str) -> dict[str, Any] | None:
    """One ``<tool_call>`` block as a tool call: Hermes-style JSON ``{"name": ..., "arguments": {...}}``, or the
    Qwen3-Coder form ``<function=NAME><parameter=KEY>VALUE</parameter></function>``; None if it is neither."""
    xml = _XML_FUNCTION.match(block.strip())
    if xml is not None:
        return _function_call(xml.group(1), _xml_parameters(xml.group(2)))
    data = _json_or_none(block)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    return _function_call(data["name"], data.get("arguments", data.get("parameters", {})))


def _bare_call(content: str, tool_names: Collection[str]) -> dict[str, Any] | None:
    """The whole of ``content`` as one tool call written as a JSON object, bare or in a ```` ```json ```` fence:
    ``{"name": TOOL, "arguments": {...}}`` (``"parameters"`` as Llama writes it, and ``"type": "function"``
    allowed), where TOOL is one of ``tool_names``; None for anything else, and for more than
    ``_TEXT_CALL_LIMIT`` characters, which are not parsed at all."""
    text = content.strip()
    if len(text) > _TEXT_CALL_LIMIT:
        return None
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        opening, _, rest = text[3:-3].partition("\n")
        if opening.strip() not in ("", "json"):
            return None
        text = rest.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    data = _json_or_none(text)
    if not isinstance(data, dict) or not data.keys() <= _CALL_KEYS or data.get("type", "function") != "function":
        return None
    name = data.get("name")
    if not isinstance(name, str) or name not in tool_names or ("arguments" in data and "parameters" in data):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    return _function_call(name, arguments) if isinstance(arguments, dict | str) else None


def _text_calls(content: str, tool_names: Collection[str]) -> tuple[list[dict[str, Any]], str | None] | None:
    """The tool calls a server left in ``content`` as text and the content without them: ``<tool_call>`` blocks
    when every one reads as a call, else the whole content as one JSON call of an offered tool (whose arguments
    may hold the tag as text); None when it holds neither."""
    if "<tool_call>" in content:
        tagged = [_tagged_call(block) for block in _TOOL_CALL_TAG.findall(content)]
        calls = [call for call in tagged if call is not None]
        if calls and len(calls) == len(tagged):
            return calls, _TOOL_CALL_TAG.sub("", content).strip() or None
    bare = _bare_call(content, tool_names)
    return None if bare is None else ([bare], None)


def normalise_message(message: dict[str, Any], tool_names: Collection[str]) -> tuple[dict[str, Any], bool]:
    """The assistant message in the shape every OpenAI-compatible server accepts back in the next turn, and
    whether its tool calls were read from its text.

    Unknown fields (reasoning, provider extras) stay. ``content`` becomes a string; each tool call gets an
    ``id`` (answered by that id), ``type`` and its arguments as a JSON string; an empty ``tool_calls`` goes.
    When tools were offered (``tool_names``, their names) but the calls came back as text in ``content``, as a
    server without the model's tool parser returns them, they are moved to ``tool_calls``: ``<tool_call>``
    blocks, or a content that is nothing but one JSON object naming an offered tool.
    """
    out = dict(message)
    content, thinking = _text_of(message.get("content"))
    out["content"] = content
    for key in ("reasoning_content", "reasoning"):  # some servers send these as parts too
        if out.get(key) is not None and not isinstance(out[key], str):
            text, thought = _text_of(out[key])
            out[key] = (text or "") + thought if isinstance(out[key], list) else json.dumps(out[key])
    if thinking and not (out.get("reasoning_content") or out.get("reasoning")):
        out["reasoning_content"] = thinking
    calls = [call for call in map(_tool_call, message.get("tool_calls") or []) if call is not None]
    from_text = None if calls or not tool_names or not content else _text_calls(content, tool_names)
    if from_text is not None:
        calls, out["content"] = from_text
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    return out, from_text is not None


def _tool_names(tools: Sequence[Mapping[str, Any]] | None) -> frozenset[str]:
    """The names of the offered tools (``{"type": "function", "function": {"name": ...}}``)."""
    functions = (tool.get("function") for tool in tools or ())
    return frozenset(f["name"] for f in functions if isinstance(f, Mapping) and isinstance(f.get("name"), str))


class _ChatCore:
    """Everything but I/O: the request, the retry policy, response checks and the usage totals."""

    def __init__(self, config: LLMConfig, on_retry: Callable[[Retry], None] | None = None) -> None:
        self.config = config
        self.on_retry = on_retry
        """Told, in one line, why a request is sent again (the status line shows it)."""
        self._output_limit: tuple[str, int | None] = ("max_tokens", None)  # the key and cap a refusal taught
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.usage = UsageTotals()
        self._usage_lock = threading.Lock()
        key = config.api_key.get_secret_value()
        # the codings _Body decodes, not httpx's default (which names br and zstd where their packages are)
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        self._headers = {"Accept-Encoding": "gzip, deflate", **auth, **config.headers}
        self._timeout = httpx.Timeout(config.timeout.read, connect=config.timeout.connect)

    def _past_deadline(self) -> LLMReplyLimitError:
        return LLMReplyLimitError(f"{self.url}: no whole reply within timeout.total ({self.config.timeout.total:g} s)")

    def _outgoing(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Reasoning stays in assistant messages unless asked: DeepSeek and Kimi reject turns without it."""
        if self.config.strip_reasoning and message.get("role") == "assistant":
            return {key: value for key, value in message.items() if key not in _REASONING_KEYS}
        return dict(message)

    def _body(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": [self._outgoing(m) for m in messages]}
        if tools:
            body["tools"] = list(tools)
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            key, cap = self._output_limit
            body[key] = min(self.config.max_tokens, cap) if cap is not None else self.config.max_tokens
        return {**body, **self.config.extra_body}

    def _check(self, outcome: _Outcome, attempts: int) -> tuple[dict[str, Any], Usage]:
        """The choice and usage of a good reply; otherwise the error it amounts to."""
        if isinstance(outcome, LLMError):  # the reply broke a bound, or cannot be decoded
            raise outcome
        if not isinstance(outcome, _Reply):
            raise LLMConnectionError(
                f"{self.url}: {type(outcome).__name__}: {str(outcome) or 'no detail'} (attempt {attempts})"
            ) from outcome
        status, text = outcome.status, outcome.text
        if 200 <= status < 300:
            data = _parsed(outcome.body)
            carried = None if data is _NOT_JSON else _error_in_body(data)
            if carried is None:
                return _parse_choice(status, text, data)
            code, message = carried
            shown = f"HTTP {status} carrying error {code}: {message[:_BODY_EXCERPT]}"
            if _is_context_error(message):
                raise ContextLengthError(f"context length exceeded ({shown})", code, message)
            raise LLMBodyError(f"{self.url}: {shown} (attempt {attempts})", code, message)
        if status in (400, 413) and _is_context_error(text):
            raise ContextLengthError(f"context length exceeded ({_excerpt(status, text)})", status, text)
        raise LLMHTTPError(f"{self.url}: {_excerpt(status, text)} (attempt {attempts})", status, text)

    def _backoff(self, failures: int, outcome: _Outcome) -> tuple[float, bool]:
        """Full jitter over an exponential cap, or the server's Retry-After (the flag says which); never more
        than backoff_max."""
        hinted = _retry_after(outcome) if isinstance(outcome, _Reply) else None
        if hinted is not None:
            return min(hinted, self.config.backoff_max), True
        return random.uniform(0, min(self.config.backoff_max, self.config.backoff_base * 2 ** (failures - 1))), False

    def _retrying(self, retry: Retry) -> None:
        if self.on_retry is not None:
            self.on_retry(retry)

    def _exchange(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> _Flow:
        body = self._body(messages, tools)
        started = time.monotonic()
        attempts = failures = 0
        shrunk = False
        refused: set[str] = set()  # bodies of refusals already answered once: a second one is final
        while True:
            attempts += 1
            outcome = yield _Send(body)
            try:
                choice, usage = self._check(outcome, attempts)
            except ContextLengthError as exc:
                key = _limit_key(body)
                room = None if shrunk or not key else _room_left(exc.body)
                if room is None or room >= body[key]:
                    raise
                cause = f"context length exceeded: {key} {body[key]} -> {room}"
                self._retrying(Retry(attempts, self.config.max_retries, 0.0, cause, backoff=False))
                body = {**body, key: room}
                shrunk = True
                continue
            except LLMError as exc:
                refusal = exc.body if isinstance(exc, LLMHTTPError) and exc.status == 400 else None
                fixed = None if refusal is None or refusal in refused else _within_output_cap(body, refusal)
                if refusal is not None and fixed is not None:
                    refused.add(refusal)
                    cause = f"the server refused the output limit; asking with {fixed[1]}: {_cause(exc)}"
                    self._retrying(Retry(attempts, self.config.max_retries, 0.0, cause, backoff=False))
                    body = fixed[0]
                    key = _limit_key(body)
                    self._output_limit = (key, body[key])  # the model's own limit: later calls ask within it
                    continue
                if not _retryable(exc) or failures >= self.config.max_retries:
                    raise
                failures += 1
                wait, hinted = self._backoff(failures, outcome)
                cause = _cause(exc) if isinstance(outcome, _Reply) else _failure(outcome)
                self._retrying(Retry(failures, self.config.max_retries, wait, cause, hinted=hinted))
                yield _Sleep(wait)
                continue
            return self._record(choice, usage, body, time.monotonic() - started, attempts, _tool_names(tools))

    def _record(
        self,
        choice: dict[str, Any],
        usage: Usage,
        body: dict[str, Any],
        latency: float,
        attempts: int,
        tool_names: Collection[str],
    ) -> Completion:
        """Adds to the client's totals under a lock: one sync client may serve many threads."""
        with self._usage_lock:
            self.usage.prompt_tokens += usage.prompt_tokens
            self.usage.completion_tokens += usage.completion_tokens
            self.usage.total_tokens += usage.total_tokens
            self.usage.calls += 1
        message, calls_from_text = normalise_message(choice["message"], tool_names)
        return Completion(
            message=message,
            finish_reason=_string_or_none(choice.get("finish_reason")),
            usage=usage,
            max_tokens_used=body.get("max_tokens"),
            latency=latency,
            attempts=attempts,
            calls_from_text=calls_from_text,
        )


class _Deadline:
    """Shuts one request's sockets when its ``timeout.total`` is up: httpx has no deadline for a whole request,
    and a read blocked on a socket returns only when the socket is shut."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.passed:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                _shut(sock)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()


class LLMClient(_ChatCore):
    """Blocking client; safe to share between threads.

    ``cancel()``, from any thread, cuts off a request in flight: a read may otherwise wait the whole read
    timeout (ten minutes by default) on a stalled server, and a batch being killed must not. Each request has a
    connection of its own: httpcore names a socket only as it connects, and the request's deadline shuts it.
    """

    def __init__(
        self,
        config: LLMConfig,
        *,
        sleep: Callable[[float], object] | None = None,
        on_retry: Callable[[Retry], None] | None = None,
    ) -> None:
        super().__init__(config, on_retry)
        self._cancelled = threading.Event()
        self._sleep = sleep or self._cancelled.wait
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._sockets_lock = threading.Lock()
        one_each = httpx.Limits(max_keepalive_connections=0)
        self._http = httpx.Client(headers=self._headers, timeout=self._timeout, limits=one_each)

    def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> Completion:
        """One chat completion, retried as the core decides."""
        flow = self._exchange(messages, tools)
        step = next(flow)
        while True:
            try:
                step = flow.send(self._perform(step))
            except StopIteration as done:
                return done.value

    def _perform(self, step: _Send | _Sleep) -> _Outcome:
        if not self._cancelled.is_set() and isinstance(step, _Sleep):
            self._sleep(step.seconds)
        if self._cancelled.is_set():
            raise LLMCancelled(f"{self.url}: the request was cancelled")
        if isinstance(step, _Sleep):
            return None
        deadline = _Deadline(self.config.timeout.total)

        def trace(event: str, info: dict[str, Any]) -> None:
            """httpcore's hook: the request's socket, for cancel() and for its deadline to shut."""
            if event == "connection.connect_tcp.complete":
                sock = info["return_value"].get_extra_info("socket")
                self._keep(sock)
                deadline.keep(sock)

        try:
            with deadline, self._http.stream("POST", self.url, json=step.body, extensions={"trace": trace}) as response:
                body = _Body(self.url, response, self.config.max_reply_bytes)
                for raw in response.iter_raw():
                    body.feed(raw)
            # a body that ends with its connection ends early, not as a whole reply, when the deadline shut it
            return self._past_deadline() if deadline.passed else body.reply(response)
        except httpx.TransportError as exc:
            if self._cancelled.is_set():
                raise LLMCancelled(f"{self.url}: the request was cancelled") from None
            return self._past_deadline() if deadline.passed else exc
        except LLMError as exc:
            return exc

    def _keep(self, sock: socket.socket) -> None:
        """Keep a new connection's socket, so cancel() can shut it down."""
        with self._sockets_lock:
            self._sockets.add(sock)
            if self._cancelled.is_set():
                _shut(sock)

    def cancel(self) -> None:
        """Shut down every connection (a blocked read returns at once) and refuse further requests."""
        with self._sockets_lock:
            self._cancelled.set()
            for sock in list(self._sockets):
                _shut(sock)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shut(sock: socket.socket) -> None:
    """shutdown(), unlike close(), wakes a thread blocked reading the socket."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class AsyncLLMClient(_ChatCore):
    """The asyncio twin of `LLMClient`: same core, awaited I/O."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_retry: Callable[[Retry], None] | None = None,
    ) -> None:
        super().__init__(config, on_retry)
        self._sleep = sleep
        self._http = httpx.AsyncClient(headers=self._headers, timeout=self._timeout)

    async def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> Completion:
        """One chat completion, retried as the core decides."""
        flow = self._exchange(messages, tools)
        step = next(flow)
        while True:
            try:
                step = flow.send(await self._perform(step))
            except StopIteration as done:
                return done.value

    async def _perform(self, step: _Send | _Sleep) -> _Outcome:
        if isinstance(step, _Sleep):
            await self._sleep(step.seconds)
            return None
        try:
            return await asyncio.wait_for(self._request(step.body), self.config.timeout.total)
        except asyncio.TimeoutError:
            return self._past_deadline()
        except httpx.TransportError as exc:
            return exc
        except LLMError as exc:
            return exc

    async def _request(self, body: dict[str, Any]) -> _Reply:
        async with self._http.stream("POST", self.url, json=body) as response:
            reader = _Body(self.url, response, self.config.max_reply_bytes)
            async for raw in response.aiter_raw():
                reader.feed(raw)
        return reader.reply(response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_FENCE_OPENING = re.compile(r"[ \t]*```[ \t]*([\w.-]*)[ \t]*")
_FENCE_CLOSING = re.compile(r"[ \t]*```[ \t]*")


def _fenced_blocks(content: str) -> list[tuple[str, str]]:
    """(label, text) of each fenced block: a line of three backticks and a label opens one, the next line of
    three backticks alone closes it, and an opening never closed is not a block. One pass over the lines: a
    pattern searching from each opening for its closing (the last one did) read the rest of the reply for
    every line such as "```x", quadratic in a hostile reply's length."""
    blocks: list[tuple[str, str]] = []
    lines = content.split("\n")
    label: str | None = None  # the open block's, None outside one
    inner: list[str] = []
    for number, line in enumerate(lines):
        if label is not None:
            if _FENCE_CLOSING.fullmatch(line):
                blocks.append((label, "".join(f"{text}\n" for text in inner)))
                label = None
            else:
                inner.append(line)
        elif number < len(lines) - 1 and (opening := _FENCE_OPENING.fullmatch(line)) is not None:
            label, inner = opening.group(1), []  # an opening line ends in a newline
    return blocks


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what}: invalid JSON ({exc}); write the arguments as one JSON object") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected a JSON object of arguments, got {type(value).__name__}")
    return value


def parse_text_action(content: str, tool_names: set[str]) -> tuple[str, dict[str, Any]] | None:
    """The one tool call written as a fenced block, for models without native tool calling.

    Either ```` ```<tool>\\n{json args}\\n``` ```` or a ```` ```json ```` block holding
    ``{"name": ..., "arguments": {...}}``. Other fenced blocks, and json blocks without a "name", are samples,
    not actions. None when there is no action; ValueError, worded for the model, when there are several or one
    cannot be read.
    """
    actions: list[tuple[str, dict[str, Any]]] = []
    for label, inner in _fenced_blocks(content):
        if label in tool_names:
            actions.append((label, _json_object(inner, f"```{label} block")))
        elif label == "json":
            try:
                call = json.loads(inner)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"```json block: invalid JSON ({exc})") from None
            if not isinstance(call, dict) or "name" not in call:
                continue
            name = call["name"]
            if not isinstance(name, str) or name not in tool_names:
                raise ValueError(f"unknown tool {name!r} in ```json block; tools: {', '.join(sorted(tool_names))}")
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):
                arguments = _json_object(arguments, f"arguments of {name!r}")
            if not isinstance(arguments, dict):
                raise ValueError(f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}")
            actions.append((name, arguments))
    if len(actions) > 1:
        names = ", ".join(name for name, _ in actions)
        raise ValueError(f"found {len(actions)} actions ({names}); write exactly one fenced action per reply")
    return actions[0] if actions else None
