"""Pure text for the tools: argument parsing and checking, the observations' formats, and line and byte arithmetic.

Runs in whichever host process calls the tools, with no I/O and no sandbox, so every function here is
tested without a jail. The formats are the reference package's, byte for byte (models trained in its
sandbox learned them): the editor numbers ``text.split("\\n")`` with tabs expanded and cuts a listing
after ``VIEW_CHARS`` characters with a ``<response clipped>`` line; a command's observation has an exit
code line, a header and its streams, each cut to ``STREAM_LINES`` first and last lines. What it bounds:
an observation's length (those cuts, and ``clip``, which keeps head and tail within a character limit
that ``share`` splits between stdout and stderr), how much of a file is sniffed for binary content
(``SNIFF_BYTES``) and how many matching lines an error lists (``MAX_LISTED_LINES``).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..sandbox.errors import AgentError
from .schemas import EXAMPLES

if TYPE_CHECKING:
    from ..sandbox import ExecResult

SNIFF_BYTES = 8192
MAX_LISTED_LINES = 20
VIEW_CHARS = 10_000
CLIPPED = "\n<response clipped>"
STREAM_LINES = 40
MAX_DEPTH = 64
"""Levels of arrays and objects a model's reply, and the arguments of a call in it, may nest. The tools' arguments
take two (an array of integers) and a chat completion about eight; the record cannot be written past about 250
(pydantic's serialiser refuses) and ``json.loads`` raises RecursionError past about 1000."""
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m|\r")  # colour codes and carriage returns, as the reference strips them
_TRUNCATED = "-" * 50 + "\n<Observation truncated in middle for saving context>\n" + "-" * 50
_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "array": list}
_TYPE_WORDS = {"string": "a string", "integer": "an integer", "array": "an array of integers"}
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF8", "GIF image"),
    (b"%PDF-", "PDF document"),
    (b"PK\x03\x04", "Zip archive (or docx, xlsx, jar, wheel)"),
    (b"\x1f\x8b", "gzip compressed data"),
    (b"BZh", "bzip2 compressed data"),
    (b"\xfd7zXZ\x00", "xz compressed data"),
    (b"\x7fELF", "ELF executable or library"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"\x93NUMPY", "NumPy array"),
)


class ToolError(AgentError):
    """A call a tool refuses; its message becomes an error observation."""


# --- arguments --------------------------------------------------------------------------------


def parse_arguments(name: str, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A dict of the given arguments; ``null`` values count as absent, as some models send them for optionals."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except RecursionError:  # no ValueError: nested deeper than the parser recurses
            raise ToolError(
                f"The arguments of `{name}` nest deeper than {MAX_DEPTH} levels. Pass a JSON object, "
                f"e.g. {EXAMPLES[name]}."
            ) from None
        except json.JSONDecodeError as exc:
            raise ToolError(
                f"The arguments of `{name}` are not valid JSON ({exc}). Pass a JSON object, e.g. {EXAMPLES[name]}."
            ) from None
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"The arguments of `{name}` must be a JSON object, e.g. {EXAMPLES[name]}, not {_json_type(arguments)}."
        )
    for key, value in arguments.items():
        if nests_deeper(value, MAX_DEPTH - 1):
            raise ToolError(
                f"Parameter `{key}` of `{name}` nests deeper than {MAX_DEPTH} levels. Pass e.g. {EXAMPLES[name]}."
            )
    return {key: value for key, value in arguments.items() if value is not None}


def nests_deeper(value: Any, levels: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists and dicts more than ``levels`` deep: walked depth first with a stack of
    iterators, not recursion, so any depth the parser made is measured, holding one iterator a level."""
    iterators: list[Iterator[Any]] = [iter((value,))]
    while iterators:
        for item in iterators[-1]:
            children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else None
            if children is not None:
                if len(iterators) > levels:
                    return True
                iterators.append(iter(children))
                break
        else:
            iterators.pop()
    return False


def check_arguments(name: str, args: dict[str, Any], schema: dict[str, Any]) -> None:
    """Check ``args`` against the tool's JSON parameter ``schema``: known names, required ones present, right types."""
    properties: dict[str, Any] = schema["properties"]
    unknown = sorted(set(args) - set(properties))
    if unknown:
        expected = ", ".join(f"`{p}`" for p in properties) or "none"
        raise ToolError(
            f"Unknown parameter(s) {', '.join(f'`{p}`' for p in unknown)} for `{name}`. Its parameters are: {expected}."
        )
    for required in schema["required"]:
        if required not in args:
            raise ToolError(f"Missing required parameter `{required}` for `{name}`, e.g. {EXAMPLES[name]}.")
    for key, value in args.items():
        _check_type(name, key, properties[key], value)


def _check_type(name: str, key: str, prop: dict[str, Any], value: Any) -> None:
    kind = prop["type"]
    ok = isinstance(value, _JSON_TYPES[kind]) and not isinstance(value, bool)
    if ok and kind == "array":
        ok = all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    if not ok:
        shown = clip(json.dumps(value, default=repr), 200)
        raise ToolError(f"Parameter `{key}` of `{name}` must be {_TYPE_WORDS[kind]}, got {_json_type(value)} {shown}.")
    if "enum" in prop and value not in prop["enum"]:
        allowed = ", ".join(f"`{c}`" for c in prop["enum"])
        raise ToolError(f"Unknown {key} {value!r} for `{name}`. Allowed options are: {allowed}.")


def absolute_guess(path: str, workdir: str) -> str:
    """What a relative path probably meant: "testbed/x" is /testbed/x, "x" is x in the working directory."""
    rooted = posixpath.normpath("/" + path)
    if rooted == workdir or rooted.startswith(workdir.rstrip("/") + "/"):
        return rooted
    return posixpath.normpath(posixpath.join(workdir, path))


def _json_type(value: Any) -> str:
    names = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "an array"))
    for python_type, word in names:
        if isinstance(value, python_type):
            return word
    return "an object" if isinstance(value, Mapping) else "null"


def encode(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(
            f"`{name}` contains characters that cannot be encoded as UTF-8 (unpaired surrogates)."
        ) from None


# --- observations -----------------------------------------------------------------------------


def clip(text: str, limit: int, hint: str = "") -> str:
    """``text`` cut to about ``limit`` characters, keeping head and tail (at line ends where one is near)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    newline = text.rfind("\n", half // 2, half)
    head_end = newline + 1 if newline >= 0 else half
    tail_from = len(text) - (limit - half)
    newline = text.find("\n", tail_from, tail_from + (limit - half) // 2)
    tail_start = newline + 1 if newline >= 0 else tail_from
    head = text[:head_end]
    gap = "" if head.endswith("\n") or not head else "\n"
    return f"{head}{gap}[... {tail_start - head_end} characters elided{hint} ...]\n{text[tail_start:]}"


def share(out: int, err: int, limit: int) -> tuple[int, int]:
    """Split ``limit`` characters between stdout and stderr: a short stream leaves the rest to the other."""
    if out + err <= limit:
        return out, err
    half = limit // 2
    if err <= half:
        return limit - err, err
    if out <= half:
        return out, limit - out
    return limit - half, half


def dropped_hint(dropped: int) -> str:
    return f"; the sandbox had already dropped {dropped} bytes of this stream" if dropped else ""


def clip_view(text: str, limit: int = VIEW_CHARS) -> str:
    """The editor's cut: the first ``limit`` characters, then a ``<response clipped>`` line."""
    return text if len(text) <= limit else text[:limit] + CLIPPED


def listing(text: str, what: str, first: int, limit: int = VIEW_CHARS) -> str:
    """``text`` cut, tabs expanded and numbered from ``first``, under the reference's `cat -n` header."""
    lines = clip_view(text, limit).expandtabs().split("\n")
    return f"Here's the result of running `cat -n` on {what}:\n{number(lines, first)}\n"


def view_lines(text: str) -> list[str]:
    """A file's lines as the editor shows them: tabs expanded, and a final newline makes a last, empty line."""
    return text.expandtabs().split("\n")


def number(lines: list[str], first: int) -> str:
    """The number right-aligned in 6 columns, a tab, the line."""
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, first))


def exit_text(result: ExecResult) -> str:
    """The reference's exit code field: "0", else "Error: Exit code N" (128 + the signal for a killed command)."""
    code = 128 + result.signal if result.signal else result.exit_code
    return "0" if code == 0 else f"Error: Exit code {code}"


def stream(text: str, keep: int | None = STREAM_LINES) -> str:
    """One stream as the reference shows it: escapes and "\\r" dropped, and past twice ``keep`` lines
    only the first and last ``keep`` (``None``: every line)."""
    text = _ESCAPES.sub("", text)
    lines = text.splitlines()
    if keep is not None and len(lines) > 2 * keep:
        return "\n".join([*lines[:keep], _TRUNCATED, *lines[-keep:]])
    return text


def bash_observation(exit_field: str, stdout: str, stderr: str) -> str:
    """Exit code line, header, ``\\[STDOUT]`` (or "(no output)"), and ``\\[STDERR]`` only when it has text.

    The backslashes are the reference's (it escaped the brackets for its console); models learned them.
    """
    parts = [f"Exit code: {exit_field}", "Execution output of \\[execute_bash]:"]
    parts.append(f"\\[STDOUT]\n{stdout}" if stdout.strip() else "\\[STDOUT]\n(no output)")
    if stderr.strip():
        parts.append(f"\\[STDERR]\n{stderr}")
    return "\n".join(parts)


def timeout_text(timeout: float) -> str:
    return (
        f"The command timed out after {timeout:g} s and its process tree was killed. "
        "Run long jobs in the background (`nohup CMD > log 2>&1 &`) and check on them later."
    )


def line_range(view_range: list[int] | None, total: int) -> tuple[int, int]:
    """The 0-based slice for a 1-based inclusive ``view_range`` (end -1: to the end)."""
    if view_range is None:
        return 0, total
    if len(view_range) != 2:
        raise ToolError(f"`view_range` must be two integers [start, end], e.g. [1, 40] or [100, -1]; got {view_range}.")
    start, end = view_range
    if total == 0:
        raise ToolError("The file is empty; view it without `view_range`.")
    if not 1 <= start <= total:
        raise ToolError(
            f"Invalid `view_range` {view_range}: start {start} must be within [1, {total}] "
            f"(the file has {total} lines)."
        )
    if end == -1:
        return start - 1, total
    if not start <= end <= total:
        raise ToolError(
            f"Invalid `view_range` {view_range}: end {end} must be within [{start}, {total}], "
            "or -1 to view to the end of the file."
        )
    return start - 1, end


def not_found(path: str, data: bytes, old: bytes) -> str:
    message = (
        f"No replacement was performed: old_str did not appear verbatim in {path}. It must match exactly, "
        "including whitespace, indentation and line endings; view the file to copy the exact text."
    )
    if b"\r\n" in data and b"\n" in old and b"\r\n" not in old:
        message += " Note: the file has CRLF (\\r\\n) line endings, so old_str must contain the \\r characters."
    return message


def occurrence_lines(data: bytes, needle: bytes) -> list[int]:
    """1-based line numbers where the first few non-overlapping occurrences of ``needle`` start."""
    lines: list[int] = []
    at = data.find(needle)
    while at >= 0 and len(lines) < MAX_LISTED_LINES:
        lines.append(data.count(b"\n", 0, at) + 1)
        at = data.find(needle, at + len(needle))
    return lines


# --- text and bytes ---------------------------------------------------------------------------


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def line_end(data: bytes, line: int) -> int:
    """The byte offset just after line ``line`` (1-based; 0 is the start of the file)."""
    at = 0
    for _ in range(line):
        newline = data.find(b"\n", at)
        if newline < 0:
            return len(data)
        at = newline + 1
    return at


def insert_block(data: bytes, at: int, new: bytes) -> bytes:
    """``new`` as whole lines at offset ``at``, terminated with the file's own line ending where needed.

    Appending after a last line without a newline first ends that line; the inserted text gets a line ending
    unless it has one or it becomes the file's new unterminated last line.
    """
    eol = b"\r\n" if _uses_crlf(data) else b"\n"
    unterminated_end = at == len(data) and bool(data) and not data.endswith(b"\n")
    prefix = eol if unterminated_end else b""
    suffix = b"" if new.endswith(b"\n") or unterminated_end else eol
    return prefix + new + suffix


def _uses_crlf(data: bytes) -> bool:
    newline = data.find(b"\n")
    return newline > 0 and data[newline - 1 : newline] == b"\r"


def is_binary(data: bytes) -> bool:
    """Known binary magic, a NUL byte, or mostly undecodable bytes in the first 8 KB."""
    sample = data[:SNIFF_BYTES]
    if _magic(data) is not None or b"\0" in sample:
        return True
    undecodable = sum("\udc80" <= ch <= "\udcff" for ch in sample.decode("utf-8", errors="surrogateescape"))
    return undecodable > 0.3 * len(sample)


def _magic(data: bytes) -> str | None:
    return next((kind for prefix, kind in _MAGIC if data.startswith(prefix)), None)


def describe_binary(path: str, data: bytes) -> str:
    kind = _magic(data)
    return f"{path} is a binary file ({len(data)} bytes{f', {kind}' if kind else ''})."


def utf8_note(path: str, data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return f"Note: {path} is not valid UTF-8; undecodable bytes are shown as \ufffd.\n"
    return ""
