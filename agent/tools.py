"""The three tools of LLM-in-Sandbox (``str_replace_editor``, ``execute_bash``, ``submit``) on a jailbox ``Sandbox``.

Names, JSON parameter schemas and their order match the reference package, so its prompts and models trained on
it carry over. ``str_replace_editor`` also accepts ``undo_edit`` (as in SWE-agent and OpenHands, whose editor the
reference copied). Where the reference broke, this does better, through the sandbox's public API only:

- Files move through the sandbox's file API as bytes, never through a command line, so there is no size limit
  (the reference broke past ~128 KB) and every byte outside an edit survives (CRLF, tabs, invalid UTF-8).
  ``view`` works on any text file, not only ``.py``; binary files are described, not dumped. Edits work on the
  bytes: ``old_str`` matches its UTF-8 encoding exactly, so a file that is not valid UTF-8 can still be edited
  (displayed with U+FFFD and a note) and nothing is normalised. Edits keep the file's permission bits.
- Observations are capped by characters, keeping head and tail, so one giant line cannot flood the context.
- A malformed call (bad JSON, unknown tool or command, missing or mistyped parameter, relative path) gives an
  error observation saying what was wrong and what is expected; it never raises. Failures of the sandbox
  itself (``SandboxClosed``, ``ProtocolError``) do propagate: the loop, not the model, must deal with those.
"""

from __future__ import annotations

import errno
import json
import posixpath
import signal
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..sandbox.errors import ExecError, SandboxFileError

if TYPE_CHECKING:
    from ..sandbox import ExecResult, Sandbox

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_CHARS = 30_000
MAX_FILE_BYTES = 64 << 20
HISTORY_DEPTH = 10
SNIPPET_LINES = 4
SNIFF_BYTES = 8192
MAX_LISTED_LINES = 20
ANSWER_PATH = "/testbed/output/answer.txt"
EDITOR_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]

_EDITOR_DESCRIPTION = """Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists \
non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists
* If a `command` generates a long output, its middle is elided and marked with `[... N characters elided ...]`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful \
of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to \
include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`
"""

_BASH_DESCRIPTION = """Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. For example: `python my_script.py`.
"""

_SUBMIT_DESCRIPTION = f"""A simple submit tool to finish tasks.

This tool signals completion of a task or submission of results. Write the final answer to {ANSWER_PATH} \
(and any other outputs to its directory) before calling it.
No parameters required - simply call to indicate task completion.
"""

STR_REPLACE_EDITOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": _EDITOR_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "description": "The command to run. Allowed options are: "
                    + ", ".join(f"`{c}`" for c in EDITOR_COMMANDS)
                    + ".",
                    "enum": EDITOR_COMMANDS,
                    "type": "string",
                },
                "path": {
                    "description": "Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.",
                    "type": "string",
                },
                "file_text": {
                    "description": "Required for the `create` command, contains the content of the file to be created.",
                    "type": "string",
                },
                "old_str": {
                    "description": "Required for the `str_replace` command, specifies the string in `path` to replace.",
                    "type": "string",
                },
                "new_str": {
                    "description": "Optional for the `str_replace` command to specify the replacement string. "
                    "Required for the `insert` command to specify the string to insert.",
                    "type": "string",
                },
                "insert_line": {
                    "description": "Required for the `insert` command. The `new_str` will be inserted AFTER the line "
                    "specified; 0 inserts at the top of the file.",
                    "type": "integer",
                },
                "view_range": {
                    "description": "Optional for the `view` command when `path` points to a file. Specifies the line "
                    "range to view. E.g., [11, 12] shows lines 11 and 12. Indexing starts at 1. Use [start_line, -1] "
                    "to show all lines from `start_line` to the end.",
                    "type": "array",
                    "items": {"type": "integer"},
                },
            },
            "required": ["command", "path"],
        },
    },
}

EXECUTE_BASH_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_bash",
        "description": _BASH_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The command (and optional arguments) to execute. "
                    "For example: 'python my_script.py'",
                }
            },
            "required": ["command"],
        },
    },
}

SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": _SUBMIT_DESCRIPTION,
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

TOOL_SCHEMAS: list[dict[str, Any]] = [STR_REPLACE_EDITOR_SCHEMA, EXECUTE_BASH_SCHEMA, SUBMIT_SCHEMA]
"""In the reference's order: chat templates render tools in the order given, so prompts stay the same."""

_PARAMETERS: dict[str, dict[str, Any]] = {s["function"]["name"]: s["function"]["parameters"] for s in TOOL_SCHEMAS}
_EXAMPLES = {
    "execute_bash": '{"command": "ls /testbed"}',
    "str_replace_editor": '{"command": "view", "path": "/testbed"}',
    "submit": "{}",
}
_EDITOR_REQUIRES = {
    "view": (),
    "create": ("file_text",),
    "str_replace": ("old_str",),
    "insert": ("insert_line", "new_str"),
    "undo_edit": (),
}
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
_VIEW_HINT = "; use view_range to see specific lines"
_CREATE_REVIEW = "Review the file and make sure that it is as expected. Edit the file if necessary."
_EDIT_REVIEW = "Review the changes and make sure they are as expected. Edit the file again if necessary."
_INSERT_REVIEW = (
    "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
    "Edit the file again if necessary."
)


class ToolResult(BaseModel):
    """What one tool call gave: the observation for the model, plus facts for the loop.

    ``error`` marks a malformed call or a tool that could not do its job (not a command that exited non-zero).
    ``exit_code``, ``timed_out``, ``oom_killed`` and ``wall_time`` are set when ``execute_bash`` ran a command
    (``oom_killed`` stays ``None`` where no cgroup counts OOM kills).
    """

    model_config = ConfigDict(frozen=True)

    observation: str
    submitted: bool = False
    error: bool = False
    exit_code: int | None = None
    timed_out: bool | None = None
    oom_killed: bool | None = None
    wall_time: float | None = None


class _ToolError(Exception):
    """A call the tool refuses; its message becomes an error observation."""


class Tools:
    """The LLM-in-Sandbox tools bound to one sandbox: ``Tools(sb).call(name, arguments)``.

    ``timeout`` bounds each ``execute_bash`` command (seconds); ``max_chars`` caps what an observation shows of
    command output or file content. The editor keeps the last ``HISTORY_DEPTH`` versions of each file it edited
    for ``undo_edit``.
    """

    def __init__(self, sb: Sandbox, timeout: float = DEFAULT_TIMEOUT, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, got {max_chars}")
        self.sb = sb
        self.timeout = timeout
        self.max_chars = max_chars
        self._history: dict[str, deque[bytes]] = {}
        self._tools: dict[str, Callable[[dict[str, Any]], ToolResult]] = {
            "execute_bash": self._execute_bash,
            "str_replace_editor": self._str_replace_editor,
            "submit": self._submit,
        }
        self._editor: dict[str, Callable[[str, dict[str, Any]], str]] = {
            "view": self._view,
            "create": self._create,
            "str_replace": self._str_replace,
            "insert": self._insert,
            "undo_edit": self._undo_edit,
        }

    def call(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> ToolResult:
        """Run tool ``name`` with ``arguments`` (a JSON object, as text from a tool call or already parsed)."""
        try:
            tool = self._tools.get(name)
            if tool is None:
                raise _ToolError(f"Unknown tool {name!r}. The available tools are: {', '.join(self._tools)}.")
            args = _parse_arguments(name, arguments)
            _check_arguments(name, args)
            return tool(args)
        except _ToolError as exc:
            return ToolResult(observation=f"Error: {exc}", error=True)

    # --- execute_bash -------------------------------------------------------------------------

    def _execute_bash(self, args: dict[str, Any]) -> ToolResult:
        command: str = args["command"]
        if not command.strip():
            raise _ToolError("`command` is empty. Pass the bash command to run, e.g. `ls /testbed`.")
        try:
            result = self.sb.exec(command, timeout=self.timeout)
        except ExecError as exc:
            raise _ToolError(f"The command could not be started: {exc}.") from None
        return ToolResult(
            observation=self._bash_observation(result),
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            wall_time=result.wall_time,
        )

    def _bash_observation(self, result: ExecResult) -> str:
        """A status line, then ``[STDOUT]`` and ``[STDERR]`` sections, each always present ("(empty)" if so)."""
        out_budget, err_budget = _share(len(result.stdout), len(result.stderr), self.max_chars)
        stdout = _clip(result.stdout, out_budget, _dropped_hint(result.stdout_dropped))
        stderr = _clip(result.stderr, err_budget, _dropped_hint(result.stderr_dropped))
        return f"{_status_line(result, self.timeout)}\n[STDOUT]\n{_body(stdout)}[STDERR]\n{_body(stderr)}"

    # --- submit -------------------------------------------------------------------------------

    def _submit(self, args: dict[str, Any]) -> ToolResult:
        return ToolResult(observation="Submitted: ", submitted=True)  # the reference's wording

    # --- str_replace_editor -------------------------------------------------------------------

    def _str_replace_editor(self, args: dict[str, Any]) -> ToolResult:
        command: str = args["command"]
        for name in _EDITOR_REQUIRES[command]:
            if name not in args:
                raise _ToolError(f"Parameter `{name}` is required for the `{command}` command.")
        path = self._absolute(args["path"])
        return ToolResult(observation=self._editor[command](path, args))

    def _absolute(self, path: str) -> str:
        """The normalised absolute path, or an error suggesting the absolute form of a relative one."""
        if "\0" in path:
            raise _ToolError("`path` contains a NUL byte.")
        if not path.startswith("/"):
            guess = _absolute_guess(path, self.sb.config.workdir)
            raise _ToolError(f"The path {path!r} is not an absolute path; it must start with `/`, e.g. {guess}.")
        return posixpath.normpath(path)

    def _view(self, path: str, args: dict[str, Any]) -> str:
        view_range = args.get("view_range")
        try:
            data = self.sb.read_file(path, max_bytes=MAX_FILE_BYTES)
        except SandboxFileError as exc:
            if exc.errno != errno.EISDIR:
                raise _ToolError(_file_error(path, exc)) from None
            if view_range is not None:
                raise _ToolError("`view_range` is not allowed when `path` is a directory.") from None
            return self._view_directory(path)
        return self._view_file(path, data, view_range)

    def _view_directory(self, path: str) -> str:
        """Non-hidden entries up to 2 levels deep; hidden names are pruned below ``path``, never ``path`` itself."""
        argv = ["find", path.rstrip("/") + "/", "-mindepth", "1", "-maxdepth", "2", "-name", ".*", "-prune", "-o"]
        result = self.sb.exec([*argv, "-print"], timeout=self.timeout)
        if result.exit_code != 0 and not result.stdout:
            raise _ToolError(f"Cannot list {path}: {result.stderr.strip() or f'find exited {result.exit_code}'}")
        listing = "".join(f"{entry}\n" for entry in sorted(result.stdout.splitlines()))
        hint = "; use execute_bash (ls, find) to list parts of it"
        header = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n"
        return header + _clip(f"{path}\n{listing}", self.max_chars, hint)

    def _view_file(self, path: str, data: bytes, view_range: list[int] | None) -> str:
        if _is_binary(data):
            return f"{_describe_binary(path, data)} It is not shown; inspect it with execute_bash (e.g. python3)."
        lines = _split_lines(_decode(data))
        start, stop = _line_range(view_range, len(lines))
        note = _utf8_note(path, data)
        if not lines:
            return f"{note}The file {path} is empty."
        body = _clip(_number(lines[start:stop], start + 1), self.max_chars, _VIEW_HINT)
        return f"{note}Here's the result of running `cat -n` on {path}:\n{body}\n"

    def _create(self, path: str, args: dict[str, Any]) -> str:
        data = _encode("file_text", args["file_text"])
        kind = self._existing(path)
        if kind is not None:
            raise _ToolError(
                f"{kind} already exists at {path}. Cannot overwrite it with `create`; edit it with `str_replace` "
                "or `insert`, or remove it with execute_bash first."
            )
        self._write(path, data, 0o644)
        listing = self._view_file(path, data, None)
        return f"File created at {path}. {listing}{_CREATE_REVIEW}"  # the reference's wording

    def _str_replace(self, path: str, args: dict[str, Any]) -> str:
        old = _encode("old_str", args["old_str"])
        new = _encode("new_str", args.get("new_str", ""))
        if not old:
            raise _ToolError("`old_str` is empty; it must be the exact text to replace.")
        data = self._read_text(path)
        count = data.count(old)
        if count == 0:
            raise _ToolError(_not_found(path, data, old))
        if count > 1:
            lines = ", ".join(str(n) for n in _occurrence_lines(data, old))
            more = ", ..." if count > MAX_LISTED_LINES else ""
            raise _ToolError(
                f"No replacement was performed: old_str occurs {count} times in {path}, starting at lines "
                f"{lines}{more}. Include more surrounding lines in old_str so that it matches exactly one place."
            )
        at = data.find(old)
        edited = data[:at] + new + data[at + len(old) :]
        self._edit(path, data, edited)
        first = data.count(b"\n", 0, at)
        return self._edited(path, edited, first, first + new.count(b"\n") + 1, _EDIT_REVIEW)

    def _insert(self, path: str, args: dict[str, Any]) -> str:
        new = _encode("new_str", args["new_str"])
        line: int = args["insert_line"]
        data = self._read_text(path)
        total = _count_lines(data)
        if not 0 <= line <= total:
            raise _ToolError(
                f"Invalid `insert_line` {line}: it must be within [0, {total}] "
                f"(0 inserts at the top, {total} after the last line)."
            )
        at = _line_end(data, line)
        edited = data[:at] + _insert_block(data, at, new) + data[at:]
        self._edit(path, data, edited)
        return self._edited(path, edited, line, line + max(1, _count_lines(new)), _INSERT_REVIEW)

    def _undo_edit(self, path: str, args: dict[str, Any]) -> str:
        history = self._history.get(path)
        if not history:
            raise _ToolError(f"No edit history found for {path}; only `str_replace` and `insert` edits can be undone.")
        self._write(path, history[-1], self._mode(path))
        history.pop()
        return f"Last edit to {path} undone successfully."

    # --- files --------------------------------------------------------------------------------

    def _existing(self, path: str) -> str | None:
        """What exists at ``path`` ("A file", "A directory") or None; reads at most one byte."""
        try:
            self.sb.read_file(path, max_bytes=0)
        except SandboxFileError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno == errno.EISDIR:
                return "A directory"
            if exc.errno not in (errno.EFBIG, errno.EINVAL):
                raise _ToolError(_file_error(path, exc)) from None
        return "A file"

    def _read_text(self, path: str) -> bytes:
        """The bytes of a text file the editor may change."""
        try:
            data = self.sb.read_file(path, max_bytes=MAX_FILE_BYTES)
        except SandboxFileError as exc:
            raise _ToolError(_file_error(path, exc)) from None
        if _is_binary(data):
            raise _ToolError(
                f"{_describe_binary(path, data)} str_replace_editor edits text files only; "
                "change it with execute_bash (e.g. python3)."
            )
        return data

    def _mode(self, path: str) -> int:
        """The file's permission bits, so an edit keeps an executable script executable."""
        result = self.sb.exec(["stat", "-L", "-c", "%a", path], timeout=self.timeout)
        try:
            return int(result.stdout.strip(), 8) if result.exit_code == 0 else 0o644
        except ValueError:
            return 0o644

    def _write(self, path: str, data: bytes, mode: int) -> None:
        try:
            self.sb.write_file(path, data, mode=mode)
        except SandboxFileError as exc:
            raise _ToolError(f"Cannot write {path}: {exc.strerror or exc}.") from None

    def _edit(self, path: str, before: bytes, after: bytes) -> None:
        """Write ``after`` and remember ``before`` for ``undo_edit``."""
        self._write(path, after, self._mode(path))
        self._history.setdefault(path, deque(maxlen=HISTORY_DEPTH)).append(before)

    def _edited(self, path: str, data: bytes, first: int, stop: int, review: str) -> str:
        """The edit's lines ``[first, stop)`` (0-based) with a few lines of context, numbered like ``cat -n``."""
        lines = _split_lines(_decode(data))
        start = max(0, first - SNIPPET_LINES)
        snippet = _clip(_number(lines[start : stop + SNIPPET_LINES], start + 1), self.max_chars, _VIEW_HINT)
        return (
            f"{_utf8_note(path, data)}The file {path} has been edited. "
            f"Here's the result of running `cat -n` on a snippet of {path}:\n{snippet}\n{review}"
        )


# --- arguments --------------------------------------------------------------------------------


def _parse_arguments(name: str, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A dict of the given arguments; ``null`` values count as absent, as some models send them for optionals."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise _ToolError(
                f"The arguments of `{name}` are not valid JSON ({exc}). Pass a JSON object, e.g. {_EXAMPLES[name]}."
            ) from None
    if not isinstance(arguments, Mapping):
        raise _ToolError(
            f"The arguments of `{name}` must be a JSON object, e.g. {_EXAMPLES[name]}, not {_json_type(arguments)}."
        )
    return {key: value for key, value in arguments.items() if value is not None}


def _check_arguments(name: str, args: dict[str, Any]) -> None:
    """Check ``args`` against the tool's JSON schema: known names, required ones present, right types."""
    schema = _PARAMETERS[name]
    properties: dict[str, Any] = schema["properties"]
    unknown = sorted(set(args) - set(properties))
    if unknown:
        expected = ", ".join(f"`{p}`" for p in properties) or "none"
        raise _ToolError(
            f"Unknown parameter(s) {', '.join(f'`{p}`' for p in unknown)} for `{name}`. Its parameters are: {expected}."
        )
    for required in schema["required"]:
        if required not in args:
            raise _ToolError(f"Missing required parameter `{required}` for `{name}`, e.g. {_EXAMPLES[name]}.")
    for key, value in args.items():
        _check_type(name, key, properties[key], value)


def _check_type(name: str, key: str, prop: dict[str, Any], value: Any) -> None:
    kind = prop["type"]
    ok = isinstance(value, _JSON_TYPES[kind]) and not isinstance(value, bool)
    if ok and kind == "array":
        ok = all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    if not ok:
        shown = _clip(json.dumps(value, default=repr), 200)
        raise _ToolError(f"Parameter `{key}` of `{name}` must be {_TYPE_WORDS[kind]}, got {_json_type(value)} {shown}.")
    if "enum" in prop and value not in prop["enum"]:
        allowed = ", ".join(f"`{c}`" for c in prop["enum"])
        raise _ToolError(f"Unknown {key} {value!r} for `{name}`. Allowed options are: {allowed}.")


def _absolute_guess(path: str, workdir: str) -> str:
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


def _encode(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _ToolError(
            f"`{name}` contains characters that cannot be encoded as UTF-8 (unpaired surrogates)."
        ) from None


# --- observations -----------------------------------------------------------------------------


def _clip(text: str, limit: int, hint: str = "") -> str:
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


def _share(out: int, err: int, limit: int) -> tuple[int, int]:
    """Split ``limit`` characters between stdout and stderr: a short stream leaves the rest to the other."""
    if out + err <= limit:
        return out, err
    half = limit // 2
    if err <= half:
        return limit - err, err
    if out <= half:
        return out, limit - out
    return limit - half, half


def _dropped_hint(dropped: int) -> str:
    return f"; the sandbox had already dropped {dropped} bytes of this stream" if dropped else ""


def _body(text: str) -> str:
    if not text:
        return "(empty)\n"
    return text if text.endswith("\n") else text + "\n"


def _status_line(result: ExecResult, timeout: float) -> str:
    if result.timed_out:
        return (
            f"The command timed out after {timeout:g} s and its process tree was killed. "
            "Run long jobs in the background (`nohup CMD > log 2>&1 &`) and check on them later."
        )
    if result.oom_killed:
        return f"The command was killed by the OOM killer: out of memory (exit code {result.exit_code})."
    if result.signal:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"Exit code: {result.exit_code} (killed by {name})"
    return f"Exit code: {result.exit_code}"


def _number(lines: list[str], first: int) -> str:
    """``cat -n`` style: the number right-aligned in 6 columns, a tab, the line."""
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, first))


def _line_range(view_range: list[int] | None, total: int) -> tuple[int, int]:
    """The 0-based slice for a 1-based inclusive ``view_range`` (end -1: to the end)."""
    if view_range is None:
        return 0, total
    if len(view_range) != 2:
        raise _ToolError(
            f"`view_range` must be two integers [start, end], e.g. [1, 40] or [100, -1]; got {view_range}."
        )
    start, end = view_range
    if total == 0:
        raise _ToolError("The file is empty; view it without `view_range`.")
    if not 1 <= start <= total:
        raise _ToolError(
            f"Invalid `view_range` {view_range}: start {start} must be within [1, {total}] "
            f"(the file has {total} lines)."
        )
    if end == -1:
        return start - 1, total
    if not start <= end <= total:
        raise _ToolError(
            f"Invalid `view_range` {view_range}: end {end} must be within [{start}, {total}], "
            "or -1 to view to the end of the file."
        )
    return start - 1, end


def _file_error(path: str, exc: SandboxFileError) -> str:
    if exc.errno == errno.ENOENT:
        return f"The path {path} does not exist. Please provide a valid path."
    if exc.errno == errno.EISDIR:
        return f"{path} is a directory; this command works on files."
    if exc.errno == errno.EFBIG:
        return (
            f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB, too large for the editor; "
            "use execute_bash (grep -n, sed -n 'START,ENDp', head, tail)."
        )
    if exc.errno == errno.EINVAL:
        return f"{path} is not a regular file."
    return f"Cannot access {path}: {exc.strerror or exc}."


def _not_found(path: str, data: bytes, old: bytes) -> str:
    message = (
        f"No replacement was performed: old_str did not appear verbatim in {path}. It must match exactly, "
        "including whitespace, indentation and line endings; view the file to copy the exact text."
    )
    if b"\r\n" in data and b"\n" in old and b"\r\n" not in old:
        message += " Note: the file has CRLF (\\r\\n) line endings, so old_str must contain the \\r characters."
    return message


def _occurrence_lines(data: bytes, needle: bytes) -> list[int]:
    """1-based line numbers where the first few non-overlapping occurrences of ``needle`` start."""
    lines: list[int] = []
    at = data.find(needle)
    while at >= 0 and len(lines) < MAX_LISTED_LINES:
        lines.append(data.count(b"\n", 0, at) + 1)
        at = data.find(needle, at + len(needle))
    return lines


# --- text and bytes ---------------------------------------------------------------------------


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _split_lines(text: str) -> list[str]:
    """Lines as ``cat -n`` counts them: split on "\\n" only, so "\\r" and tabs stay; no line after a final "\\n"."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _line_end(data: bytes, line: int) -> int:
    """The byte offset just after line ``line`` (1-based; 0 is the start of the file)."""
    at = 0
    for _ in range(line):
        newline = data.find(b"\n", at)
        if newline < 0:
            return len(data)
        at = newline + 1
    return at


def _insert_block(data: bytes, at: int, new: bytes) -> bytes:
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


def _is_binary(data: bytes) -> bool:
    """Known binary magic, a NUL byte, or mostly undecodable bytes in the first 8 KB."""
    sample = data[:SNIFF_BYTES]
    if _magic(data) is not None or b"\0" in sample:
        return True
    undecodable = sum("\udc80" <= ch <= "\udcff" for ch in sample.decode("utf-8", errors="surrogateescape"))
    return undecodable > 0.3 * len(sample)


def _magic(data: bytes) -> str | None:
    return next((kind for prefix, kind in _MAGIC if data.startswith(prefix)), None)


def _describe_binary(path: str, data: bytes) -> str:
    kind = _magic(data)
    return f"{path} is a binary file ({len(data)} bytes{f', {kind}' if kind else ''})."


def _utf8_note(path: str, data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return f"Note: {path} is not valid UTF-8; undecodable bytes are shown as \ufffd.\n"
    return ""
