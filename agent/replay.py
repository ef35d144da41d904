"""Re-run a recorded trajectory's actions in a fresh jail and say, step by step, what differs.

This checks that an environment reproduces a run (ours or the reference package's). Observations
are compared after normalisation: the wrappers differ between versions of the reference
(``Exit code: 0\\nExecution output of \\[execute_bash]:\\n\\[STDOUT]``, or the bare output, or
``(no output)``) and ours, so wrapper lines are dropped and trailing blanks ignored; the content
must match. Steps whose command reaches the network are reported separately.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from ..sandbox import Sandbox, SandboxConfig
from .tools import Tools
from .trajectory import load

Verdict = Literal["same", "differs", "network"]
_WRAPPERS = re.compile(
    r"^(Exit code: .*|Execution output of \\?\[execute_bash\]:|\\?\[STDOUT\]|\\?\[STDERR\]|\(empty\)|\(no output\)"
    r"|Steps Remaining: .*)$"
)
_NETWORK = re.compile(r"\b(pip3? install|apt(-get)? (install|update)|curl |wget |git clone|npm install|conda install)")


class StepDiff(BaseModel):
    index: int
    action: str
    verdict: Verdict
    diff: str = ""


def normalise(observation: str) -> list[str]:
    lines = [line.rstrip() for line in observation.replace("\r\n", "\n").split("\n")]
    kept = [line for line in lines if not _WRAPPERS.match(line)]
    while kept and not kept[-1]:
        kept.pop()
    while kept and not kept[0]:
        kept.pop(0)
    return kept


def replay(path: str | Path, config: SandboxConfig | None = None, timeout: float = 120.0) -> list[StepDiff]:
    trajectory = load(path)
    results: list[StepDiff] = []
    with Sandbox(config or SandboxConfig()) as sb:
        sb.exec(["mkdir", "-p", "/testbed/output", "/testbed/input"])
        tools = Tools(sb, timeout=timeout)
        for step in trajectory.steps:
            for action, recorded in zip(step.actions, step.observations, strict=False):
                observation = tools.call(action.function, action.parameters).observation
                command = str(action.parameters.get("command", ""))
                label = f"{action.function} {command}".strip()
                old, new = normalise(recorded), normalise(observation)
                if old == new:
                    verdict: Verdict = "same"
                elif action.function == "execute_bash" and _NETWORK.search(command):
                    verdict = "network"
                else:
                    verdict = "differs"
                diff = (
                    ""
                    if verdict == "same"
                    else "\n".join(difflib.unified_diff(old, new, "recorded", "now", n=1, lineterm=""))
                )
                results.append(StepDiff(index=step.index, action=label[:200], verdict=verdict, diff=diff[:4000]))
    return results
