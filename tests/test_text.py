"""The tools' pure text helpers, without a jail: argument checks, clipping, line and byte arithmetic."""

from __future__ import annotations

import pytest

from jailbox.agent import text
from jailbox.agent.schemas import EDITOR_COMMANDS, PARAMETERS
from jailbox.agent.text import ToolError
from jailbox.sandbox import ExecResult

pytestmark = pytest.mark.once  # text handling on the host, the same whoever runs it

PNG = b"\x89PNG\r\n\x1a\n"

# --- clip -----------------------------------------------------------------------------------------


def test_clip_leaves_text_up_to_the_limit_alone():
    assert text.clip("", 10) == ""
    assert text.clip("a" * 9, 10) == "a" * 9
    assert text.clip("a" * 10, 10) == "a" * 10, "exactly at the limit: nothing elided"


def test_clip_one_over_the_limit_keeps_head_and_tail():
    assert text.clip("a" * 5 + "b" + "c" * 5, 10) == "aaaaa\n[... 1 characters elided ...]\nccccc"


def test_clip_cuts_at_line_ends_when_one_is_near():
    lines = "".join(f"{i:03}\n" for i in range(100))  # 400 characters, a newline every 4
    clipped = text.clip(lines, 40)
    assert clipped == "000\n001\n002\n003\n004\n[... 364 characters elided ...]\n096\n097\n098\n099\n"


def test_clip_carries_the_hint_inside_the_marker():
    assert text.clip("x" * 30, 10, "; use view_range") == "xxxxx\n[... 20 characters elided; use view_range ...]\nxxxxx"


def test_clip_to_one_character_keeps_only_the_last():
    assert text.clip("ab", 1) == "[... 1 characters elided ...]\nb"


def test_clip_counts_characters_so_multibyte_utf8_is_never_split():
    clipped = text.clip("é" * 6 + "€" * 6, 10)  # 2-byte and 3-byte characters meet at the cut
    assert clipped == "ééééé\n[... 2 characters elided ...]\n€€€€€"
    assert clipped.encode("utf-8").decode("utf-8") == clipped
    emoji = text.clip("🙂" * 11, 10)
    assert emoji == "🙂" * 5 + "\n[... 1 characters elided ...]\n" + "🙂" * 5


# --- sharing the budget between streams -----------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "err", "limit", "expected"),
    [
        (0, 0, 10, (0, 0)),
        (3, 4, 10, (3, 4)),
        (6, 4, 10, (6, 4)),  # exactly the limit: both whole
        (100, 2, 10, (8, 2)),  # a short stderr leaves the rest to stdout
        (2, 100, 10, (2, 8)),
        (0, 50, 10, (0, 10)),
        (100, 5, 10, (5, 5)),  # a stream of exactly half counts as short
        (100, 100, 10, (5, 5)),
        (100, 100, 11, (6, 5)),  # an odd character goes to stdout
    ],
)
def test_share(out, err, limit, expected):
    assert text.share(out, err, limit) == expected
    assert sum(text.share(out, err, limit)) <= limit


def test_dropped_hint():
    assert text.dropped_hint(0) == ""
    assert text.dropped_hint(5) == "; the sandbox had already dropped 5 bytes of this stream"


def test_exit_text_is_the_references():
    assert text.exit_text(ExecResult(exit_code=0)) == "0"
    assert text.exit_text(ExecResult(exit_code=3)) == "Error: Exit code 3"
    assert text.exit_text(ExecResult(exit_code=-9, signal=9)) == "Error: Exit code 137", "as bash reports a kill"
    assert text.timeout_text(2.5).startswith("The command timed out after 2.5 s and its process tree was killed. ")


def test_bash_observation_layout():
    head = "Exit code: 0\nExecution output of \\[execute_bash]:\n"
    assert text.bash_observation("0", "42\n", "") == head + "\\[STDOUT]\n42\n"
    assert text.bash_observation("0", " \n", "\n") == head + "\\[STDOUT]\n(no output)", "blank streams are empty"
    assert text.bash_observation("0", "", "oops\n") == head + "\\[STDOUT]\n(no output)\n\\[STDERR]\noops\n"


def test_stream_keeps_40_first_and_last_lines_and_drops_escapes():
    assert text.stream("\x1b[31mred\x1b[0m\r\n50%\r100%\n") == "red\n50%100%\n"
    assert text.stream("\n".join(map(str, range(80)))) == "\n".join(map(str, range(80))), "80 lines: all kept"
    cut = text.stream("".join(f"{n}\n" for n in range(1, 102)))
    divider = "-" * 50
    middle = f"{divider}\n<Observation truncated in middle for saving context>\n{divider}"
    assert cut == "\n".join([*map(str, range(1, 41)), middle, *map(str, range(62, 102))])


# --- numbering and ranges -------------------------------------------------------------------------


def test_number_pads_to_six_columns_and_a_tab():
    assert text.number([], 1) == ""
    assert text.number(["a", "\tb"], 9) == "     9\ta\n    10\t\tb"
    assert text.number(["x"], 123456) == "123456\tx"


@pytest.mark.parametrize(
    ("view_range", "total", "expected"),
    [(None, 0, (0, 0)), (None, 5, (0, 5)), ([2, 3], 5, (1, 3)), ([2, -1], 5, (1, 5)), ([5, 5], 5, (4, 5))],
)
def test_line_range(view_range, total, expected):
    assert text.line_range(view_range, total) == expected


@pytest.mark.parametrize(
    ("view_range", "total", "message"),
    [
        ([1], 5, "`view_range` must be two integers [start, end], e.g. [1, 40] or [100, -1]; got [1]."),
        ([1, 1], 0, "The file is empty; view it without `view_range`."),
        ([0, 1], 5, "Invalid `view_range` [0, 1]: start 0 must be within [1, 5] (the file has 5 lines)."),
        ([6, 6], 5, "Invalid `view_range` [6, 6]: start 6 must be within [1, 5] (the file has 5 lines)."),
        ([3, 2], 5, "Invalid `view_range` [3, 2]: end 2 must be within [3, 5], or -1 to view to the end of the file."),
        ([1, 6], 5, "Invalid `view_range` [1, 6]: end 6 must be within [1, 5], or -1 to view to the end of the file."),
    ],
)
def test_line_range_refuses(view_range, total, message):
    with pytest.raises(ToolError) as caught:
        text.line_range(view_range, total)
    assert str(caught.value) == message


# --- arguments ------------------------------------------------------------------------------------


def test_parse_arguments_accepts_json_text_or_a_mapping_and_drops_nulls():
    assert text.parse_arguments("submit", None) == {}
    assert text.parse_arguments("submit", "") == {}
    assert text.parse_arguments("submit", " \n ") == {}
    assert text.parse_arguments("execute_bash", '{"command": "ls", "x": null}') == {"command": "ls"}
    assert text.parse_arguments("execute_bash", {"command": "ls", "x": None}) == {"command": "ls"}
    assert text.parse_arguments("execute_bash", '{"command": "echo é"}') == {"command": "echo é"}


@pytest.mark.parametrize(
    ("arguments", "ending"),
    [
        ("[1]", 'must be a JSON object, e.g. {"command": "ls /testbed"}, not an array.'),
        ('"ls"', 'must be a JSON object, e.g. {"command": "ls /testbed"}, not a string.'),
        ("true", 'must be a JSON object, e.g. {"command": "ls /testbed"}, not a boolean.'),
        ("3", 'must be a JSON object, e.g. {"command": "ls /testbed"}, not an integer.'),
        ("3.5", 'must be a JSON object, e.g. {"command": "ls /testbed"}, not a number.'),
        ("null", 'must be a JSON object, e.g. {"command": "ls /testbed"}, not null.'),
    ],
)
def test_parse_arguments_refuses_what_is_not_an_object(arguments, ending):
    with pytest.raises(ToolError) as caught:
        text.parse_arguments("execute_bash", arguments)
    assert str(caught.value) == f"The arguments of `execute_bash` {ending}"


def test_parse_arguments_refuses_bad_json_with_an_example():
    with pytest.raises(ToolError) as caught:
        text.parse_arguments("str_replace_editor", '{"command": "view",')
    message = str(caught.value)
    assert message.startswith("The arguments of `str_replace_editor` are not valid JSON (")
    assert message.endswith('Pass a JSON object, e.g. {"command": "view", "path": "/testbed"}.')


def test_check_arguments_accepts_well_formed_calls():
    text.check_arguments("execute_bash", {"command": "ls"}, PARAMETERS["execute_bash"])
    text.check_arguments("submit", {}, PARAMETERS["submit"])
    editor = PARAMETERS["str_replace_editor"]
    text.check_arguments("str_replace_editor", {"command": "view", "path": "/x", "view_range": [1, -1]}, editor)
    text.check_arguments(
        "str_replace_editor", {"command": "insert", "path": "/x", "insert_line": 0, "new_str": ""}, editor
    )


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        (
            "execute_bash",
            {"command": "ls", "cwd": "/", "b": 1},
            "Unknown parameter(s) `b`, `cwd` for `execute_bash`. Its parameters are: `command`.",
        ),
        ("submit", {"x": 1}, "Unknown parameter(s) `x` for `submit`. Its parameters are: none."),
        (
            "execute_bash",
            {},
            'Missing required parameter `command` for `execute_bash`, e.g. {"command": "ls /testbed"}.',
        ),
        ("execute_bash", {"command": 5}, "Parameter `command` of `execute_bash` must be a string, got an integer 5."),
        (
            "str_replace_editor",
            {"command": "insert", "path": "/x", "insert_line": True},
            "Parameter `insert_line` of `str_replace_editor` must be an integer, got a boolean true.",
        ),
        (
            "str_replace_editor",
            {"command": "view", "path": "/x", "view_range": [1, "2"]},
            'Parameter `view_range` of `str_replace_editor` must be an array of integers, got an array [1, "2"].',
        ),
        (
            "str_replace_editor",
            {"command": "delete", "path": "/x"},
            "Unknown command 'delete' for `str_replace_editor`. Allowed options are: "
            + ", ".join(f"`{c}`" for c in EDITOR_COMMANDS)
            + ".",
        ),
    ],
)
def test_check_arguments_refuses(name, args, message):
    with pytest.raises(ToolError) as caught:
        text.check_arguments(name, args, PARAMETERS[name])
    assert str(caught.value) == message


def test_check_arguments_clips_a_huge_wrong_value_in_its_message():
    with pytest.raises(ToolError) as caught:
        text.check_arguments("execute_bash", {"command": list(range(10_000))}, PARAMETERS["execute_bash"])
    message = str(caught.value)
    assert message.startswith("Parameter `command` of `execute_bash` must be a string, got an array [0, 1, 2,")
    assert "characters elided" in message and len(message) < 400


@pytest.mark.parametrize(
    ("path", "workdir", "guess"),
    [
        ("testbed/x.py", "/testbed", "/testbed/x.py"),
        ("testbed", "/testbed", "/testbed"),
        ("x.py", "/testbed", "/testbed/x.py"),
        ("tmp/x", "/testbed", "/testbed/tmp/x"),
        ("./a/../b", "/work", "/work/b"),
        ("x", "/", "/x"),
    ],
)
def test_absolute_guess(path, workdir, guess):
    assert text.absolute_guess(path, workdir) == guess


def test_encode():
    assert text.encode("file_text", "") == b""
    assert text.encode("file_text", "café €") == b"caf\xc3\xa9 \xe2\x82\xac"
    with pytest.raises(ToolError) as caught:
        text.encode("old_str", "a\ud800b")
    assert str(caught.value) == "`old_str` contains characters that cannot be encoded as UTF-8 (unpaired surrogates)."


# --- edit messages --------------------------------------------------------------------------------


def test_not_found_notes_crlf_only_when_that_is_the_likely_cause():
    plain = text.not_found("/f", b"a\nb\n", b"a\nc")
    assert plain.startswith("No replacement was performed: old_str did not appear verbatim in /f.")
    assert "CRLF" not in plain
    crlf = text.not_found("/f", b"a\r\nb\r\n", b"a\nb")
    assert crlf == plain + " Note: the file has CRLF (\\r\\n) line endings, so old_str must contain the \\r characters."
    assert "CRLF" not in text.not_found("/f", b"a\r\nb\r\n", b"a\r\nx"), "old_str already has CRLF"
    assert "CRLF" not in text.not_found("/f", b"a\r\nb\r\n", b"x"), "a single-line old_str"


def test_occurrence_lines():
    assert text.occurrence_lines(b"", b"x") == []
    assert text.occurrence_lines(b"abc", b"x") == []
    assert text.occurrence_lines(b"x\nx\ny\nx", b"x") == [1, 2, 4]
    assert text.occurrence_lines(b"aaaa", b"aa") == [1, 1], "non-overlapping"
    assert text.occurrence_lines(b"x\n" * 30, b"x") == list(range(1, text.MAX_LISTED_LINES + 1))


# --- lines and bytes ------------------------------------------------------------------------------


def test_decode_replaces_what_is_not_utf8():
    assert text.decode(b"") == ""
    assert text.decode("café".encode()) == "café"
    assert text.decode(b"a\xffb") == "a\ufffdb"
    assert text.decode("€".encode()[:2]) == "\ufffd", "a multi-byte character cut short"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("", [""]),
        ("\n", ["", ""]),
        ("a", ["a"]),
        ("a\n", ["a", ""]),
        ("a\n\n", ["a", "", ""]),
        ("a\r\nb\tc", ["a\r", "b       c"]),
        ("\tx\n12\ty", ["        x", "12      y"]),
    ],
)
def test_view_lines_split_on_newlines_and_expand_tabs(source, lines):
    assert text.view_lines(source) == lines


def test_clip_view_and_listing_are_the_references():
    assert text.clip_view("a" * 10_000) == "a" * 10_000
    assert text.clip_view("a" * 10_001) == "a" * 10_000 + "\n<response clipped>"
    assert text.clip_view("abcdef", 3) == "abc\n<response clipped>"
    assert (
        text.listing("x\ty\n", "/f", 1) == "Here's the result of running `cat -n` on /f:\n     1\tx       y\n     2\t\n"
    )
    assert text.listing("abcdef", "/f", 7, 3) == (
        "Here's the result of running `cat -n` on /f:\n     7\tabc\n     8\t<response clipped>\n"
    )


@pytest.mark.parametrize(("data", "count"), [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\nb", 2), (b"\n\n", 2)])
def test_count_lines(data, count):
    assert text.count_lines(data) == count


@pytest.mark.parametrize(("line", "offset"), [(0, 0), (1, 3), (2, 6), (3, 8), (10, 8)])
def test_line_end(line, offset):
    assert text.line_end(b"ab\ncd\nef", line) == offset


@pytest.mark.parametrize(
    ("data", "at", "new", "block"),
    [
        (b"", 0, b"x", b"x\n"),
        (b"a\nb\n", 2, b"x", b"x\n"),
        (b"a\nb\n", 0, b"x\n", b"x\n"),
        (b"a\r\nb\r\n", 3, b"x", b"x\r\n"),
        (b"a", 1, b"x", b"\nx"),
        (b"a\r\nb", 4, b"x", b"\r\nx"),
        (b"a\n", 2, "é".encode(), "é\n".encode()),
    ],
)
def test_insert_block(data, at, new, block):
    assert text.insert_block(data, at, new) == block


def test_is_binary():
    assert not text.is_binary(b"")
    assert not text.is_binary(b"hello\n")
    assert not text.is_binary("é€🙂\n".encode() * 100)
    assert not text.is_binary(b"a" * 10 + b"\xff"), "a stray bad byte in text"
    assert text.is_binary(b"\xff" * 10)
    assert text.is_binary(PNG + b"rest")
    assert text.is_binary(b"a\0b")
    assert text.is_binary(b"a" * (text.SNIFF_BYTES - 1) + b"\0"), "a NUL on the last sniffed byte"
    assert not text.is_binary(b"a" * text.SNIFF_BYTES + b"\0"), "past the sniffed bytes"


def test_describe_binary_and_utf8_note():
    assert text.describe_binary("/x.png", PNG) == "/x.png is a binary file (8 bytes, PNG image)."
    assert text.describe_binary("/x", b"\0\0") == "/x is a binary file (2 bytes)."
    assert text.utf8_note("/f", "é".encode()) == ""
    assert text.utf8_note("/f", b"") == ""
    assert text.utf8_note("/f", b"\xc3") == "Note: /f is not valid UTF-8; undecodable bytes are shown as \ufffd.\n"
