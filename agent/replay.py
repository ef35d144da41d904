"""Re-run a recorded trajectory's actions in a fresh jail and say, step by step, what differs.

Runs in the host process of ``jailbox replay``; the jail runs the actions through the same ``Tools`` an agent
uses. It bounds what it keeps of each step's diff (``MAX_DIFF``) and of its action label (``MAX_LABEL``).

This checks that an environment reproduces a run (ours or the reference package's). Observations are compared
after normalisation: older formats differ in their wrappers (``Exit code: 0\\n[STDOUT]``, the reference's
``Execution output of \\[execute_bash]:``, ``(empty)``, ``(no output)``), so wrapper lines are dropped and
trailing blanks ignored, while the exit codes (in either spelling) are compared on their own. A command
recorded as its bare output (some of the paper's runs) is compared with all of its output lines, as such
a recording shows them, not with the first and last ``STREAM_LINES`` an observation keeps. A step that
differs is put in its own column when its command reaches the network (``network``), or when it differs
only in what no two runs share (``nondeterministic``: dates and times, the order of lines, as readdir gives
it, or of the items within a line, as a set's hash order gives it).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from ..sandbox import Sandbox, SandboxConfig
from . import inputs
from .tools import Tools
from .trajectory import load

Verdict = Literal["same", "differs", "network", "nondeterministic"]
VERDICTS: tuple[Verdict, ...] = ("same", "differs", "network", "nondeterministic")
MAX_DIFF = 4000
MAX_LABEL = 200
INPUT_DIR = "/testbed/input"
_EXIT = re.compile(r"^Exit code: (?:Error: Exit code )?(-?\d+)")
_WRAPPERS = re.compile(
    r"^(Exit code: .*|Execution output of \\?\[execute_bash\]:|\\?\[STDOUT\]|\\?\[STDERR\]|\(empty\)|\(no output\)"
    r"|Steps Remaining: .*)$"
)
_NETWORK = re.compile(
    r"\b(pip3? (install|download)|-m pip install|uv (pip )?(install|add|sync)|apt(-get)? (install|update)"
    r"|curl |wget |git (clone|fetch|pull)|npm (install|i )|conda install|apt-cache|ping )"
)
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_TIMES = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}([T ]\d{{2}}:\d{{2}}(:\d{{2}})?(\.\d+)?)?"
    rf"|\b({_MONTHS}) +\d{{1,2}}( +\d{{4}})?"
    r"|\b\d{1,2}:\d{2}(:\d{2})?(\.\d+)?\b"
)
_ITEMS = re.compile(r"[^\s,;{}\[\]()]+")


class StepDiff(BaseModel):
    index: int
    action: str
    verdict: Verdict
    exit_recorded: int | None = None
    exit_now: int | None = None
    diff: str = ""


def normalise(observation: str) -> list[str]:
    lines = [line.rstrip() for line in observation.replace("\r\n", "\n").split("\n")]
    kept = [line for line in lines if not _WRAPPERS.match(line)]
    while kept and not kept[-1]:
        kept.pop()
    while kept and not kept[0]:
        kept.pop(0)
    return kept


def exit_code(observation: str) -> int | None:
    """The exit code an observation reports ("Exit code: 1" or the reference's "Exit code: Error: Exit code 1")."""
    match = _EXIT.match(observation)
    return int(match.group(1)) if match else None


def nondeterministic(old: list[str], new: list[str]) -> bool:
    """Whether two observations differ only in times, in line order, or in the order of items within lines."""
    old = [_TIMES.sub("<time>", line) for line in old]
    new = [_TIMES.sub("<time>", line) for line in new]
    return old == new or _items(old) == _items(new)


def _items(lines: list[str]) -> Counter[str]:
    return Counter(item for line in lines for item in _ITEMS.findall(line))


def replay(
    path: str | Path, config: SandboxConfig | None = None, timeout: float = 120.0, input_dir: str | Path | None = None
) -> list[StepDiff]:
    """Each recorded action re-run, in order, in one fresh sandbox set up like the reference's /testbed
    (``input/`` holding a copy of ``input_dir`` if given, ``output/``, a git repository)."""
    trajectory = load(path)
    results: list[StepDiff] = []
    with Sandbox(config or SandboxConfig()) as sb:
        sb.exec(["mkdir", "-p", "/testbed/output"])
        if input_dir is not None:
            inputs.copy_dir(sb, Path(input_dir), INPUT_DIR)
        sb.exec(["mkdir", "-p", INPUT_DIR])
        sb.exec("cd /testbed && git init >/dev/null 2>&1 || true")
        tools = Tools(sb, timeout=timeout)
        every_line = Tools(sb, timeout=timeout, stream_lines=None)
        for step in trajectory.steps:
            for action, recorded in zip(step.actions, step.observations, strict=False):
                bare = action.function == "execute_bash" and exit_code(recorded) is None
                observation = (every_line if bare else tools).call(action.function, action.parameters).observation
                command = str(action.parameters.get("command", ""))
                label = f"{action.function} {command}".strip()
                results.append(_compare(step.index, label, action.function, command, recorded, observation))
    return results


def _compare(index: int, label: str, function: str, command: str, recorded: str, observation: str) -> StepDiff:
    old, new = normalise(recorded), normalise(observation)
    exit_recorded, exit_now = exit_code(recorded), exit_code(observation)
    exits_agree = exit_recorded is None or exit_recorded == exit_now  # some recordings give the output alone
    verdict: Verdict
    if old == new and exits_agree:
        verdict = "same"
    elif function == "execute_bash" and _NETWORK.search(command):
        verdict = "network"
    elif exits_agree and nondeterministic(old, new):
        verdict = "nondeterministic"
    else:
        verdict = "differs"
    diff = ""
    if verdict != "same":
        lines = difflib.unified_diff(old, new, "recorded", "now", n=1, lineterm="")
        codes = [] if exits_agree else [f"-exit code {exit_recorded}", f"+exit code {exit_now}"]
        diff = "\n".join([*codes, *lines])[:MAX_DIFF]
    return StepDiff(
        index=index,
        action=label[:MAX_LABEL],
        verdict=verdict,
        exit_recorded=exit_recorded,
        exit_now=exit_now,
        diff=diff,
    )
