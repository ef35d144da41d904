"""jailbox replay: recorded actions re-run in a fresh jail, observation by observation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.paper_tree import paper_store

from jailbox.agent.replay import normalise, replay
from jailbox.sandbox import SandboxConfig

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "data" / "reference-trajectories"


@pytest.mark.needs("shared-data")
def test_reference_math_trajectory_reproduces_step_by_step(with_python):
    path = REFERENCE / "trajectory_math.json"
    assert path.exists(), f"{path} is missing (../shared/data beside the checkout)"
    steps = replay(path, with_python)
    for step in steps:
        print(f"step {step.index}: {step.verdict:8} {step.action[:70]}")
    assert len(steps) == 8
    assert [s.verdict for s in steps] == ["same"] * 8


@pytest.mark.slow
@pytest.mark.needs("shared-data")
def test_a_changed_observation_is_reported_with_a_diff(tmp_path, with_python):
    data = json.loads((REFERENCE / "trajectory_math.json").read_text())
    data["steps"][1]["observation"] = data["steps"][1]["observation"].replace("588.0", "589.0")
    data["steps"].insert(
        2,
        {
            "thought": "",
            "reasoning_content": "",
            "observation": "Successfully installed x",
            "action": "{'function': 'execute_bash', 'parameters': {'command': 'pip install nothing'}}",
        },
    )
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(data))
    steps = replay(tampered, with_python)
    assert steps[1].verdict == "differs" and "-Area of heptagon: 589.0" in steps[1].diff
    assert "+Area of heptagon: 588.0" in steps[1].diff
    assert steps[2].verdict == "network"
    r = subprocess.run(
        [
            *JAILBOX,
            "replay",
            "--network",
            "none",
            str(tampered),
            "--bind",
            f"{tmp_path / 'shim'}:/opt/shim",
            "--env",
            "PATH=/opt/shim:/usr/bin:/bin",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "7 same, 1 differ, 1 used the network" in r.stdout


def test_normalise_ignores_the_wrappers_of_each_format():
    reference = "Exit code: 0\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n42\n"
    ours = "Exit code: 0\n[STDOUT]\n42\n[STDERR]\n(empty)\n\nSteps Remaining: 3"
    assert normalise(reference) == normalise(ours) == ["42"]
    assert normalise("(no output)") == normalise("Exit code: 0\n[STDOUT]\n(empty)\n[STDERR]\n(empty)\n") == []


def _trajectory(tmp_path: Path, steps: list[tuple[str, dict, str]]) -> Path:
    """A trajectory in the reference's format, from (function, parameters, recorded observation)."""
    path = tmp_path / f"t{len(list(tmp_path.glob('t*.json')))}.json"
    raw = [{"action": {"function": f, "parameters": p}, "observation": o} for f, p, o in steps]
    path.write_text(json.dumps({"problem_statement": "", "steps": raw}))
    return path


def bash_observation(code: str, stdout: str) -> str:
    return f"Exit code: {code}\nExecution output of \\[execute_bash]:\n\\[STDOUT]\n{stdout}"


def test_exit_codes_are_compared_in_either_spelling(tmp_path):
    path = _trajectory(
        tmp_path,
        [
            ("execute_bash", {"command": "false"}, bash_observation("0", "(no output)")),
            ("execute_bash", {"command": "true"}, bash_observation("Error: Exit code 1", "(no output)")),
            ("execute_bash", {"command": "exit 3"}, "Exit code: 3\n[STDOUT]\n(empty)\n[STDERR]\n(empty)\n"),
            ("execute_bash", {"command": "exit 4"}, bash_observation("Error: Exit code 4", "(no output)")),
            ("execute_bash", {"command": "echo hi; exit 5"}, "hi\n"),  # a recording of the output alone
        ],
    )
    steps = replay(path)
    assert [s.verdict for s in steps] == ["differs", "differs", "same", "same", "same"]
    assert [(s.exit_recorded, s.exit_now) for s in steps] == [(0, 1), (1, 0), (3, 3), (4, 4), (None, 5)]
    assert steps[0].diff == "-exit code 0\n+exit code 1"


def test_times_and_orders_are_nondeterministic_and_other_changes_differ(tmp_path):
    listing = "-rw-r--r-- 1 root root 4 {} /testbed/output/f.txt\n"
    now = "ls -l --time-style=+'%b %d %H:%M' /testbed/output/f.txt"
    path = _trajectory(
        tmp_path,
        [
            ("execute_bash", {"command": "echo abc > /testbed/output/f.txt"}, bash_observation("0", "(no output)")),
            ("execute_bash", {"command": now}, bash_observation("0", listing.format("Jan 19 09:30"))),
            ("execute_bash", {"command": "date -u +%F"}, bash_observation("0", "2026-01-19\n")),
            ("execute_bash", {"command": "printf 'a\\nb\\nc\\n'"}, bash_observation("0", "c\na\nb\n")),
            ("execute_bash", {"command": "echo \"{'x', 'y', 'z'}\""}, bash_observation("0", "{'z', 'x', 'y'}\n")),
            ("execute_bash", {"command": "printf 'a\\nb\\n'"}, bash_observation("0", "a\nc\n")),
            ("execute_bash", {"command": "echo 11:00"}, bash_observation("Error: Exit code 1", "09:30\n")),
        ],
    )
    steps = replay(path)
    assert [s.verdict for s in steps] == ["same"] + ["nondeterministic"] * 4 + ["differs", "differs"]
    assert "-c\n+b" in steps[5].diff


def test_input_dir_is_copied_to_testbed_input(tmp_path):
    inputs = tmp_path / "in"
    (inputs / "sub").mkdir(parents=True)
    (inputs / "theme.json").write_text('{"name": "Luna"}\n')
    (inputs / "sub" / "deep.txt").write_text("deep\n")
    view = 'Here\'s the result of running `cat -n` on /testbed/input/theme.json:\n     1\t{"name": "Luna"}\n     2\t'
    path = _trajectory(
        tmp_path,
        [
            ("str_replace_editor", {"command": "view", "path": "/testbed/input/theme.json"}, view),
            ("execute_bash", {"command": "cat input/sub/deep.txt"}, bash_observation("0", "deep\n")),
        ],
    )
    assert [s.verdict for s in replay(path, input_dir=inputs)] == ["same", "same"]
    assert [s.verdict for s in replay(path)] == ["differs", "differs"]
    cli = [*JAILBOX, "replay", "--network", "none"]
    r = subprocess.run(
        [*cli, str(path), str(path), "--input_dir", str(inputs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("trajectory  steps") :].splitlines()
    assert table == [
        "trajectory  steps  same  differs  network  nondeterministic",
        "t0              2     2        0        0                 0",
        "t0              2     2        0        0                 0",
        "4 same, 0 differ, 0 used the network, 0 nondeterministic",
    ]


@pytest.mark.needs("shared-data")
@pytest.mark.parametrize(
    ("name", "nondeterministic", "random"),
    [
        ("math", [], []),
        # instruct prints two Python sets, and its random search (step 38) samples a list made from a set:
        # hash order, whatever the seed
        ("instruct", [2, 38, 42], []),
    ],
)
def test_offline_trajectories_reproduce_with_the_host_rootfs(with_python, name, nondeterministic, random):
    steps = replay(REFERENCE / f"trajectory_{name}.json", with_python)
    for step in steps:
        print(f"step {step.index}: {step.verdict:16} {step.action[:70]}")
    expected = {s.index: "same" for s in steps} | dict.fromkeys(nondeterministic, "nondeterministic")
    expected |= dict.fromkeys(random, "differs")
    assert {s.index: s.verdict for s in steps} == expected


EXAMPLES = REFERENCE.parent / "reference-examples"


@pytest.mark.slow
@pytest.mark.root  # the tree takes minutes to build: CI builds it in the root pass only (paper_tree)
@pytest.mark.paper_tree
@pytest.mark.timeout(3600)  # the build, if the tests before left it unfinished
@pytest.mark.needs("shared-data")
@pytest.mark.parametrize(
    ("name", "inputs", "nondeterministic", "differs"),
    [
        ("math", None, [], []),
        # two Python sets printed, and a seeded random search over a list made from a set (hash order)
        ("instruct", None, [2, 38, 42], []),
        # readdir order of grep -r; the reference's edits added a blank line to answer.txt, ours keep its bytes
        ("longcontext", "09_long_context", [1, 16, 22], [24, 25]),
        # `ls -l` times (step 16's `file` error now follows its stdout with nothing between, as recorded)
        ("travel", None, [3, 11, 16, 24], []),
    ],
)
def test_offline_trajectories_reproduce_on_the_paper_environment(monkeypatch, name, inputs, nondeterministic, differs):
    """The default recipe's tree (built once and kept: ``paper_tree``), with no network, answers every
    deterministic step of the paper's offline runs as the reference image did."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(paper_store()))
    input_dir = EXAMPLES / inputs / "input" if inputs else None
    steps = replay(REFERENCE / f"trajectory_{name}.json", SandboxConfig(rootfs="default"), input_dir=input_dir)
    for step in steps:
        print(f"step {step.index}: {step.verdict:16} {step.action[:70]}")
    expected = {s.index: "same" for s in steps} | dict.fromkeys(nondeterministic, "nondeterministic")
    expected |= dict.fromkeys(differs, "differs")
    assert {s.index: s.verdict for s in steps} == expected


def test_a_bare_recording_is_compared_with_every_line_and_a_full_one_with_the_cut(tmp_path):
    every = "".join(f"{n}\n" for n in range(1, 101))
    divider = "-" * 50
    cut = "\n".join([*map(str, range(1, 41)), divider, "<Observation truncated in middle for saving context>"])
    cut += "\n" + "\n".join([divider, *map(str, range(61, 101))])
    path = _trajectory(
        tmp_path,
        [
            ("execute_bash", {"command": "seq 1 100"}, every),
            ("execute_bash", {"command": "seq 1 100"}, bash_observation("0", cut)),
            ("execute_bash", {"command": "seq 1 100"}, bash_observation("0", every)),
        ],
    )
    assert [s.verdict for s in replay(path)] == ["same", "same", "differs"]


def test_a_bare_recording_is_stdout_then_stderr_with_nothing_between(tmp_path):
    path = _trajectory(
        tmp_path,
        [
            ("execute_bash", {"command": "echo Composing...; echo Traceback >&2; exit 1"}, "Composing...\nTraceback\n"),
            ("execute_bash", {"command": "printf 'no newline'; echo err >&2"}, "no newlineerr\n"),
        ],
    )
    assert [s.verdict for s in replay(path)] == ["same", "same"]


def test_a_bare_recording_drops_carriage_returns_and_colour_escapes_as_the_reference_did(tmp_path):
    """dpkg's "(Reading database ... 5%" progress is rewritten in place with "\\r"; the reference's bare
    recordings show the pieces run together, and colour codes gone, on both streams."""
    progress = r"printf '(Reading database ... \r(Reading database ... 50%%\r(Reading database ... 9 files.)\n'"
    colour = r"printf '\033[1;31mred\033[0m\r\n' >&2"
    path = _trajectory(
        tmp_path,
        [
            (
                "execute_bash",
                {"command": f"{progress}; {colour}"},
                "(Reading database ... (Reading database ... 50%(Reading database ... 9 files.)\nred\n",
            ),
            ("execute_bash", {"command": progress}, "(Reading database ... 9 files.)\n"),
        ],
    )
    assert [s.verdict for s in replay(path)] == ["same", "differs"]


def test_what_differs_after_a_network_step_because_of_it_is_network_and_says_which_step(tmp_path):
    """Offline, the installs and downloads the recording made fail: the steps that use what they would
    have brought differ because of them, and are counted with the network, naming the step; a difference
    that names nothing fetched stays a difference."""
    installed = "Collecting jbfoo-lib\n  Downloading jbfoo_lib-1.0-py3-none-any.whl (4 kB)\n"
    installed += "Successfully installed jbfoo-lib-1.0\n"
    path = _trajectory(
        tmp_path,
        [
            (
                "execute_bash",
                {"command": "pip install -q jbfoo-lib==1.0 2>/dev/null"},
                bash_observation("0", installed),
            ),
            ("execute_bash", {"command": "python3 -c 'import jbfoo_lib' 2>&1"}, bash_observation("0", "(no output)")),
            ("execute_bash", {"command": "curl -sS -o /tmp/rates.csv http://127.0.0.1:9/x"}, bash_observation("0", "")),
            ("execute_bash", {"command": "cat /tmp/rates.csv 2>&1"}, bash_observation("0", "usd,1.0\n")),
            ("execute_bash", {"command": "apt-get install -y jbfoo-tool >/dev/null 2>&1"}, bash_observation("0", "")),
            ("execute_bash", {"command": "jbfoo-tool --version 2>&1"}, bash_observation("0", "jbfoo-tool 2.1\n")),
            ("execute_bash", {"command": "echo 41"}, bash_observation("0", "42\n")),
            ("execute_bash", {"command": "echo 'jbfoo-lib   1.0'"}, bash_observation("0", "jbfoo-lib 1.0\n")),
        ],
    )
    steps = replay(path)
    assert [s.verdict for s in steps] == ["network"] * 6 + ["differs", "differs"]
    assert steps[7].cause.startswith("spacing only")  # the name is there, but no fetch changes column widths
    assert [s.cause for s in steps[1:6:2]] == [
        "uses jbfoo_lib, which step 1 fetched",
        "uses rates.csv, which step 3 fetched",
        "uses jbfoo-tool, which step 5 fetched",
    ]
    assert steps[6].cause == "numbers only (sizes, counts, measurements)"


def test_spacing_alone_is_a_difference_with_its_cause_not_an_order(tmp_path):
    path = _trajectory(
        tmp_path,
        [("execute_bash", {"command": "echo 'moviepy    2.2.1'"}, bash_observation("0", "moviepy 2.2.1\n"))],
    )
    (step,) = replay(path)
    assert step.verdict == "differs" and step.cause.startswith("spacing only"), step


def test_scripts_no_run_can_repeat_are_nondeterministic_and_say_why(tmp_path):
    """A set's hash order taken as data, and the numbers of an x264 encode (its bytes follow the thread
    count), change from run to run by design; the same differences with no such script stay differences."""
    pick = "import random\nrandom.seed(1)\nprint(random.sample(list(set(['ab', 'cd', 'ef'])), 1))\n"
    encode = "# the clip goes through write_videofile(codec='libx264')\nprint('size=2292833')\n"
    path = _trajectory(
        tmp_path,
        [
            ("execute_bash", {"command": "echo size=2292833"}, bash_observation("0", "size=2292834\n")),
            ("str_replace_editor", {"command": "create", "path": "/testbed/pick.py", "file_text": pick}, ""),
            ("execute_bash", {"command": "cd /testbed && python3 pick.py"}, bash_observation("0", "['zz']\n")),
            ("str_replace_editor", {"command": "create", "path": "/testbed/enc.py", "file_text": encode}, ""),
            ("execute_bash", {"command": "cd /testbed && python3 enc.py"}, bash_observation("0", "size=2345901\n")),
            ("execute_bash", {"command": "echo total 2.3M"}, bash_observation("0", "total 2.2M\n")),
            ("execute_bash", {"command": "echo total 2.3M"}, bash_observation("0", "total 2.3G\n")),
            ("execute_bash", {"command": "echo '[image2 @ 0x556f7b1168c0] Dec  1 07:54 speed=0.126x'"},
             bash_observation("0", "[image2 @ 0x5584947f79c0] Jan 19 09:35 speed=0.674x\n")),
        ],
    )  # fmt: skip
    steps = replay(path)
    verdicts = [(s.verdict, s.cause) for s in steps if s.action.startswith("execute_bash")]
    assert [v for v, _ in verdicts] == ["differs"] + ["nondeterministic"] * 3 + ["differs", "nondeterministic"]
    assert "hash order" in verdicts[1][1]
    assert verdicts[2][1] == verdicts[3][1] and "step 5 encoded" in verdicts[2][1] and "thread count" in verdicts[2][1]
