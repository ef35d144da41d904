"""The three tools of LLM-in-Sandbox (``str_replace_editor``, ``execute_bash``, ``submit``) on a jailbox ``Sandbox``.

Runs in the host process that drives the agent. It bounds each command by ``timeout``, each observation by
``max_chars`` (an editor listing by ``text.VIEW_CHARS`` as well), what the editor reads of a file by
``MAX_FILE_BYTES``, a directory listing by ``MAX_LISTED_ENTRIES`` and the undo history by ``HISTORY_DEPTH``.
The schemas are data in ``agent.schemas``; the pure text work (argument checks, formats) is ``agent.text``.

Names, JSON parameter schemas, their order and the observations' formats match the reference package, so its
prompts and models trained on it carry over: ``create`` writes the text and a final newline (replacing a file
already there), views number ``split("\\n")`` with tabs expanded, a directory is listed in ``find``'s order,
commands run as ``bash -c`` (errors read ``bash: line 1: ...``). ``undo_edit`` (as in SWE-agent and OpenHands,
whose editor the reference copied) is there with ``undo=True`` only. Where the reference broke, this does
better, through the sandbox's public API only:

- Files move through the sandbox's file API as bytes, never through a command line, so there is no size limit
  (the reference broke past ~128 KB) and every byte outside an edit survives (CRLF, tabs, invalid UTF-8).
  ``view`` works on any text file, not only ``.py``; binary files are described, not dumped. Edits work on the
  bytes: ``old_str`` matches its UTF-8 encoding exactly, so a file that is not valid UTF-8 can still be edited
  (displayed with U+FFFD and a note) and nothing is normalised. Edits keep the file's permission bits.
- ``str_replace`` and ``insert`` keep the file's bytes (the reference stripped "\\r" and added a newline at each
  edit); a command's streams are capped by characters too, keeping head and tail, so one giant line cannot
  flood the context.
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
from .schemas import EDITOR_REQUIRES, UNDO, parameters, tool_schemas
from .text import MAX_LISTED_LINES, ToolError

if TYPE_CHECKING:
    from ..sandbox import ExecResult, Sandbox

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_CHARS = 30_000
MAX_FILE_BYTES = 64 << 20
HISTORY_DEPTH = 10
SNIPPET_LINES = 4
MAX_LISTED_ENTRIES = 100
_AS_BASH = 'exec -a bash /bin/bash -c "$1"'  # argv[0] "bash", as the reference's `bash -c` has
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
    command output or file content; of a longer stream only the first and last ``stream_lines`` lines are shown
    (``None``: all, within ``max_chars``). ``undo=True`` adds ``undo_edit`` (offer ``schemas`` to the model
    then): the editor keeps the last ``HISTORY_DEPTH`` versions of each file it changed.
    """

    def __init__(
        self,
        sb: Sandbox,
        timeout: float = DEFAULT_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        undo: bool = False,
        stream_lines: int | None = text.STREAM_LINES,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, got {max_chars}")
        self.sb = sb
        self.timeout = timeout
        self.max_chars = max_chars
        self.stream_lines = stream_lines
        self.schemas = tool_schemas(undo)
        self._parameters = parameters(self.schemas)
        self._view_chars = min(max_chars, text.VIEW_CHARS)
        self._bash: bool | None = None
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
        }
        if undo:
            self._editor[UNDO] = self._undo_edit

    def call(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> ToolResult:
        """Run tool ``name`` with ``arguments`` (a JSON object, as text from a tool call or already parsed)."""
        try:
            tool = self._tools.get(name)
            if tool is None:
                raise ToolError(f"Unknown tool {name!r}. The available tools are: {', '.join(self._tools)}.")
            args = text.parse_arguments(name, arguments)
            text.check_arguments(name, args, self._parameters[name])
            return tool(args)
        except ToolError as exc:
            return ToolResult(observation=f"Error: {exc}", error=True)

    # --- execute_bash -------------------------------------------------------------------------

    def _execute_bash(self, args: dict[str, Any]) -> ToolResult:
        command: str = args["command"]
        if not command.strip():
            raise ToolError("`command` is empty. Pass the bash command to run, e.g. `ls /testbed`.")
        try:
            result = self.sb.exec(self._shell(command), timeout=self.timeout)
        except ExecError as exc:
            raise ToolError(f"The command could not be started: {exc}.") from None
        return ToolResult(
            observation=self._bash_observation(result),
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            wall_time=result.wall_time,
        )

    def _shell(self, command: str) -> list[str] | str:
        """``command`` for bash named "bash" (what error messages start with), or for /bin/sh where bash is not."""
        if self._bash is None:
            try:
                self._bash = self._existing("/bin/bash") == "A file"
            except ToolError:  # unreadable: the jail's own business; its commands get /bin/sh
                self._bash = False
        return ["/bin/bash", "-c", _AS_BASH, "bash", command] if self._bash else command

    def _bash_observation(self, result: ExecResult) -> str:
        """The reference's layout; a timeout says so in place of the output, an OOM kill in the stderr section."""
        stdout, stderr = text.stream(result.stdout, self.stream_lines), text.stream(result.stderr, self.stream_lines)
        out_budget, err_budget = text.share(len(stdout), len(stderr), self.max_chars)
        stdout = text.clip(stdout, out_budget, text.dropped_hint(result.stdout_dropped))  # one giant line
        stderr = text.clip(stderr, err_budget, text.dropped_hint(result.stderr_dropped))
        if result.timed_out:
            return text.bash_observation("-1", text.timeout_text(self.timeout), "")
        if result.oom_killed:
            stderr += f"{chr(10) if stderr else ''}The command was killed by the OOM killer: out of memory."
        return text.bash_observation(text.exit_text(result), stdout, stderr)

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
        """``path``, then its non-hidden entries up to 2 levels deep in ``find``'s order, at most
        ``MAX_LISTED_ENTRIES`` lines; hidden names are pruned below ``path``, never ``path`` itself."""
        argv = ["find", path.rstrip("/") + "/", "-mindepth", "1", "-maxdepth", "2", "-name", ".*", "-prune", "-o"]
        result = self.sb.exec([*argv, "-print"], timeout=self.timeout)
        if result.exit_code != 0 and not result.stdout:
            raise ToolError(f"Cannot list {path}: {result.stderr.strip() or f'find exited {result.exit_code}'}")
        entries = [path, *result.stdout.splitlines()][:MAX_LISTED_ENTRIES]
        hint = "; use execute_bash (ls, find) to list parts of it"
        header = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n"
        return header + text.clip("".join(f"{entry}\n" for entry in entries), self.max_chars, hint)

    def _view_file(self, path: str, data: bytes, view_range: list[int] | None) -> str:
        if text.is_binary(data):
            return f"{text.describe_binary(path, data)} It is not shown; inspect it with execute_bash (e.g. python3)."
        note = text.utf8_note(path, data)
        if not data:
            return f"{note}The file {path} is empty."
        lines = text.view_lines(text.decode(data))
        start, stop = text.line_range(view_range, len(lines))
        numbered = text.number(lines[start:stop], start + 1)
        return note + text.clip_view(f"Here's the result of running `cat -n` on {path}:\n{numbered}", self._view_chars)

    def _create(self, path: str, args: dict[str, Any]) -> str:
        """The text and a final newline (as the reference's ``echo``), over any file there (keeping its mode)."""
        file_text: str = args["file_text"]
        data = text.encode("file_text", file_text + "\n")
        kind = self._existing(path)
        if kind == "A directory":
            raise ToolError(f"{path} is a directory; `create` writes files. Pick a file path, e.g. {path}/new.py.")
        if kind is None:
            self._write(path, data, 0o644)
        else:
            self._edit(path, self._read_text(path) if UNDO in self._editor else b"", data)
        listing = text.listing(file_text, path, 1, self._view_chars)
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
        stop = first + SNIPPET_LINES + new.count(b"\n") + 1
        return self._edited(path, edited, first, stop, f"a snippet of {path}", _EDIT_REVIEW)

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
        stop = line + len(new.split(b"\n")) + SNIPPET_LINES
        return self._edited(path, edited, line, stop, "a snippet of the edited file", _INSERT_REVIEW)

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
        """Write ``after`` (keeping the file's mode) and, with ``undo_edit`` on, remember ``before``."""
        self._write(path, after, self._mode(path))
        if UNDO in self._editor:
            self._history.setdefault(path, deque(maxlen=HISTORY_DEPTH)).append(before)

    def _edited(self, path: str, data: bytes, first: int, stop: int, what: str, review: str) -> str:
        """Lines ``[first - SNIPPET_LINES, stop)`` (0-based) of the edited file, as the reference shows them."""
        start = max(0, first - SNIPPET_LINES)
        snippet = "\n".join(text.view_lines(text.decode(data))[start:stop])
        listing = text.listing(snippet, what, start + 1, self._view_chars)
        return f"{text.utf8_note(path, data)}The file {path} has been edited. {listing}{review}"


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
