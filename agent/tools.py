"""The three tools of LLM-in-Sandbox (``str_replace_editor``, ``execute_bash``, ``submit``) on a jailbox ``Sandbox``.

Runs in the host process that drives the agent. It bounds each command by ``timeout``, each observation by
``max_chars``, what the editor reads of a file by ``MAX_FILE_BYTES`` and its undo history by ``HISTORY_DEPTH``.
The schemas are data in ``agent.schemas``; the pure text work (argument checks, clipping) is ``agent.text``.

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
import posixpath
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..sandbox.errors import ExecError, SandboxFileError
from . import text
from .schemas import EDITOR_REQUIRES
from .text import MAX_LISTED_LINES, ToolError

if TYPE_CHECKING:
    from ..sandbox import ExecResult, Sandbox

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_CHARS = 30_000
MAX_FILE_BYTES = 64 << 20
HISTORY_DEPTH = 10
SNIPPET_LINES = 4
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
                raise ToolError(f"Unknown tool {name!r}. The available tools are: {', '.join(self._tools)}.")
            args = text.parse_arguments(name, arguments)
            text.check_arguments(name, args)
            return tool(args)
        except ToolError as exc:
            return ToolResult(observation=f"Error: {exc}", error=True)

    # --- execute_bash -------------------------------------------------------------------------

    def _execute_bash(self, args: dict[str, Any]) -> ToolResult:
        command: str = args["command"]
        if not command.strip():
            raise ToolError("`command` is empty. Pass the bash command to run, e.g. `ls /testbed`.")
        try:
            result = self.sb.exec(command, timeout=self.timeout)
        except ExecError as exc:
            raise ToolError(f"The command could not be started: {exc}.") from None
        return ToolResult(
            observation=self._bash_observation(result),
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            wall_time=result.wall_time,
        )

    def _bash_observation(self, result: ExecResult) -> str:
        """A status line, then ``[STDOUT]`` and ``[STDERR]`` sections, each always present ("(empty)" if so)."""
        out_budget, err_budget = text.share(len(result.stdout), len(result.stderr), self.max_chars)
        stdout = text.clip(result.stdout, out_budget, text.dropped_hint(result.stdout_dropped))
        stderr = text.clip(result.stderr, err_budget, text.dropped_hint(result.stderr_dropped))
        return f"{text.status_line(result, self.timeout)}\n[STDOUT]\n{text.body(stdout)}[STDERR]\n{text.body(stderr)}"

    # --- submit -------------------------------------------------------------------------------

    def _submit(self, args: dict[str, Any]) -> ToolResult:
        return ToolResult(observation="Submitted: ", submitted=True)  # the reference's wording

    # --- str_replace_editor -------------------------------------------------------------------

    def _str_replace_editor(self, args: dict[str, Any]) -> ToolResult:
        command: str = args["command"]
        for name in EDITOR_REQUIRES[command]:
            if name not in args:
                raise ToolError(f"Parameter `{name}` is required for the `{command}` command.")
        path = self._absolute(args["path"])
        return ToolResult(observation=self._editor[command](path, args))

    def _absolute(self, path: str) -> str:
        """The normalised absolute path, or an error suggesting the absolute form of a relative one."""
        if "\0" in path:
            raise ToolError("`path` contains a NUL byte.")
        if not path.startswith("/"):
            guess = text.absolute_guess(path, self.sb.config.workdir)
            raise ToolError(f"The path {path!r} is not an absolute path; it must start with `/`, e.g. {guess}.")
        return posixpath.normpath(path)

    def _view(self, path: str, args: dict[str, Any]) -> str:
        view_range = args.get("view_range")
        try:
            data = self.sb.read_file(path, max_bytes=MAX_FILE_BYTES)
        except SandboxFileError as exc:
            if exc.errno != errno.EISDIR:
                raise ToolError(_file_error(path, exc)) from None
            if view_range is not None:
                raise ToolError("`view_range` is not allowed when `path` is a directory.") from None
            return self._view_directory(path)
        return self._view_file(path, data, view_range)

    def _view_directory(self, path: str) -> str:
        """Non-hidden entries up to 2 levels deep; hidden names are pruned below ``path``, never ``path`` itself."""
        argv = ["find", path.rstrip("/") + "/", "-mindepth", "1", "-maxdepth", "2", "-name", ".*", "-prune", "-o"]
        result = self.sb.exec([*argv, "-print"], timeout=self.timeout)
        if result.exit_code != 0 and not result.stdout:
            raise ToolError(f"Cannot list {path}: {result.stderr.strip() or f'find exited {result.exit_code}'}")
        listing = "".join(f"{entry}\n" for entry in sorted(result.stdout.splitlines()))
        hint = "; use execute_bash (ls, find) to list parts of it"
        header = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n"
        return header + text.clip(f"{path}\n{listing}", self.max_chars, hint)

    def _view_file(self, path: str, data: bytes, view_range: list[int] | None) -> str:
        if text.is_binary(data):
            return f"{text.describe_binary(path, data)} It is not shown; inspect it with execute_bash (e.g. python3)."
        lines = text.split_lines(text.decode(data))
        start, stop = text.line_range(view_range, len(lines))
        note = text.utf8_note(path, data)
        if not lines:
            return f"{note}The file {path} is empty."
        body = text.clip(text.number(lines[start:stop], start + 1), self.max_chars, _VIEW_HINT)
        return f"{note}Here's the result of running `cat -n` on {path}:\n{body}\n"

    def _create(self, path: str, args: dict[str, Any]) -> str:
        data = text.encode("file_text", args["file_text"])
        kind = self._existing(path)
        if kind is not None:
            raise ToolError(
                f"{kind} already exists at {path}. Cannot overwrite it with `create`; edit it with `str_replace` "
                "or `insert`, or remove it with execute_bash first."
            )
        self._write(path, data, 0o644)
        listing = self._view_file(path, data, None)
        return f"File created at {path}. {listing}{_CREATE_REVIEW}"  # the reference's wording

    def _str_replace(self, path: str, args: dict[str, Any]) -> str:
        old = text.encode("old_str", args["old_str"])
        new = text.encode("new_str", args.get("new_str", ""))
        if not old:
            raise ToolError("`old_str` is empty; it must be the exact text to replace.")
        data = self._read_text(path)
        count = data.count(old)
        if count == 0:
            raise ToolError(text.not_found(path, data, old))
        if count > 1:
            lines = ", ".join(str(n) for n in text.occurrence_lines(data, old))
            more = ", ..." if count > MAX_LISTED_LINES else ""
            raise ToolError(
                f"No replacement was performed: old_str occurs {count} times in {path}, starting at lines "
                f"{lines}{more}. Include more surrounding lines in old_str so that it matches exactly one place."
            )
        at = data.find(old)
        edited = data[:at] + new + data[at + len(old) :]
        self._edit(path, data, edited)
        first = data.count(b"\n", 0, at)
        return self._edited(path, edited, first, first + new.count(b"\n") + 1, _EDIT_REVIEW)

    def _insert(self, path: str, args: dict[str, Any]) -> str:
        new = text.encode("new_str", args["new_str"])
        line: int = args["insert_line"]
        data = self._read_text(path)
        total = text.count_lines(data)
        if not 0 <= line <= total:
            raise ToolError(
                f"Invalid `insert_line` {line}: it must be within [0, {total}] "
                f"(0 inserts at the top, {total} after the last line)."
            )
        at = text.line_end(data, line)
        edited = data[:at] + text.insert_block(data, at, new) + data[at:]
        self._edit(path, data, edited)
        return self._edited(path, edited, line, line + max(1, text.count_lines(new)), _INSERT_REVIEW)

    def _undo_edit(self, path: str, args: dict[str, Any]) -> str:
        history = self._history.get(path)
        if not history:
            raise ToolError(f"No edit history found for {path}; only `str_replace` and `insert` edits can be undone.")
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
                raise ToolError(_file_error(path, exc)) from None
        return "A file"

    def _read_text(self, path: str) -> bytes:
        """The bytes of a text file the editor may change."""
        try:
            data = self.sb.read_file(path, max_bytes=MAX_FILE_BYTES)
        except SandboxFileError as exc:
            raise ToolError(_file_error(path, exc)) from None
        if text.is_binary(data):
            raise ToolError(
                f"{text.describe_binary(path, data)} str_replace_editor edits text files only; "
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
            raise ToolError(f"Cannot write {path}: {exc.strerror or exc}.") from None

    def _edit(self, path: str, before: bytes, after: bytes) -> None:
        """Write ``after`` and remember ``before`` for ``undo_edit``."""
        self._write(path, after, self._mode(path))
        self._history.setdefault(path, deque(maxlen=HISTORY_DEPTH)).append(before)

    def _edited(self, path: str, data: bytes, first: int, stop: int, review: str) -> str:
        """The edit's lines ``[first, stop)`` (0-based) with a few lines of context, numbered like ``cat -n``."""
        lines = text.split_lines(text.decode(data))
        start = max(0, first - SNIPPET_LINES)
        snippet = text.clip(text.number(lines[start : stop + SNIPPET_LINES], start + 1), self.max_chars, _VIEW_HINT)
        return (
            f"{text.utf8_note(path, data)}The file {path} has been edited. "
            f"Here's the result of running `cat -n` on a snippet of {path}:\n{snippet}\n{review}"
        )


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
