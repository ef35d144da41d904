"""Prompt configs: the reference package's YAML keys, and jailbox's own default prompts.

A config has ``system_prompt`` and ``instance_prompt`` templates with ``{working_dir}``,
``{input_dir}``, ``{output_dir}`` and ``{problem_statement}`` placeholders, plus the three
directories. The reference's files (``general.yaml``, ``benchmark_*.yaml``) load unchanged; keys
this loop does not use (``dataset``, ``split``, ``config``) are kept in ``extra``.

Runs in the host process. A config may come from anyone, so loading is bounded: at most
``MAX_BYTES`` are read, and YAML aliases are refused (a few hundred bytes of nested aliases expand
to gigabytes of nodes; no prompt needs them).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field
from yaml.composer import ComposerError

from .schemas import ANSWER_PATH, TOOL_SCHEMAS

MAX_BYTES = 1 << 20

DEFAULT_SYSTEM = """\
You are working on a Linux computer to solve a task. You have a shell and a file editor, and you
are expected to use them: write programs, run them, check their output, and fix what is wrong
before you answer.

Directories:
- {working_dir}: your working directory
- {input_dir}: files that come with the task, if any
- {output_dir}: put everything you produce here

How to work:
1. Read the task and look at {input_dir} if it mentions input files.
2. Compute the result with code you write to a file and run; do not guess or hard-code answers.
   Install packages or fetch data if the network allows and it helps.
3. Check the result with a second method or a test where you can.
4. Write the final answer to {output_dir}/answer.txt (just the answer), or the requested files
   to {output_dir}, then call submit.

Tools: execute_bash runs a shell command; str_replace_editor views, creates and edits files;
submit ends the task.
"""

DEFAULT_INSTANCE = """\
<task>
{problem_statement}
</task>

Working directory: {working_dir}
Input files (if any): {input_dir}
Output directory: {output_dir}
If the task asks for an answer, write only the answer to {output_dir}/answer.txt. Call submit when done.
"""


class PromptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    system_prompt: str = DEFAULT_SYSTEM
    instance_prompt: str = DEFAULT_INSTANCE
    working_dir: str = "/testbed"
    input_dir: str = "/testbed/input"
    output_dir: str = "/testbed/output"
    extra: dict[str, Any] = Field(default_factory=dict)

    def _values(self, problem: str) -> dict[str, str]:
        return {
            "working_dir": self.working_dir,
            "input_dir": self.input_dir,
            "output_dir": self.output_dir,
            "problem_statement": problem,
        }

    def system(self) -> str:
        return _fill(self.system_prompt, self._values(""))

    def instance(self, problem: str) -> str:
        return _fill(self.instance_prompt, self._values(problem))

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools as sent to the model, ``submit`` naming this config's answer file: a config whose
        ``output_dir`` is ``/testbed`` must not be told to write ``/testbed/output/answer.txt``."""
        answer = f"{self.output_dir.rstrip('/')}/answer.txt"
        schemas = copy.deepcopy(TOOL_SCHEMAS)
        for schema in schemas:
            function = schema["function"]
            function["description"] = function["description"].replace(ANSWER_PATH, answer)
        return schemas


def _fill(template: str, values: dict[str, str]) -> str:
    """``str.format`` semantics (``{{`` for a brace), but a stray ``{x}`` is left as it is."""

    class Keep(dict):
        def __missing__(self, key: str) -> str:
            return "{" + key + "}"

    try:
        return template.format_map(Keep(values))
    except (ValueError, IndexError, AttributeError):  # a lone brace: substitute the known names only
        for key, value in values.items():
            template = template.replace("{" + key + "}", value)
        return template


def load(path: str | Path | None) -> PromptConfig:
    """The default prompts, or a YAML file with the reference's keys."""
    if path is None:
        return PromptConfig()
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{path}: a prompt config is at most {MAX_BYTES} bytes (e.g. general.yaml is 2 KB)")
    try:
        data = yaml.load(raw, Loader=_NoAliasLoader)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply for a prompt config") from None
    except yaml.MarkedYAMLError as exc:
        where = f", line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise ValueError(f"{path}{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not a valid prompt config: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a prompt config is a YAML mapping")
    known = set(PromptConfig.model_fields) - {"extra"}
    return PromptConfig(
        **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
    )


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (``*name``, which ``<<`` merges need too)."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ComposerError(
                None, None, "aliases (*name) are not allowed in a prompt config; write the value out", mark
            )
        return super().compose_node(parent, index)
