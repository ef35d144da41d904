"""Re-run a recorded trajectory's actions in a fresh jail and say, step by step, what differs.

Runs in the host process of ``jailbox replay``; the jail runs the actions through the same ``Tools`` an agent
uses. It bounds what it keeps of each step's diff (``MAX_DIFF``), of what the step printed now
(``MAX_OBSERVATION``, for a viewer to show beside the recorded one) and of its action label (``MAX_LABEL``).

This checks that an environment reproduces a run (ours or the reference package's). Observations are compared
after normalisation: older formats differ in their wrappers (``Exit code: 0\\n[STDOUT]``, the reference's
``Execution output of \\[execute_bash]:``, ``(empty)``, ``(no output)``), so wrapper lines are dropped and
trailing blanks ignored, while the exit codes (in either spelling) are compared on their own. A command
recorded as its bare output (some of the paper's runs) is compared with all of its output lines, as such
a recording shows them (stdout then stderr, no section between them), not with the first and last
``STREAM_LINES`` an observation keeps. A step that differs is put in its own column when its command
reaches the network, or when what differs names something the network brought (``network``: a package
or file an earlier step fetched, a package the run installed, whose release today is not the recorded
one), or when it differs only in what no two runs share (``nondeterministic``: dates and times, the
order of lines, as readdir gives it, or of the items within a line, as a set's hash order gives it;
and what a run cannot repeat by design: the output of a script that orders strings by a set's hash, and
the numbers of a video x264 encoded, whose bytes follow the encoder's thread count, so the machine's
CPUs). Each such step says why, in ``cause``.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from ..sandbox import ExecResult, Sandbox, SandboxConfig
from . import inputs, text
from .tools import Tools
from .trajectory import load

Verdict = Literal["same", "differs", "network", "nondeterministic"]
VERDICTS: tuple[Verdict, ...] = ("same", "differs", "network", "nondeterministic")
MAX_DIFF = 4000
MAX_OBSERVATION = 16000
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
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
_ADDRESS = re.compile(r"\b0x[0-9a-f]{6,}\b")
# what a network step brings: the packages an installer was named, the files a download wrote
_INSTALL = re.compile(r"\b(?:pip3?|-m pip|uv pip|uv|apt-get|apt|conda|npm)\s+(?:install|add|download)\s+([^;&|><\n]*)")
_DOWNLOAD = re.compile(r"(?:curl|wget)\b[^;&|\n]*?\s-(?:o|O|-output|-output-document)[ =]?\s*(\S+)")
_CLONE = re.compile(r"\bgit clone\s+(?:-\S+\s+)*\S*?([\w.-]+?)(?:\.git)?/?(?:\s|$)")
# pip's and apt's lines that show a command reached the network whatever ran it (a script's pip, say)
_FETCHED = re.compile(
    r"^(?:Collecting ([A-Za-z0-9][\w.-]*)(?:\[[^\]\n]*\])?(?:[<>=!~][^\n]*| \([^\n]*)?"
    r"|\s*Downloading (?:\S*/)?([A-Za-z0-9][\w.]*)-\S+\.(?:whl|tar\.gz|zip)\b[^\n]*"
    r"|Successfully installed ((?:[\w.]+-[\w.+!]+ ?)+)"
    r"|Get:\d+ https?://\S+[^\n]*)$",
    re.MULTILINE,
)
_PACKAGE_FILE = re.compile(r"/(?:site|dist)-packages/([A-Za-z0-9_]+)")
_SPEC = re.compile(r"[\[<>=!~;@: ].*")
# a distribution's import name where it is not the distribution's own name
_IMPORTED_AS = {
    "pillow": "PIL",
    "rdkit-pypi": "rdkit",
    "opencv-python": "cv2",
    "opencv-python-headless": "cv2",
    "scikit-learn": "sklearn",
    "scikit-image": "skimage",
    "beautifulsoup4": "bs4",
    "pyyaml": "yaml",
    "python-docx": "docx",
    "python-pptx": "pptx",
}
# a script whose output no two runs share: strings taken in a set's hash order (PYTHONHASHSEED is random
# per process), or a video x264 encodes (its bytes follow its thread count: the machine's CPUs)
_HASH_ORDER = re.compile(r"\b(?:list|sorted\(list|tuple)\(set\(|random\.(?:sample|choice|shuffle)\([^)]*set\(")
_ENCODES = re.compile(r"libx264|write_videofile|ffmpeg\b.*-c(?::v)? ")
_RUNS = re.compile(r"\bpython3?\s+(?:-\S+\s+)*([\w./-]+\.py)\b")
SITE_PACKAGES = "ls -1 /usr/local/lib/python3*/site-packages /usr/lib/python3/dist-packages 2>/dev/null"


class StepDiff(BaseModel):
    index: int
    action: str
    verdict: Verdict
    exit_recorded: int | None = None
    exit_now: int | None = None
    diff: str = ""
    cause: str = ""  # why a step that is not "same" is in its column, in a few words
    observation: str = ""  # what the step printed now, its middle cut past MAX_OBSERVATION characters


class _Bare(Tools):
    """The tools a recording of a command's bare output is replayed with: the output alone, stdout then
    stderr, every line, with colour escapes and carriage returns dropped (what such a recording shows:
    apt's and pip's progress lines ran together)."""

    def _bash_observation(self, result: ExecResult) -> str:
        return text.stream(result.stdout, None) + text.stream(result.stderr, None)


class _Fetched:
    """What the network brought during a replay: names (lower case) -> the step that brought them."""

    def __init__(self, installed: set[str]) -> None:
        self.installed = installed  # the packages the tree had before the first step
        self.names: dict[str, int] = {}

    def add(self, index: int, command: str, observations: tuple[str, ...]) -> None:
        found: list[str] = []
        for args in _INSTALL.findall(command):
            found += [_SPEC.sub("", a) for a in args.split() if not a.startswith("-") and "/" not in a]
        found += [Path(f).name for f in _DOWNLOAD.findall(command)] + _CLONE.findall(command)
        for observation in observations:
            for collecting, downloading, installed in _FETCHED.findall(observation):
                found += [collecting, downloading, *(word.rsplit("-", 1)[0] for word in installed.split())]
        for name in filter(None, found):
            aliases = {name.lower(), name.lower().replace("-", "_"), _IMPORTED_AS.get(name.lower(), name).lower()}
            if aliases & self.installed:  # the tree had it: the installer had nothing to fetch
                continue
            for alias in aliases:
                if len(alias) > 2:
                    self.names.setdefault(alias, index)

    def named_in(self, changed: list[str]) -> str:
        """The cause, if the changed lines name something the network brought; else ""."""
        joined = "\n".join(changed)
        for name, index in self.names.items():
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", joined, re.IGNORECASE):
                return f"{name}, which step {index} fetched"
        for package in _PACKAGE_FILE.findall(joined):
            if package.lower() not in self.installed:
                return f"{package}, installed during the run (today's release)"
        return ""


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
    old, new = _timed(old), _timed(new)
    return old == new or _items(old) == _items(new)


def _items(lines: list[str]) -> Counter[str]:
    return Counter(item for line in lines for item in _ITEMS.findall(line))


class _Scripts:
    """The text of each file the editor wrote during the replay, to tell what running it can repeat."""

    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        self.encoded: int | None = None  # the last step that ran an x264 encode (what the files hold now)

    def edit(self, parameters: dict[str, Any]) -> None:
        path, command = str(parameters.get("path", "")), parameters.get("command")
        if command == "create":
            self.text[path] = str(parameters.get("file_text", ""))
        elif command == "str_replace" and path in self.text:
            old, new = str(parameters.get("old_str", "")), str(parameters.get("new_str", ""))
            self.text[path] = self.text[path].replace(old, new, 1)

    def ran(self, index: int, command: str) -> str:
        """The text of the command and of every script it runs (by name, from the directory it runs in)."""
        texts = [command] + [t for p, t in self.text.items() for name in _RUNS.findall(command) if p.endswith(name)]
        text = "\n".join(texts)
        if _ENCODES.search(text):
            self.encoded = index
        return text


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
        fetched = _Fetched({name.lower() for name in sb.exec(SITE_PACKAGES).stdout.split()})
        tools = Tools(sb, timeout=timeout)
        bare_tools = _Bare(sb, timeout=timeout, stream_lines=None)
        scripts = _Scripts()
        for step in trajectory.steps:
            for action, recorded in zip(step.actions, step.observations, strict=False):
                bare = action.function == "execute_bash" and exit_code(recorded) is None
                now = (bare_tools if bare else tools).call(action.function, action.parameters)
                command = str(action.parameters.get("command", ""))
                label = f"{action.function} {command}".strip()
                exit_now = now.exit_code if bare else exit_code(now.observation)
                result = _compare(
                    step.index, label, action.function, command, recorded, now.observation, exit_now, fetched
                )
                if action.function == "str_replace_editor":
                    scripts.edit(action.parameters)
                elif result.verdict == "differs":
                    result = _unrepeatable(result, scripts.ran(step.index, command), scripts.encoded)
                else:
                    scripts.ran(step.index, command)
                result.observation = _kept(now.observation)
                results.append(result)
                if action.function == "execute_bash":
                    fetched.add(step.index, command, () if result.verdict == "same" else (recorded, now.observation))
    return results


def _kept(observation: str) -> str:
    if len(observation) <= MAX_OBSERVATION:
        return observation
    half, cut = MAX_OBSERVATION // 2, len(observation) - MAX_OBSERVATION
    return f"{observation[:half]}\n[... {cut} characters cut by replay ...]\n{observation[-half:]}"


def _compare(
    index: int,
    label: str,
    function: str,
    command: str,
    recorded: str,
    observation: str,
    exit_now: int | None,
    fetched: _Fetched,
) -> StepDiff:
    old, new = normalise(recorded), normalise(observation)
    exit_recorded = exit_code(recorded)
    exits_agree = exit_recorded is None or exit_recorded == exit_now  # some recordings give the output alone
    lines = list(difflib.unified_diff(old, new, "recorded", "now", n=1, lineterm=""))
    changed = [line[1:] for line in lines[2:] if line[:1] in "+-"]
    verdict: Verdict
    cause = ""
    if old == new and exits_agree:
        verdict = "same"
    elif function == "execute_bash" and _NETWORK.search(command):
        verdict, cause = "network", "the command reaches the network"
    elif function == "execute_bash" and (_FETCHED.search(recorded) or _FETCHED.search(observation)):
        verdict, cause = "network", "the command installs from the network"
    elif exits_agree and _spaced(old) == _spaced(new):
        verdict, cause = "differs", "spacing only (column widths: what else the listing holds)"
    elif exits_agree and nondeterministic(old, new):
        verdict, cause = "nondeterministic", _varying(old, new)
    elif named := fetched.named_in(changed):
        verdict, cause = "network", f"uses {named}"
    else:
        verdict = "differs"
        if not exits_agree:
            cause = "the exit code" + (" and the output" if old != new else "")
        elif _numbers(old) == _numbers(new):
            cause = "numbers only (sizes, counts, measurements" + (", times)" if _timed(old) != old else ")")
        else:
            cause = "the output"
    diff = ""
    if verdict != "same":
        codes = [] if exits_agree else [f"-exit code {exit_recorded}", f"+exit code {exit_now}"]
        diff = "\n".join([*codes, *lines])[:MAX_DIFF]
    return StepDiff(
        index=index,
        action=label[:MAX_LABEL],
        verdict=verdict,
        exit_recorded=exit_recorded,
        exit_now=exit_now,
        diff=diff,
        cause=cause,
    )


def _unrepeatable(result: StepDiff, ran: str, encoded: int | None) -> StepDiff:
    """``result`` as nondeterministic where what it ran cannot give the same output twice: a set's hash
    order, or the numbers of a video x264 encoded (at ``encoded``, this step or an earlier one)."""
    if _HASH_ORDER.search(ran) and result.exit_recorded == result.exit_now:
        cause = "the script takes strings in a set's hash order (PYTHONHASHSEED is random per run)"
    elif encoded is not None and result.cause.startswith("numbers only"):
        cause = f"numbers of the video step {encoded} encoded (x264's bytes follow its thread count: the CPUs)"
    else:
        return result
    return result.model_copy(update={"verdict": "nondeterministic", "cause": cause})


def _timed(lines: list[str]) -> list[str]:
    return [_TIMES.sub("<time>", line) for line in lines]


def _numbers(lines: list[str]) -> list[str]:
    """The lines with times, numbers and memory addresses (ASLR's) as placeholders, blanks as one space."""
    return [_NUMBERS.sub("<n>", _ADDRESS.sub("<address>", line)) for line in _spaced(_timed(lines))]


def _spaced(lines: list[str]) -> list[str]:
    """The lines with every run of blanks as one space."""
    return [" ".join(line.split()) for line in lines]


def _varying(old: list[str], new: list[str]) -> str:
    """What a nondeterministic step varies in."""
    timed_old, timed_new = _timed(old), _timed(new)
    if timed_old == timed_new:
        return "dates and times"
    times = " and times" if timed_old != old or timed_new != new else ""
    if sorted(timed_old) == sorted(timed_new):
        return "line order (as readdir gives it)" + times
    return "the order of items in a line (as a set's hash order gives it)" + times
