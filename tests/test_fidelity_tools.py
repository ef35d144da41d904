"""The tools' observations are the reference package's bytes: literal formats, and steps of the paper's trajectories.

Models trained in the reference's sandbox learned its observations, so these pin them byte for byte: what
``create`` writes and shows, how a view numbers and clips, the directory listing's header, a command's exit code
line, header, sections and line cut, bash's own name in its errors. The second half re-runs recorded steps
whose inputs are reproducible (``../shared/data`` beside the checkout; skipped with a reason without it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jailbox.agent.tools import Tools
from jailbox.agent.trajectory import load
from jailbox.sandbox import Sandbox

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TRAJECTORIES = SHARED / "reference-trajectories"
LONG_CONTEXT_INPUT = SHARED / "reference-examples" / "09_long_context" / "input"
HEADER = "Execution output of \\[execute_bash]:\n"
CREATED = "Review the file and make sure that it is as expected. Edit the file if necessary."
EDITED = "Review the changes and make sure they are as expected. Edit the file again if necessary."


@pytest.fixture
def tools(sb) -> Tools:
    sb.exec(["mkdir", "-p", "/testbed/output"])
    return Tools(sb)


def call(tools: Tools, name: str, **args: object) -> str:
    return tools.call(name, args).observation


# --- literal bytes (always run) -------------------------------------------------------------------


def test_create_writes_a_final_newline_and_a_view_numbers_the_empty_line_after_it(tools, sb):
    created = call(tools, "str_replace_editor", command="create", path="/testbed/output/answer.txt", file_text="A")
    assert created == (
        "File created at /testbed/output/answer.txt. Here's the result of running `cat -n` on "
        f"/testbed/output/answer.txt:\n     1\tA\n{CREATED}"
    )
    assert sb.read_file("/testbed/output/answer.txt") == b"A\n"
    assert call(tools, "execute_bash", command="wc -l < output/answer.txt; wc -c < output/answer.txt") == (
        f"Exit code: 0\n{HEADER}\\[STDOUT]\n1\n2\n"
    )
    assert call(tools, "str_replace_editor", command="view", path="/testbed/output/answer.txt") == (
        "Here's the result of running `cat -n` on /testbed/output/answer.txt:\n     1\tA\n     2\t"
    )


def test_create_over_a_file_replaces_it_and_a_snippet_shows_the_last_empty_line(tools, sb):
    sb.write_file("/testbed/a.txt", b"old, longer contents\n")
    call(tools, "str_replace_editor", command="create", path="/testbed/a.txt", file_text="x\ny")
    assert sb.read_file("/testbed/a.txt") == b"x\ny\n"
    edited = call(tools, "str_replace_editor", command="str_replace", path="/testbed/a.txt", old_str="x", new_str="z")
    assert edited == (
        "The file /testbed/a.txt has been edited. Here's the result of running `cat -n` on a snippet of "
        f"/testbed/a.txt:\n     1\tz\n     2\ty\n     3\t\n{EDITED}"
    )
    assert sb.read_file("/testbed/a.txt") == b"z\ny\n", "an edit keeps every other byte (no newline added)"


def test_views_expand_tabs_and_clip_after_10000_characters(tools, sb):
    sb.write_file("/testbed/t.tsv", b"a\tb\n\tc\n")
    assert call(tools, "str_replace_editor", command="view", path="/testbed/t.tsv") == (
        "Here's the result of running `cat -n` on /testbed/t.tsv:\n     1\ta       b\n     2\t        c\n     3\t"
    )
    sb.write_file("/testbed/big.txt", b"0123456789" * 2000)
    header = "Here's the result of running `cat -n` on /testbed/big.txt:\n     1\t"
    view = call(tools, "str_replace_editor", command="view", path="/testbed/big.txt")
    assert view == (header + "0123456789" * 1000)[:10_000] + "\n<response clipped>"
    created = call(tools, "str_replace_editor", command="create", path="/testbed/c.txt", file_text="y" * 10_005)
    assert created.endswith(f"     1\t{'y' * 10_000}\n     2\t<response clipped>\n{CREATED}")


def test_directory_view_has_the_references_header_and_lists_the_directory_first(tools, sb):
    sb.write_file("/testbed/input/only.json", b"{}")
    sb.write_file("/testbed/input/.hidden", b"")
    assert call(tools, "str_replace_editor", command="view", path="/testbed/input") == (
        "Here's the files and directories up to 2 levels deep in /testbed/input, excluding hidden:\n"
        "/testbed/input\n/testbed/input/only.json\n"
    )


@pytest.mark.parametrize(
    ("command", "stdout", "stderr", "code"),
    [
        ("nosuchcommand", "(no output)", "bash: line 1: nosuchcommand: command not found\n", 127),
        ("echo ok; ( exit 3 ) || nosuch2 arg", "ok\n", "bash: line 1: nosuch2: command not found\n", 127),
        (
            "true\ncd /nonexistent-dir",
            "(no output)",
            "bash: line 2: cd: /nonexistent-dir: No such file or directory\n",
            1,
        ),
        ("echo 'unclosed", "(no output)", "bash: -c: line 1: unexpected EOF while looking for matching `''\n", 2),
    ],
)
def test_bash_errors_name_bash_and_exit_codes_are_the_references(tools, command, stdout, stderr, code):
    observation = call(tools, "execute_bash", command=command)
    assert observation == f"Exit code: Error: Exit code {code}\n{HEADER}\\[STDOUT]\n{stdout}\n\\[STDERR]\n{stderr}"


def test_bash_keeps_40_first_and_last_lines_of_each_stream(tools):
    divider = "-" * 50
    cut = f"{divider}\n<Observation truncated in middle for saving context>\n{divider}"
    observation = call(tools, "execute_bash", command="seq 1 100; seq 1 81 >&2")
    stdout = "\n".join([*map(str, range(1, 41)), cut, *map(str, range(61, 101))])
    stderr = "\n".join([*map(str, range(1, 41)), cut, *map(str, range(42, 82))])
    assert observation == f"Exit code: 0\n{HEADER}\\[STDOUT]\n{stdout}\n\\[STDERR]\n{stderr}"
    assert call(tools, "execute_bash", command="seq 1 80") == (
        f"Exit code: 0\n{HEADER}\\[STDOUT]\n" + "".join(f"{n}\n" for n in range(1, 81))
    ), "80 lines: nothing cut"


def test_bash_drops_colour_codes_and_carriage_returns(tools):
    command = r"printf '\033[1;31mred\033[0m\r\n10%%\r100%%\n'; printf '\033[33mwarn\033[0m\r\n' >&2"
    assert call(tools, "execute_bash", command=command) == (
        f"Exit code: 0\n{HEADER}\\[STDOUT]\nred\n10%100%\n\n\\[STDERR]\nwarn\n"
    )


def test_bash_blank_output_reads_no_output(tools):
    assert call(tools, "execute_bash", command="printf '\\n  \\n'; false") == (
        f"Exit code: Error: Exit code 1\n{HEADER}\\[STDOUT]\n(no output)"
    )


def test_undo_edit_is_offered_only_when_asked_for(sb):
    assert "undo_edit" not in json.dumps(Tools(sb).schemas)
    assert call(Tools(sb), "str_replace_editor", command="undo_edit", path="/testbed/x").startswith(
        "Error: Unknown command 'undo_edit'"
    )
    assert "undo_edit" in json.dumps(Tools(sb, undo=True).schemas)


# --- the paper's trajectories (../shared/data) ----------------------------------------------------


def _steps(name: str) -> list[tuple[str, dict, str]]:
    trajectory = load(TRAJECTORIES / f"trajectory_{name}.json")
    return [
        (action.function, dict(action.parameters), recorded)
        for step in trajectory.steps
        for action, recorded in zip(step.actions, step.observations, strict=True)
    ]


@pytest.mark.needs("shared-data")
@pytest.mark.parametrize("name", ["chemical", "instruct", "longcontext", "math", "music", "poster", "travel", "video"])
def test_every_recorded_create_reproduces_byte_for_byte(name):
    creates = [
        (args, recorded)
        for function, args, recorded in _steps(name)
        if function == "str_replace_editor" and args.get("command") == "create"
    ]
    assert creates, f"trajectory_{name} has create steps"
    with Sandbox() as sb:
        tools = Tools(sb)
        for args, recorded in creates:
            assert tools.call("str_replace_editor", args).observation == recorded, args["path"]
            assert sb.read_file(args["path"]) == args["file_text"].encode() + b"\n"


@pytest.mark.needs("shared-data")
def test_long_context_views_and_commands_reproduce_byte_for_byte(with_python):
    """The views of the task's input files (two clipped at 10,000 characters), and the commands on them."""
    with Sandbox(with_python) as sb:
        sb.put(LONG_CONTEXT_INPUT, "/testbed/input")
        sb.exec(["mkdir", "-p", "/testbed/output"])
        tools = Tools(sb)
        compared = 0
        for function, args, recorded in _steps("longcontext"):
            observation = tools.call(function, args).observation
            command = str(args.get("command", ""))
            if args.get("path") == "/testbed/input" or "grep -r" in command:
                assert sorted(observation.split("\n")) == sorted(recorded.split("\n")), "readdir order aside"
            elif str(args.get("path", "")).endswith("answer.txt"):
                continue  # the reference's echo added a newline at each edit of answer.txt; ours keeps the bytes
            else:
                assert observation == recorded, f"{function} {args}"
                compared += 1
        assert compared >= 12


@pytest.mark.needs("shared-data")
@pytest.mark.parametrize("name", ["math", "instruct"])
def test_offline_python_trajectories_reproduce_byte_for_byte(name, with_python):
    """Every step of the math and instruct runs (python scripts, python -c errors), except instruct's
    unseeded random search and its two prints of a set (hash order)."""
    random_or_set = ("python brute.py", "python test_sentences.py", "python template_search.py")
    with Sandbox(with_python) as sb:
        sb.exec(["mkdir", "-p", "/testbed/output"])
        tools = Tools(sb)
        for function, args, recorded in _steps(name):
            observation = tools.call(function, args).observation
            if not str(args.get("command", "")).endswith(random_or_set):
                assert observation == recorded, f"{function} {args}"
