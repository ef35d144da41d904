"""The agent loop: a model, a jail, the paper's three tools, until it submits or a limit ends it.

Every limit ends the run with a status, never an exception: ``submitted``, ``max_steps``,
``token_limit`` (the conversation outgrew ``max_token_limit``, checked before each call as the reference
does), ``time_limit``, ``format_errors`` (only with ``max_format_errors``: by default a reply without a
tool call is answered with a nudge, as the reference does), ``llm_error``, ``sandbox_error``. The
trajectory is saved after every step.

Runs in the host process that drives the model (the CLI's, a batch's worker thread, a Ray worker);
the model is anything with the ``ChatModel`` protocol, the jail is reached only through ``Tools`` (and
``read_answer``, which takes at most ``ANSWER_LIMIT`` bytes of the answer the jail leaves).
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from ..sandbox import Sandbox
from ..sandbox.errors import SandboxError, SandboxFileError
from . import text
from .llm import Completion, LLMError, parse_text_action
from .prompts import PromptConfig
from .schemas import TOOL_SCHEMAS
from .tools import ToolResult, Tools
from .trajectory import Action, ExecFacts, ExitStatus, Step, Trajectory

NO_TOOL_CALL = (
    "Your reply did not call a tool. Use execute_bash, str_replace_editor or submit (one function call per "
    "step). When the task is done, call submit."
)
CUT_OFF = (
    "Your reply was cut off at the token limit before it finished. Think less per step and call one tool "
    "with short arguments; write long files in several edits."
)
LAST_STEP = "This is your last step: write the answer to {output_dir}/answer.txt now and call submit."
ANSWER_LIMIT = 1 << 20
"""Bytes of ``answer.txt`` the host takes from the jail; a larger answer is refused, and the record says so."""
MAX_CALLS = 64
"""Tool calls of one reply that are run; each one past them is answered that it was not. Models make a few at
once; what one reply's calls may leave in the record (observations of up to ``observation_chars`` each) is
held to this many."""
NOT_RUN = "Not run: a reply may make at most {limit} tool calls, and this was call {n} of {total}. Make fewer at once."
MOST_CHARS_PER_TOKEN = 16
"""No tokenizer puts more characters than this in a token on average: the conversation counts at least its
characters (all of every message) over this, whatever a server says it counted. A server saying it counted one
token would otherwise grow the conversation, and the record rewritten after every step, without bound."""
TEXT_MODE_HELP = "Call a tool with one fenced block: ```<tool_name>\\n{{json arguments}}\\n```. Tools: {names}."


class ChatModel(Protocol):
    """What the loop needs of a model: one chat completion per step.

    ``LLMClient`` is one; so is any fake that answers ``complete`` (raising ``LLMError`` when it cannot).
    """

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        """The model's reply to ``messages``, offered ``tools`` (None in text mode)."""
        ...


class AgentConfig(BaseModel):
    max_steps: int = Field(100, ge=1)
    max_token_limit: int | None = Field(
        65536, ge=1, description="tokens the conversation may hold, counted before each call (the reference's)"
    )
    time_limit: float | None = Field(None, gt=0, description="seconds of wall time for the whole run")
    command_timeout: float = Field(120.0, gt=0)
    max_format_errors: int | None = Field(
        None, ge=1, description="end after this many consecutive replies without a usable tool call (None: nudge on)"
    )
    text_mode: bool = Field(False, description="parse one fenced action per reply instead of tool calls")
    observation_chars: int = Field(30_000, ge=1000)


class Agent:
    """``Agent(llm, sandbox, prompts).run(problem) -> Trajectory``."""

    def __init__(
        self,
        llm: ChatModel,
        sandbox: Sandbox,
        prompts: PromptConfig | None = None,
        config: AgentConfig | None = None,
        trajectory_path: Path | None = None,
        on_step: Callable[[Step], None] | None = None,
        describe: dict[str, Any] | None = None,
    ) -> None:
        self.llm = llm
        self.sandbox = sandbox
        self.prompts = prompts or PromptConfig()
        self.config = config or AgentConfig()
        self.path = trajectory_path
        self.on_step = on_step
        self.describe = describe or {}
        self.tools = Tools(sandbox, timeout=self.config.command_timeout, max_chars=self.config.observation_chars)
        self.tool_names = {schema["function"]["name"] for schema in TOOL_SCHEMAS}
        self.answer_file: bytes | None = None
        """``answer.txt`` as the run left it (at most ``ANSWER_LIMIT`` bytes), once ``run`` returns."""

    def run(self, problem: str) -> Trajectory:
        config = {"agent": self.config.model_dump(), "prompts": self.prompts.model_dump(), **self.describe}
        traj = Trajectory(problem_statement=problem, config=config)
        system = self.prompts.system()
        if self.config.text_mode:
            system += "\n\n" + TEXT_MODE_HELP.format(names=", ".join(sorted(self.tool_names)))
        traj.messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": self._remaining(self.prompts.instance(problem), 0)},
        ]
        traj.exit_status = self._loop(traj)
        self._answer(traj)
        traj.finished = time.time()
        self._save(traj)
        return traj

    def _loop(self, traj: Trajectory) -> ExitStatus:
        start = time.monotonic()
        format_errors = 0
        tools = None if self.config.text_mode else self.prompts.tool_schemas()
        counted = (0, 0)  # (messages, tokens) as the server counted them in its last reply
        for index in range(1, self.config.max_steps + 1):
            if self.config.time_limit is not None and time.monotonic() - start > self.config.time_limit:
                return "time_limit"
            size = conversation_tokens(traj.messages, counted)
            if self.config.max_token_limit is not None and size > self.config.max_token_limit:
                traj.error = (
                    f"the conversation holds about {size} tokens, over max_token_limit {self.config.max_token_limit}"
                )
                return "token_limit"
            try:
                completion = self.llm.complete(traj.messages, tools=tools)
            except LLMError as exc:
                traj.error = f"{type(exc).__name__}: {exc}"
                return "llm_error"
            message = completion.message
            traj.messages.append(message)
            if completion.usage.prompt_tokens:
                counted = (len(traj.messages), completion.usage.prompt_tokens + completion.usage.completion_tokens)
            step = Step(
                index=index,
                thought=message.get("content") or "",
                reasoning=message.get("reasoning_content") or message.get("reasoning") or "",
                finish_reason=completion.finish_reason,
                prompt_tokens=completion.usage.prompt_tokens,
                completion_tokens=completion.usage.completion_tokens,
                llm_seconds=completion.latency,
                calls_from_text=completion.calls_from_text,
            )
            traj.prompt_tokens += step.prompt_tokens
            traj.completion_tokens += step.completion_tokens
            traj.llm_seconds += step.llm_seconds
            try:
                submitted, usable = self._act(traj, step, message, index)
            except SandboxError as exc:
                traj.error = f"{type(exc).__name__}: {exc}"
                self._record(traj, step)
                return "sandbox_error"
            self._record(traj, step)
            if submitted:
                return "submitted"
            format_errors = 0 if usable else format_errors + 1
            if self.config.max_format_errors is not None and format_errors >= self.config.max_format_errors:
                return "format_errors"
        return "max_steps"

    def _act(self, traj: Trajectory, step: Step, message: dict[str, Any], index: int) -> tuple[bool, bool]:
        """Run the reply's tool calls; (submitted, the reply had a usable call)."""
        calls = self._calls(message, step)
        if not calls:
            note = step.note or (CUT_OFF if step.finish_reason == "length" else NO_TOOL_CALL)
            step.note = note
            traj.messages.append({"role": "user", "content": self._remaining(note, index)})
            return False, False
        submitted, usable = False, False
        for position, (call_id, name, arguments) in enumerate(calls):
            started = time.monotonic()
            if position < MAX_CALLS:
                result = self.tools.call(name, arguments)
            else:
                result = ToolResult(
                    observation=NOT_RUN.format(limit=MAX_CALLS, n=position + 1, total=len(calls)), error=True
                )
            step.sandbox_seconds += time.monotonic() - started
            step.actions.append(Action(function=name, parameters=_as_dict(arguments), tool_call_id=call_id))
            observation = result.observation
            if position == len(calls) - 1:
                observation = self._remaining(observation, index)
            step.observations.append(observation)
            step.exec.append(
                ExecFacts(
                    exit_code=result.exit_code,
                    timed_out=result.timed_out,
                    oom_killed=result.oom_killed,
                    wall_time=result.wall_time or 0.0,
                )
                if result.exit_code is not None or result.timed_out
                else None
            )
            if call_id is None:
                traj.messages.append({"role": "user", "content": f"Observation:\n{observation}"})
            else:
                traj.messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
            submitted = submitted or result.submitted
            usable = usable or not result.error
        traj.sandbox_seconds += step.sandbox_seconds
        return submitted, usable

    def _calls(self, message: dict[str, Any], step: Step) -> list[tuple[str | None, str, Any]]:
        """(tool_call_id, name, arguments) for every call in the reply; every id gets an answer."""
        if self.config.text_mode:
            try:
                action = parse_text_action(message.get("content") or "", self.tool_names)
            except ValueError as exc:
                step.note = f"Your action could not be read: {exc}"
                return []
            return [] if action is None else [(None, action[0], action[1])]
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            calls.append((call.get("id") or "", str(function.get("name") or ""), function.get("arguments") or "{}"))
        return calls

    def _remaining(self, text: str, index: int) -> str:
        left = self.config.max_steps - index
        if left == 1:
            return f"{text}\nSteps Remaining: 1. " + LAST_STEP.format(output_dir=self.prompts.output_dir)
        return f"{text}\nSteps Remaining: {left}"  # one newline, as the reference appends it

    def _answer(self, traj: Trajectory) -> None:
        self.answer_file, why = read_answer(self.sandbox, self.prompts.output_dir)
        if self.answer_file is not None:
            traj.answer = self.answer_file.decode(errors="replace").strip()
        if why is not None:
            traj.error = f"{traj.error}; {why}" if traj.error else why

    def _record(self, traj: Trajectory, step: Step) -> None:
        traj.steps.append(step)
        self._save(traj)
        if self.on_step is not None:
            self.on_step(step)

    def _save(self, traj: Trajectory) -> None:
        if self.path is not None:
            traj.save(self.path)


def conversation_tokens(messages: list[dict[str, Any]], counted: tuple[int, int] = (0, 0)) -> int:
    """The conversation's size in tokens, as the reference checks it before each call: what the server counted
    for the first ``counted[0]`` messages (its last reply's prompt and completion tokens), plus about one token
    per four characters for the messages after them (all of them when the server never said); never less than
    the whole conversation's characters over ``MOST_CHARS_PER_TOKEN``."""
    known, tokens = counted if 0 < counted[0] <= len(messages) else (0, 0)
    chars = 0
    for message in messages[known:]:
        content = message.get("content") or ""
        chars += len(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
        chars += len(str(message.get("reasoning_content") or message.get("reasoning") or ""))
        if message.get("tool_calls"):
            chars += len(json.dumps(message["tool_calls"], ensure_ascii=False))
    whole = sum(len(json.dumps(message, ensure_ascii=False)) for message in messages)
    return max(tokens + chars // 4, whole // MOST_CHARS_PER_TOKEN)


def read_answer(sb: Sandbox, output_dir: str) -> tuple[bytes | None, str | None]:
    """``output_dir/answer.txt`` through the jail's file API, a regular file of at most ``ANSWER_LIMIT`` bytes,
    and why there is none when it is larger (an absent or unreadable answer is just None)."""
    try:
        return sb.read_file(f"{output_dir}/answer.txt", max_bytes=ANSWER_LIMIT), None
    except SandboxFileError as exc:
        if exc.errno == errno.EFBIG:
            return None, f"answer.txt is larger than {ANSWER_LIMIT} bytes: cut, no answer taken"
        return None, None
    except SandboxError:
        return None, None


def _as_dict(arguments: Any) -> dict[str, Any]:
    """The call's arguments as the record keeps them: the object, or ``{"_raw": ...}`` when they are not one or
    nest deeper than the record can be written (the tool refused them, and said so to the model)."""
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser recurses
            parsed = None
    if isinstance(parsed, dict) and not text.nests_deeper(parsed, text.MAX_DEPTH):
        return parsed
    if isinstance(arguments, str):
        return {"_raw": arguments[:2000]}
    return {"_raw": f"arguments that are not a JSON object of at most {text.MAX_DEPTH} levels"}
