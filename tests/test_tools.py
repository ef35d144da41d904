"""The LLM-in-Sandbox tools against real sandboxes: schemas, execute_bash, the editor, submit, malformed calls."""

from __future__ import annotations

import json

import pytest

from jailbox.agent.schemas import TOOL_SCHEMAS
from jailbox.agent.tools import ToolResult, Tools
from jailbox.sandbox import Sandbox
from jailbox.sandbox.config import Limits

HEADER = "Execution output of \\[execute_bash]:\n"


def out(stdout: str, stderr: str = "", code: str = "0") -> str:
    """The reference's observation of a command."""
    sections = f"\\[STDOUT]\n{stdout or '(no output)'}" + (f"\n\\[STDERR]\n{stderr}" if stderr else "")
    return f"Exit code: {code}\n{HEADER}{sections}"


@pytest.fixture
def tools(sb):
    return Tools(sb)


def editor(tools: Tools, **args) -> ToolResult:
    return tools.call("str_replace_editor", args)


def bash(tools: Tools, command: str) -> ToolResult:
    return tools.call("execute_bash", {"command": command})


def numbered(lines: list[str], first: int = 1) -> str:
    return "".join(f"{n:6}\t{line}\n" for n, line in enumerate(lines, first))


def view_of(path: str, lines: list[str], first: int = 1) -> str:
    """A file view as the reference prints it: no newline after the last numbered line."""
    return f"Here's the result of running `cat -n` on {path}:\n" + numbered(lines, first).removesuffix("\n")


# --- schemas ----------------------------------------------------------------------------------


def test_schemas_have_the_reference_names_order_and_parameters():
    assert [s["type"] for s in TOOL_SCHEMAS] == ["function"] * 3
    functions = [s["function"] for s in TOOL_SCHEMAS]
    assert [f["name"] for f in functions] == ["str_replace_editor", "execute_bash", "submit"]
    editor_params, bash_params, submit_params = (f["parameters"] for f in functions)
    assert editor_params["required"] == ["command", "path"]
    properties = editor_params["properties"]
    assert list(properties) == ["command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"]
    assert properties["command"]["enum"] == ["view", "create", "str_replace", "insert"], "undo_edit is opt-in"
    assert {name: p["type"] for name, p in properties.items()} == {
        "command": "string",
        "path": "string",
        "file_text": "string",
        "old_str": "string",
        "new_str": "string",
        "insert_line": "integer",
        "view_range": "array",
    }
    assert properties["view_range"]["items"] == {"type": "integer"}
    assert bash_params["required"] == ["command"]
    assert bash_params["properties"]["command"]["type"] == "string"
    assert submit_params == {"type": "object", "properties": {}, "required": []}
    assert json.loads(json.dumps(TOOL_SCHEMAS)) == TOOL_SCHEMAS
    assert "replacing any file already at `path`" in functions[0]["description"]
    assert "undo_edit" not in json.dumps(TOOL_SCHEMAS)
    assert "/testbed/output/answer.txt" in functions[2]["description"]


# --- execute_bash -----------------------------------------------------------------------------


def test_bash_reports_exit_code_and_both_streams(tools):
    result = tools.call("execute_bash", '{"command": "echo hi; echo oops >&2; exit 3"}')
    assert result.observation == out("hi\n", "oops\n", "Error: Exit code 3")
    assert (result.exit_code, result.timed_out, result.error, result.submitted) == (3, False, False, False)
    assert result.wall_time is not None


def test_bash_writes_no_output_for_an_empty_stdout_and_runs_in_testbed(tools):
    assert bash(tools, "true").observation == f"Exit code: 0\n{HEADER}\\[STDOUT]\n(no output)"
    assert bash(tools, "pwd").observation == f"Exit code: 0\n{HEADER}\\[STDOUT]\n/testbed\n"


def test_bash_caps_a_giant_single_line_keeping_head_and_tail(tools):
    result = bash(tools, "python3 -c \"print('x'*200000)\"")
    stdout = "x" * 15000 + "\n[... 170001 characters elided ...]\n" + "x" * 14999 + "\n"
    assert result.observation == out(stdout)


def test_bash_caps_each_stream_and_shares_the_budget(sb):
    tools = Tools(sb, max_chars=1000)
    both = bash(tools, "python3 -c \"import sys; print('o'*5000, end=''); print('e'*5000, end='', file=sys.stderr)\"")
    stdout = "o" * 250 + "\n[... 4500 characters elided ...]\n" + "o" * 250
    stderr = "e" * 250 + "\n[... 4500 characters elided ...]\n" + "e" * 250
    assert both.observation == out(stdout, stderr)
    short_stderr = bash(tools, "python3 -c \"print('o'*5000, end='')\"; echo warn >&2")
    stdout = "o" * 497 + "\n[... 4005 characters elided ...]\n" + "o" * 498
    assert short_stderr.observation == out(stdout, "warn\n")


def test_bash_cap_cuts_many_long_lines_at_line_ends(sb):
    result = bash(Tools(sb, max_chars=200), "seq 1000001 1000080")
    stdout = result.observation.removeprefix(f"Exit code: 0\n{HEADER}\\[STDOUT]\n")
    head, rest = stdout.split("[... ", 1)
    marker, tail = rest.split(" ...]\n", 1)
    head_numbers = [int(n) for n in head.splitlines()]
    tail_numbers = [int(n) for n in tail.splitlines()]
    assert head_numbers == list(range(1000001, 1000001 + len(head_numbers)))
    assert tail_numbers == list(range(1000081 - len(tail_numbers), 1000081))
    elided = sum(len(f"{n}\n") for n in range(1000001 + len(head_numbers), 1000081 - len(tail_numbers)))
    assert marker == f"{elided} characters elided"
    assert len(head) + len(tail) <= 200


def test_bash_notes_bytes_the_sandbox_already_dropped():
    with Sandbox(output_limit=4096) as box:
        result = bash(Tools(box, max_chars=1000), "python3 -c \"print('x'*100000)\"")
    assert "characters elided; the sandbox had already dropped 95905 bytes of this stream ...]" in result.observation


def test_bash_timeout_kills_the_command_and_says_so(sb):
    tools = Tools(sb, timeout=1)
    result = bash(tools, "echo started; sleep 10")
    assert result.timed_out is True
    assert result.error is False
    assert result.observation == out(
        "The command timed out after 1 s and its process tree was killed. Run long jobs in the background "
        "(`nohup CMD > log 2>&1 &`) and check on them later.",
        code="-1",
    )
    assert bash(tools, "echo alive").observation == out("alive\n")


def test_bash_reports_a_killing_signal_as_bash_does(tools):
    result = bash(tools, "kill -SEGV $$")
    assert result.observation == out("", code="Error: Exit code 139")
    assert result.exit_code == 139


@pytest.mark.cgroup
def test_bash_reports_the_oom_killer():
    with Sandbox(limits=Limits(memory="64M")) as box:
        result = bash(Tools(box), "python3 -c 'x = bytearray(512 << 20)'")
    assert result.oom_killed is True
    assert result.observation.startswith("Exit code: Error: Exit code 137\n")
    assert result.observation.endswith("\\[STDERR]\nThe command was killed by the OOM killer: out of memory.")


def test_bash_rejects_an_empty_command_and_a_nul_byte(tools):
    assert bash(tools, "  ").observation == (
        "Error: `command` is empty. Pass the bash command to run, e.g. `ls /testbed`."
    )
    result = bash(tools, "echo a\0b")
    assert result.error is True
    assert result.observation == "Error: The command could not be started: command contains a NUL byte."


def test_tools_refuse_nonsense_limits(sb):
    with pytest.raises(ValueError, match="timeout must be positive"):
        Tools(sb, timeout=0)
    with pytest.raises(ValueError, match="max_chars must be at least 1"):
        Tools(sb, max_chars=0)


# --- submit -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", ["", "{}", None, {}])
def test_submit_signals_completion(tools, arguments):
    result = tools.call("submit", arguments)
    assert (result.observation, result.submitted, result.error) == ("Submitted: ", True, False)
    assert result.exit_code is None


# --- malformed calls --------------------------------------------------------------------------


def test_bad_json_arguments(tools):
    result = tools.call("execute_bash", '{"command": "ls')
    assert result.error is True
    assert result.observation.startswith("Error: The arguments of `execute_bash` are not valid JSON (")
    assert result.observation.endswith('Pass a JSON object, e.g. {"command": "ls /testbed"}.')


def test_arguments_that_are_not_an_object(tools):
    assert tools.call("execute_bash", '["ls"]').observation == (
        'Error: The arguments of `execute_bash` must be a JSON object, e.g. {"command": "ls /testbed"}, not an array.'
    )


def test_unknown_tool(tools):
    result = tools.call("bash", {"command": "ls"})
    assert result.error is True
    assert result.observation == (
        "Error: Unknown tool 'bash'. The available tools are: execute_bash, str_replace_editor, submit."
    )


def test_missing_parameters(tools):
    assert tools.call("execute_bash", "{}").observation == (
        'Error: Missing required parameter `command` for `execute_bash`, e.g. {"command": "ls /testbed"}.'
    )
    assert editor(tools, command="view").observation == (
        "Error: Missing required parameter `path` for `str_replace_editor`, "
        'e.g. {"command": "view", "path": "/testbed"}.'
    )
    assert editor(tools, command="create", path="/testbed/a").observation == (
        "Error: Parameter `file_text` is required for the `create` command."
    )
    assert editor(tools, command="insert", path="/testbed/a", new_str="x").observation == (
        "Error: Parameter `insert_line` is required for the `insert` command."
    )


def test_wrong_types(tools):
    assert tools.call("execute_bash", {"command": 5}).observation == (
        "Error: Parameter `command` of `execute_bash` must be a string, got an integer 5."
    )
    assert editor(tools, command="insert", path="/testbed/a", insert_line="3", new_str="x").observation == (
        'Error: Parameter `insert_line` of `str_replace_editor` must be an integer, got a string "3".'
    )
    assert editor(tools, command="view", path="/testbed/a", view_range=[1, "x"]).observation == (
        'Error: Parameter `view_range` of `str_replace_editor` must be an array of integers, got an array [1, "x"].'
    )
    assert editor(tools, command="insert", path="/testbed/a", insert_line=True, new_str="x").error is True


def test_unknown_editor_command(tools):
    result = editor(tools, command="delete", path="/testbed/a.txt")
    assert result.error is True
    assert result.observation == (
        "Error: Unknown command 'delete' for `str_replace_editor`. "
        "Allowed options are: `view`, `create`, `str_replace`, `insert`."
    )


def test_unknown_parameter_is_refused_before_any_edit(tools, sb):
    sb.write_file("/testbed/a.txt", b"old\n")
    result = editor(tools, command="str_replace", path="/testbed/a.txt", old_str="old", new_string="new")
    assert result.observation == (
        "Error: Unknown parameter(s) `new_string` for `str_replace_editor`. Its parameters are: `command`, `path`, "
        "`file_text`, `old_str`, `new_str`, `insert_line`, `view_range`."
    )
    assert sb.read_file("/testbed/a.txt") == b"old\n"


def test_null_optional_values_count_as_absent(tools, sb):
    sb.write_file("/testbed/a.txt", b"one\n")
    result = tools.call("str_replace_editor", '{"command": "view", "path": "/testbed/a.txt", "view_range": null}')
    assert result.observation == view_of("/testbed/a.txt", ["one", ""])


def test_relative_paths_get_the_absolute_form_suggested(tools):
    assert editor(tools, command="view", path="src/a.py").observation == (
        "Error: The path 'src/a.py' is not an absolute path; it must start with `/`, e.g. /testbed/src/a.py."
    )
    assert editor(tools, command="view", path="testbed/a.py").observation == (
        "Error: The path 'testbed/a.py' is not an absolute path; it must start with `/`, e.g. /testbed/a.py."
    )


def test_dot_dot_in_an_absolute_path_is_resolved(tools, sb):
    sb.write_file("/testbed/a.txt", b"one\n")
    result = editor(tools, command="view", path="/testbed/sub/../a.txt")
    assert result.observation == view_of("/testbed/a.txt", ["one", ""])


# --- view -------------------------------------------------------------------------------------


def test_view_any_text_file_numbered_as_the_reference_splits_it(tools, sb):
    sb.write_file("/testbed/notes.md", b"# Title\n\nSome *text*.\n")
    result = editor(tools, command="view", path="/testbed/notes.md")
    assert result.error is False
    assert result.observation == view_of("/testbed/notes.md", ["# Title", "", "Some *text*.", ""])
    sb.write_file("/testbed/open.md", b"no final newline")
    assert editor(tools, command="view", path="/testbed/open.md").observation == view_of(
        "/testbed/open.md", ["no final newline"]
    )


def test_view_range(tools, sb):
    sb.write_file("/testbed/data.csv", "".join(f"{i},{i * i}\n" for i in range(1, 11)).encode())
    path = "/testbed/data.csv"
    assert editor(tools, command="view", path=path, view_range=[3, 4]).observation == view_of(path, ["3,9", "4,16"], 3)
    assert editor(tools, command="view", path=path, view_range=[9, -1]).observation == view_of(
        path, ["9,81", "10,100", ""], 9
    )
    assert editor(tools, command="view", path=path, view_range=[10, 10]).observation == view_of(path, ["10,100"], 10)
    assert editor(tools, command="view", path=path, view_range=[11, 11]).observation == view_of(path, [""], 11)


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        ([0, 2], "Invalid `view_range` [0, 2]: start 0 must be within [1, 11] (the file has 11 lines)."),
        ([12, -1], "Invalid `view_range` [12, -1]: start 12 must be within [1, 11] (the file has 11 lines)."),
        ([5, 4], "Invalid `view_range` [5, 4]: end 4 must be within [5, 11], or -1 to view to the end of the file."),
        ([1, 12], "Invalid `view_range` [1, 12]: end 12 must be within [1, 11], or -1 to view to the end of the file."),
        ([1], "`view_range` must be two integers [start, end], e.g. [1, 40] or [100, -1]; got [1]."),
    ],
)
def test_view_range_is_validated(tools, sb, view_range, message):
    sb.write_file("/testbed/data.csv", "".join(f"{i}\n" for i in range(10)).encode())
    result = editor(tools, command="view", path="/testbed/data.csv", view_range=view_range)
    assert (result.error, result.observation) == (True, f"Error: {message}")


def test_view_keeps_crlf_and_expands_tabs(tools, sb):
    sb.write_file("/testbed/win.txt", b"one\r\n\ttwo\r\nab\tthree")
    result = editor(tools, command="view", path="/testbed/win.txt")
    assert result.observation == view_of("/testbed/win.txt", ["one\r", "        two\r", "ab      three"])


def test_view_of_an_empty_file(tools, sb):
    sb.write_file("/testbed/empty.txt", b"")
    assert (
        editor(tools, command="view", path="/testbed/empty.txt").observation == "The file /testbed/empty.txt is empty."
    )


def test_view_of_non_utf8_text_replaces_bad_bytes_with_a_note(tools, sb):
    sb.write_file("/testbed/latin1.txt", "café\nnaïve\n".encode("latin-1"))
    result = editor(tools, command="view", path="/testbed/latin1.txt")
    assert result.observation == (
        "Note: /testbed/latin1.txt is not valid UTF-8; undecodable bytes are shown as \ufffd.\n"
        + view_of("/testbed/latin1.txt", ["caf\ufffd", "na\ufffdve", ""])
    )


def test_view_describes_a_binary_file_instead_of_dumping_it(tools, sb):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    sb.write_file("/testbed/img.png", png)
    assert editor(tools, command="view", path="/testbed/img.png").observation == (
        f"/testbed/img.png is a binary file ({len(png)} bytes, PNG image). "
        "It is not shown; inspect it with execute_bash (e.g. python3)."
    )
    sb.write_file("/testbed/blob.bin", b"abc\0def" * 10)
    assert editor(tools, command="view", path="/testbed/blob.bin").observation.startswith(
        "/testbed/blob.bin is a binary file (70 bytes). It is not shown"
    )
    sb.write_file("/testbed/noise.bin", bytes(range(128, 256)) * 20)
    assert editor(tools, command="view", path="/testbed/noise.bin").observation.startswith(
        "/testbed/noise.bin is a binary file (2560 bytes). It is not shown"
    )


def test_view_clips_a_long_file_after_its_first_characters(tools, sb):
    sb.write_file("/testbed/long.txt", "".join(f"line {i}\n" for i in range(1, 5001)).encode())
    full = view_of("/testbed/long.txt", [f"line {i}" for i in range(1, 5001)] + [""])
    assert editor(tools, command="view", path="/testbed/long.txt").observation == full[:10_000] + "\n<response clipped>"
    small = editor(Tools(sb, max_chars=500), command="view", path="/testbed/long.txt")
    assert small.observation == full[:500] + "\n<response clipped>", "a smaller max_chars clips sooner"


def test_view_of_a_directory_lists_two_levels_without_hidden_entries_in_find_order(tools, sb):
    for path in ["/testbed/a.py", "/testbed/src/b.py", "/testbed/src/deep/c.py", "/testbed/.git/config"]:
        sb.write_file(path, b"x")
    sb.write_file("/testbed/src/.hidden", b"x")
    result = editor(tools, command="view", path="/testbed")
    order = bash(tools, "find /testbed -mindepth 1 -maxdepth 2 -not -name '.*' -not -path '*/.*'").observation
    entries = order.split("\\[STDOUT]\n", 1)[1]
    assert sorted(entries.splitlines()) == ["/testbed/a.py", "/testbed/src", "/testbed/src/b.py", "/testbed/src/deep"]
    assert result.observation == (
        f"Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:\n/testbed\n{entries}"
    )
    assert editor(tools, command="view", path="/testbed/.git").observation.endswith(
        "/testbed/.git\n/testbed/.git/config\n"
    )


def test_view_of_a_directory_refuses_a_view_range(tools):
    assert editor(tools, command="view", path="/testbed", view_range=[1, 2]).observation == (
        "Error: `view_range` is not allowed when `path` is a directory."
    )


def test_view_of_a_missing_path(tools):
    result = editor(tools, command="view", path="/testbed/missing.txt")
    assert (result.error, result.observation) == (
        True,
        "Error: The path /testbed/missing.txt does not exist. Please provide a valid path.",
    )


# --- create -----------------------------------------------------------------------------------


def test_create_writes_the_text_and_a_newline_and_makes_parents(tools, sb):
    text = "a\r\n\tb\n\u00e9\n"
    result = editor(tools, command="create", path="/testbed/new/dir/f.txt", file_text=text)
    assert (result.error, result.observation) == (
        False,
        "File created at /testbed/new/dir/f.txt. Here's the result of running `cat -n` on /testbed/new/dir/f.txt:\n"
        "     1\ta\r\n     2\t        b\n     3\t\u00e9\n     4\t\n"
        "Review the file and make sure that it is as expected. Edit the file if necessary.",
    )
    assert sb.read_file("/testbed/new/dir/f.txt") == text.encode() + b"\n"


def test_create_replaces_an_existing_file_keeping_its_mode_but_not_a_directory(tools, sb):
    sb.write_file("/testbed/f.sh", b"old contents\n", mode=0o755)
    result = editor(tools, command="create", path="/testbed/f.sh", file_text="echo new")
    assert result.observation.startswith("File created at /testbed/f.sh. ")
    assert sb.read_file("/testbed/f.sh") == b"echo new\n"
    assert bash(tools, "stat -c %a f.sh && ./f.sh").observation == out("755\nnew\n")
    directory = editor(tools, command="create", path="/testbed", file_text="x")
    assert directory.observation == (
        "Error: /testbed is a directory; `create` writes files. Pick a file path, e.g. /testbed/new.py."
    )


def test_create_reports_what_stops_it(tools, sb):
    sb.write_file("/testbed/f.txt", b"x")
    under_a_file = editor(tools, command="create", path="/testbed/f.txt/g.txt", file_text="y")
    assert under_a_file.observation == "Error: Cannot access /testbed/f.txt/g.txt: Not a directory."
    read_only = editor(tools, command="create", path="/usr/bin/new-tool", file_text="y")
    assert read_only.observation == "Error: Cannot write /usr/bin/new-tool: Read-only file system."


def test_creating_a_new_file_cannot_be_undone(sb):
    tools = Tools(sb, undo=True)
    editor(tools, command="create", path="/testbed/f.txt", file_text="x")
    assert editor(tools, command="undo_edit", path="/testbed/f.txt").observation == (
        "Error: No edit history found for /testbed/f.txt; only `str_replace` and `insert` edits can be undone."
    )


# --- str_replace ------------------------------------------------------------------------------


TEN_LINES = "".join(f"line {i}\n" for i in range(1, 11))


def test_str_replace_shows_a_numbered_snippet(tools, sb):
    sb.write_file("/testbed/f.txt", TEN_LINES.encode())
    result = editor(tools, command="str_replace", path="/testbed/f.txt", old_str="line 6\n", new_str="six\nSIX\n")
    lines = ["line 2", "line 3", "line 4", "line 5", "six", "SIX", "line 7", "line 8", "line 9", "line 10", ""]
    assert result.observation == (
        "The file /testbed/f.txt has been edited. Here's the result of running `cat -n` on a snippet of "
        f"/testbed/f.txt:\n{numbered(lines, 2)}Review the changes and make sure they are as expected. "
        "Edit the file again if necessary."
    )
    assert sb.read_file("/testbed/f.txt") == TEN_LINES.replace("line 6\n", "six\nSIX\n").encode()


def test_str_replace_without_new_str_deletes(tools, sb):
    sb.write_file("/testbed/f.txt", b"keep\ndrop\nkeep too\n")
    assert editor(tools, command="str_replace", path="/testbed/f.txt", old_str="drop\n").error is False
    assert sb.read_file("/testbed/f.txt") == b"keep\nkeep too\n"


def test_str_replace_needs_exactly_one_occurrence(tools, sb):
    sb.write_file("/testbed/f.txt", b"x = 1\ny = 2\nx = 1\n")
    missing = editor(tools, command="str_replace", path="/testbed/f.txt", old_str="z = 3", new_str="")
    assert missing.observation == (
        "Error: No replacement was performed: old_str did not appear verbatim in /testbed/f.txt. It must match "
        "exactly, including whitespace, indentation and line endings; view the file to copy the exact text."
    )
    several = editor(tools, command="str_replace", path="/testbed/f.txt", old_str="x = 1", new_str="x = 9")
    assert several.observation == (
        "Error: No replacement was performed: old_str occurs 2 times in /testbed/f.txt, starting at lines 1, 3. "
        "Include more surrounding lines in old_str so that it matches exactly one place."
    )
    empty = editor(tools, command="str_replace", path="/testbed/f.txt", old_str="", new_str="x")
    assert empty.observation == "Error: `old_str` is empty; it must be the exact text to replace."
    assert sb.read_file("/testbed/f.txt") == b"x = 1\ny = 2\nx = 1\n"


def test_str_replace_hints_at_crlf_line_endings(tools, sb):
    sb.write_file("/testbed/win.txt", b"a\r\nb\r\n")
    result = editor(tools, command="str_replace", path="/testbed/win.txt", old_str="a\nb", new_str="c")
    assert result.observation.endswith(
        "Note: the file has CRLF (\\r\\n) line endings, so old_str must contain the \\r characters."
    )


def test_str_replace_on_a_missing_file_names_it(tools):
    result = editor(tools, command="str_replace", path="/testbed/nope.py", old_str="a", new_str="b")
    assert result.observation == "Error: The path /testbed/nope.py does not exist. Please provide a valid path."


def test_str_replace_on_a_directory(tools):
    result = editor(tools, command="str_replace", path="/testbed", old_str="a", new_str="b")
    assert result.observation == "Error: /testbed is a directory; this command works on files."


def test_str_replace_refuses_a_binary_file(tools, sb):
    sb.write_file("/testbed/blob.bin", b"ab\0cd")
    result = editor(tools, command="str_replace", path="/testbed/blob.bin", old_str="ab", new_str="xy")
    assert result.observation == (
        "Error: /testbed/blob.bin is a binary file (5 bytes). str_replace_editor edits text files only; "
        "change it with execute_bash (e.g. python3)."
    )
    assert sb.read_file("/testbed/blob.bin") == b"ab\0cd"


def test_str_replace_in_non_utf8_text_keeps_the_other_bytes(tools, sb):
    original = b"caf\xe9 = 1\nvalue = 2\n\xff\xfe end\n"
    sb.write_file("/testbed/legacy.txt", original)
    result = editor(tools, command="str_replace", path="/testbed/legacy.txt", old_str="value = 2", new_str="value = 3")
    assert result.observation.startswith(
        "Note: /testbed/legacy.txt is not valid UTF-8; undecodable bytes are shown as \ufffd.\n"
        "The file /testbed/legacy.txt has been edited."
    )
    assert numbered(["caf\ufffd = 1", "value = 3", "\ufffd\ufffd end"]) in result.observation
    assert sb.read_file("/testbed/legacy.txt") == b"caf\xe9 = 1\nvalue = 3\n\xff\xfe end\n"


def test_edits_keep_the_file_mode(tools, sb):
    sb.write_file("/testbed/run.sh", b"#!/bin/sh\necho one\n", mode=0o755)
    editor(tools, command="str_replace", path="/testbed/run.sh", old_str="one", new_str="two")
    editor(tools, command="insert", path="/testbed/run.sh", insert_line=2, new_str="echo three")
    result = bash(tools, "stat -c %a run.sh && ./run.sh")
    assert result.observation == out("755\ntwo\nthree\n")


# --- insert -----------------------------------------------------------------------------------


def test_insert_after_a_line_shows_a_snippet(tools, sb):
    sb.write_file("/testbed/f.txt", TEN_LINES.encode())
    result = editor(tools, command="insert", path="/testbed/f.txt", insert_line=5, new_str="new a\nnew b")
    lines = ["line 2", "line 3", "line 4", "line 5", "new a", "new b", "line 6", "line 7", "line 8", "line 9"]
    assert result.observation == (
        "The file /testbed/f.txt has been edited. Here's the result of running `cat -n` on a snippet of "
        f"the edited file:\n{numbered(lines, 2)}Review the changes and make sure they are as expected (correct "
        "indentation, no duplicate lines, etc). Edit the file again if necessary."
    )
    assert sb.read_file("/testbed/f.txt") == TEN_LINES.replace("line 5\n", "line 5\nnew a\nnew b\n").encode()


@pytest.mark.parametrize(
    ("original", "line", "new_str", "expected"),
    [
        (b"a\nb\n", 0, "top", b"top\na\nb\n"),
        (b"a\nb\n", 2, "end", b"a\nb\nend\n"),
        (b"a\nb\n", 1, "mid\n", b"a\nmid\nb\n"),
        (b"a\nb", 2, "end", b"a\nb\nend"),
        (b"a\nb", 1, "mid", b"a\nmid\nb"),
        (b"", 0, "only", b"only\n"),
        (b"a\r\n\tb\r\n", 1, "\tmid", b"a\r\n\tmid\r\n\tb\r\n"),
        (b"a\r\nb", 2, "end", b"a\r\nb\r\nend"),
    ],
)
def test_insert_places_whole_lines_and_keeps_the_rest(tools, sb, original, line, new_str, expected):
    sb.write_file("/testbed/f.txt", original)
    result = editor(tools, command="insert", path="/testbed/f.txt", insert_line=line, new_str=new_str)
    assert result.error is False
    assert sb.read_file("/testbed/f.txt") == expected


@pytest.mark.parametrize("line", [-1, 3])
def test_insert_line_is_validated(tools, sb, line):
    sb.write_file("/testbed/f.txt", b"a\nb\n")
    result = editor(tools, command="insert", path="/testbed/f.txt", insert_line=line, new_str="x")
    assert result.observation == (
        f"Error: Invalid `insert_line` {line}: it must be within [0, 2] (0 inserts at the top, 2 after the last line)."
    )
    assert sb.read_file("/testbed/f.txt") == b"a\nb\n"


# --- undo_edit --------------------------------------------------------------------------------


def test_undo_edit_restores_each_earlier_version_exactly(sb):
    tools = Tools(sb, undo=True)
    assert tools.schemas[0]["function"]["parameters"]["properties"]["command"]["enum"][-1] == "undo_edit"
    original = b"a\r\n\tb\r\nc\r\n"
    sb.write_file("/testbed/win.txt", original)
    editor(tools, command="str_replace", path="/testbed/win.txt", old_str="\tb", new_str="\tB\tB")
    after_replace = b"a\r\n\tB\tB\r\nc\r\n"
    assert sb.read_file("/testbed/win.txt") == after_replace
    editor(tools, command="insert", path="/testbed/win.txt", insert_line=3, new_str="d")
    assert sb.read_file("/testbed/win.txt") == after_replace + b"d\r\n"
    first = editor(tools, command="undo_edit", path="/testbed/win.txt")
    assert (first.error, first.observation) == (False, "Last edit to /testbed/win.txt undone successfully.")
    assert sb.read_file("/testbed/win.txt") == after_replace
    editor(tools, command="undo_edit", path="/testbed/win.txt")
    assert sb.read_file("/testbed/win.txt") == original
    assert editor(tools, command="undo_edit", path="/testbed/win.txt").observation == (
        "Error: No edit history found for /testbed/win.txt; only `str_replace` and `insert` edits can be undone."
    )


# --- large files ------------------------------------------------------------------------------


def test_editor_handles_a_5_mb_file(sb):
    tools = Tools(sb, undo=True)
    lines = [f"row {i:07d}\tvalue {i * 7}\r\n" for i in range(200_000)]
    original = "".join(lines).encode()
    assert len(original) > 5_000_000
    sb.write_file("/testbed/big.tsv", original)

    view = editor(tools, command="view", path="/testbed/big.tsv", view_range=[100_001, 100_002])
    assert view.observation == view_of(
        "/testbed/big.tsv", ["row 0100000     value 700000\r", "row 0100001     value 700007\r"], 100_001
    )
    whole = editor(tools, command="view", path="/testbed/big.tsv")
    assert whole.observation.endswith("\n<response clipped>")
    assert len(whole.observation) == 10_000 + len("\n<response clipped>")

    replaced = editor(
        tools, command="str_replace", path="/testbed/big.tsv", old_str="row 0199998\t", new_str="ROW 199998\t"
    )
    assert replaced.error is False
    assert "199999\tROW 199998      value 1399986\r\n" in replaced.observation
    expected = original.replace(b"row 0199998\t", b"ROW 199998\t")
    assert sb.read_file("/testbed/big.tsv") == expected

    editor(tools, command="undo_edit", path="/testbed/big.tsv")
    assert sb.read_file("/testbed/big.tsv") == original
