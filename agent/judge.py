"""The ``judge`` scorer: a model over any OpenAI-compatible endpoint says whether an answer is correct.

The reference scores its physics and long-context benchmarks this way, in a second step after the run: the
judge sees the question, the official answer and the candidate, is asked for CORRECT or INCORRECT, and the
last of those two words in its reply decides (neither: 0.0). It asks several times (four by default) and the
score is the mean, so a judge sampled at temperature 0.7 scores more steadily. jailbox does the same as the
batch records each result; the prompt is jailbox's own wording of the same question.

Runs where a batch scores (the driver). Each request goes through ``LLMClient``, so it is retried and backed
off as the agent's own calls are; the reply is bounded by ``max_tokens`` and only its last ``REPLY_CHARS`` are
read. A judge that cannot be reached raises ``JudgeError`` (the batch records it as the task's error).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..sandbox.errors import AgentError
from .llm import LLMClient, LLMConfig, LLMError

REPLY_CHARS = 1 << 16  # a reply within the judge's 16384 tokens fits
_VERDICT = re.compile(r"INCORRECT|CORRECT")

PROMPT = """\
Decide whether the CANDIDATE ANSWER below is CORRECT or INCORRECT. It is correct when it agrees with the
OFFICIAL ANSWER; the question is shown only as context.

Question: {question}
OFFICIAL ANSWER: {expected}
CANDIDATE ANSWER: {answer}

Answer with one word: CORRECT or INCORRECT."""


class JudgeError(AgentError, RuntimeError):
    """The judge could not be asked or gave no usable reply."""


class JudgeConfig(BaseModel):
    """The judge model, and how many times each answer is judged (the score is the mean of the verdicts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    llm: LLMConfig
    repeats: int = Field(default=4, ge=1, le=32)


def verdict(reply: str) -> bool | None:
    """True for CORRECT, False for INCORRECT, by the last of the two words (any case); None for neither."""
    found = _VERDICT.findall(reply[-REPLY_CHARS:].upper())
    return None if not found else found[-1] == "CORRECT"


class Judge:
    """A scorer ``(answer, expected, question="") -> float`` that asks the configured judge model."""

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config

    def __call__(self, answer: str, expected: str, question: str = "") -> float:
        _, _, after = answer.partition("</think>")  # a reasoning model's thinking is not its answer
        prompt = PROMPT.format(question=question, expected=expected, answer=(after or answer).strip())
        verdicts = []
        with LLMClient(self.config.llm) as client:
            for _ in range(self.config.repeats):
                try:
                    completion = client.complete([{"role": "user", "content": prompt}])
                except LLMError as exc:
                    raise JudgeError(f"the judge at {self.config.llm.base_url}: {exc}") from None
                content = completion.message.get("content")
                verdicts.append(verdict(content) if isinstance(content, str) else None)
        return sum(v is True for v in verdicts) / len(verdicts)


def from_flags(
    model: str | None, base_url: str | None, api_key: str | None, repeats: int, bounds: Mapping[str, Any] | None = None
) -> JudgeConfig | None:
    """The judge ``jailbox bench``'s ``--judge-*`` flags name, None without ``--judge-model``. The sampling is the
    reference judge's (temperature 0.7, at most 16384 tokens a reply); ``bounds`` are ``LLMConfig`` fields it
    shares with the model's endpoint (how large a reply, how long a request)."""
    if model is None:
        if base_url is not None or api_key is not None:
            raise ValueError("--judge-base-url and --judge-api-key need --judge-model, e.g. --judge-model qwen3-235b")
        return None
    fields: dict[str, Any] = {"model": model, "temperature": 0.7, "max_tokens": 16384, **(bounds or {})}
    if base_url is not None:
        fields["base_url"] = base_url
    if api_key is not None:
        fields["api_key"] = api_key
    return JudgeConfig(llm=LLMConfig(**fields), repeats=repeats)


def unconfigured(answer: str, expected: str) -> float:
    """Stands for ``judge`` when no judge model is set, so a task naming it is refused before anything runs."""
    raise JudgeError(NO_JUDGE)


NO_JUDGE = (
    "scorer 'judge' needs a judge model: pass --judge-model NAME --judge-base-url URL "
    "(e.g. --judge-model qwen3-235b --judge-base-url http://localhost:9991/v1)"
)
