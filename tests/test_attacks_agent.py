"""The attack battery, agent side: a tasks file is data, the jail cannot forge or reach past its record, and
an LLM endpoint cannot take the host's memory, disk or time.

A tasks file comes from anywhere: it may name scorers only by name (built-ins, ``--scorer-module``, the
``jailbox.scorers`` entry points) and input files only beneath its inputs root, never through ``..``, an
absolute path or a symlink. A jailed command controls everything in the jail's output directory; the host's
output directory is the host's alone, and whatever links an earlier run left there, every host path outside
it stays untouched (content, mode, listing). The model's endpoint (and the judge's) is a peer like any other:
whatever it sends, and however slowly, the jailbox process holds a bounded amount of it, records a bounded
amount and waits a bounded time. Each class is tried several ways, through ``jailbox run`` and
``jailbox bench`` as a user types them, against the scripted model server and real jails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import snapshot
from support.batch_tasks import ROOT, bench_command
from support.cli import JAILBOX
from support.llm_server import MiB, ScriptedServer, Step, filled, filler, gzipped, reply

from jailbox.agent.environment import Environment
from jailbox.agent.tasks import Task, read_results
from jailbox.agent.trajectory import load as load_trajectory

JAILBOX_RUN = [*JAILBOX, "run"]


def obeying(request: dict) -> Step:
    """A model that runs the shell command its task states (``RUN: <command>``), then submits."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        call = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    else:
        command = re.search(r"RUN: (.*?)\n</task>", messages[1]["content"], re.S).group(1)
        arguments = json.dumps({"command": command})
        call = {"id": "c", "type": "function", "function": {"name": "execute_bash", "arguments": arguments}}
    return reply(None, tool_calls=[call], finish_reason="tool_calls", usage={"total_tokens": 3})


@pytest.fixture
def server():
    with ScriptedServer(responder=obeying) as scripted:
        yield scripted


def write_tasks(path: Path, *tasks: dict) -> Path:
    path.write_text("".join(json.dumps({"answer": "x", **t}) + "\n" for t in tasks))
    return path


def bench(tasks: Path, server: ScriptedServer, out: Path, *options: str, cwd: Path = ROOT, env=None):
    command = bench_command(tasks, server.url, out, "--workers", "2", *options)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("jailbox: ")]  # the CLI's one-line errors
    assert len(lines) == 1, stderr
    return lines[0]


def results(out: Path) -> dict:
    return {r.id: r for r in read_results(out / "results.jsonl")}


# --- 3. a tasks file is data: scorers ------------------------------------------------------------


@pytest.mark.parametrize(
    "scorer", ["os:popen", "os.popen", "subprocess:getoutput", "json:dumps", "jailbox.agent.scoring:rouge_l"]
)
def test_a_tasks_file_cannot_name_code_as_its_scorer(tmp_path, server, scorer):
    marker = tmp_path / "ran-on-the-host"
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        {"id": "t0", "query": "RUN: echo a > /testbed/output/answer.txt"},
        {
            "id": "t1",
            "query": f"RUN: printf 'touch {marker}' > /testbed/output/answer.txt",
            "answer": "r",
            "scorer": scorer,
        },
        {"id": "t2", "query": "RUN: echo a > /testbed/output/answer.txt"},
    )
    r = bench(tasks, server, tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    line = error_line(r.stderr)
    assert "'t1'" in line and "scorer" in line and repr(scorer) in line
    assert all(name in line for name in ("exact", "choice", "multi_choice", "math", "rouge_l"))
    assert not marker.exists() and server.requests == []  # refused before anything ran
    assert not (tmp_path / "out" / "tasks").exists()


@pytest.mark.parametrize(
    "line",
    [
        '{"id": "t1", "query": "q", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        json.dumps({"id": "t1", "query": "q", "input_files": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"}),
        "{" * 100_000,
    ],
    ids=["a field", "input_files as a string", "unclosed"],
)
def test_a_tasks_file_nested_past_the_parser_is_refused_in_one_line(tmp_path, server, line):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "query": "q", "answer": "x"}) + "\n" + line + "\n")
    r = bench(tasks, server, tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    assert error_line(r.stderr).startswith(f"jailbox: TASKS: {tasks}:2: ")
    assert server.requests == []


@pytest.mark.slow
def test_custom_scorers_come_from_the_command_line_or_installed_entry_points(tmp_path, server):
    modules, site = tmp_path / "modules", tmp_path / "site"
    modules.mkdir()
    (modules / "mine.py").write_text("def half(answer, expected):\n    return 0.5\n")
    (modules / "theirs.py").write_text("def lenient(answer, expected):\n    return 0.25\n")
    dist = site / "mine_scorers-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mine-scorers\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[jailbox.scorers]\nlenient = theirs:lenient\n")
    paths = [str(modules), str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        {"id": "t0", "query": "RUN: echo a > /testbed/output/answer.txt", "scorer": "half"},
        {"id": "t1", "query": "RUN: echo a > /testbed/output/answer.txt", "scorer": "lenient"},
    )
    refused = bench(tasks, server, tmp_path / "refused", env=env)
    assert refused.returncode == 2 and "'t0'" in error_line(refused.stderr) and "'half'" in refused.stderr
    assert "lenient" in error_line(refused.stderr)  # the entry point is a valid name
    r = bench(tasks, server, tmp_path / "out", "--scorer-module", "mine", env=env)
    assert r.returncode == 0, r.stderr
    scored = results(tmp_path / "out")
    assert (scored["t0"].score, scored["t1"].score) == (0.5, 0.25)


# --- 3. a tasks file is data: input files --------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    """A tasks file's directory: a data file, and links planted inside it that point outside."""
    top = tmp_path / "tasks"
    (top / "data").mkdir(parents=True)
    (top / "data" / "n.txt").write_text("6 7\n")
    (top / "link").symlink_to(outside / "secret")
    (top / "linkdir").symlink_to(outside)
    (top / "data" / "deep").symlink_to("../../outside/secret")
    return top


def reading(value: str) -> dict:
    """A task whose agent copies its input file into its answer, whatever the input is."""
    return {
        "id": "t1",
        "query": "RUN: cat /testbed/input/x /testbed/input/x/secret > /testbed/output/answer.txt 2>&1; true",
        "input_files": {"/testbed/input/x": value},
    }


GOOD = {"id": "t0", "query": "RUN: cat /testbed/input/n > /testbed/output/answer.txt", "input_files": {}}


@pytest.mark.parametrize(
    "value", ["@{outside}/secret", "@../outside/secret", "@data/../../outside/secret", "@./data/../../outside"]
)
def test_absolute_and_dotdot_inputs_are_refused_before_anything_runs(tmp_path, server, root, outside, value):
    tasks = write_tasks(root / "tasks.jsonl", reading(value.format(outside=outside)))
    r = bench(tasks, server, tmp_path / "out", cwd=root)
    assert r.returncode == 2, r.stdout + r.stderr
    line = error_line(r.stderr)
    assert "'t1'" in line and "input_files['/testbed/input/x']" in line
    assert server.requests == []


@pytest.mark.parametrize("value", ["@link", "@linkdir/secret", "@linkdir", "@data/deep"])
@pytest.mark.slow
def test_inputs_through_symlinks_are_refused_where_the_task_runs(tmp_path, server, root, value):
    good = {**GOOD, "input_files": {"/testbed/input/n": "@data/n.txt"}}
    tasks = write_tasks(root / "tasks.jsonl", good, reading(value))
    r = bench(tasks, server, tmp_path / "out", cwd=root)
    assert r.returncode == 0, r.stderr
    done = results(tmp_path / "out")
    assert done["t0"].answer == "6 7" and done["t0"].error is None
    assert done["t1"].answer is None and done["t1"].exit_status == "error"
    assert "'t1'" in done["t1"].error and "input_files['/testbed/input/x']" in done["t1"].error
    assert "symlink" in done["t1"].error
    assert "host secret" not in (tmp_path / "out" / "results.jsonl").read_text()


@pytest.mark.slow
def test_inputs_come_from_the_inputs_root_when_one_is_given(tmp_path, server, root):
    elsewhere = tmp_path / "inputs"
    elsewhere.mkdir()
    (elsewhere / "n.txt").write_text("8 9\n")
    tasks = write_tasks(root / "tasks.jsonl", {**GOOD, "input_files": {"/testbed/input/n": "@n.txt"}})
    r = bench(tasks, server, tmp_path / "out", "--inputs-root", str(elsewhere))
    assert r.returncode == 0, r.stderr
    assert results(tmp_path / "out")["t0"].answer == "8 9"
    r = bench(tasks, server, tmp_path / "beside", cwd=elsewhere)  # the default root is the tasks file's own
    assert "No such file" in results(tmp_path / "beside")["t0"].error


# --- 4. the jail cannot forge its own record -----------------------------------------------------

FORGED = json.dumps({"version": 1, "problem_statement": "forged", "exit_status": "submitted", "answer": "42"})


def jailbox_run(server: ScriptedServer, out: Path, command: str, *options: str):
    flags = ["--query", f"RUN: {command}", "--llm_name", "m", "--llm_base_url", server.url, "--api_key", "k"]
    flags += ["--network", "none"]  # run's default, full, needs /dev/net/tun; these attacks need no network
    return subprocess.run(
        [*JAILBOX_RUN, *flags, "--output_dir", str(out), "--json", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_of(result: subprocess.CompletedProcess) -> Path:
    """The directory ``jailbox run`` made for this run (``OUTPUT_DIR/YYYYMMDD_HHMMSS``), from its JSON summary."""
    assert result.returncode == 0, result.stderr
    return Path(json.loads(result.stdout.splitlines()[-1])["output_dir"])


def plant_host_links(out: Path, outside: Path) -> None:
    """What an earlier run that let the jail write into ``out`` could have left there."""
    for name in ("trajectory.json", "answer.txt", "sub", "dirlink"):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    (out / "trajectory.json").symlink_to(outside / "secret")
    (out / "answer.txt").symlink_to(outside / "secret")
    (out / "sub").symlink_to(outside)
    (out / "dirlink").symlink_to(outside / "sub")


@pytest.mark.slow
def test_jailbox_run_twice_the_record_is_the_hosts_and_nothing_outside_changes(tmp_path, server, outside):
    out = tmp_path / "out"
    before = snapshot(outside)
    plants = (
        f"cd /testbed/output && printf '%s' '{FORGED}' > trajectory.json && ln -s {outside}/secret planted"
        f" && ln -s {outside} dirlink && mkdir sub && echo x > sub/x && head -c 3000000 /dev/zero > big"
        " && echo 42 > answer.txt"
    )
    for attempt in range(2):
        run = run_of(jailbox_run(server, out, plants))
        assert snapshot(outside) == before
        saved = load_trajectory(run / "trajectory.json")
        assert saved.problem_statement.startswith("RUN: cd /testbed/output") and len(saved.steps) == 2
        assert not (run / "trajectory.json").is_symlink() and (run / "files" / "answer.txt").read_text() == "42\n"
        assert not (run / "files" / "answer.txt").is_symlink()
        assert {p.name for p in (run / "files").iterdir()} == {"answer.txt"}
        if attempt == 0:
            plant_host_links(out, outside)
            plant_host_links(run / "files", outside)


@pytest.mark.slow
def test_copied_outputs_are_only_those_asked_for_and_never_follow_links(tmp_path, server, outside):
    out = tmp_path / "out"
    before = snapshot(outside)
    plants = (
        f"cd /testbed/output && mkdir -p sub/deeper dirlink && echo x > sub/x && ln -s {outside}/secret sub/deeper/l"
        " && echo y > dirlink/y && echo 1 > answer.txt && echo no > other"
    )
    asked = ["--copy-out", "sub", "--copy-out", "dirlink/y"]
    plant_host_links(run_of(jailbox_run(server, out, plants, *asked)) / "files", outside)
    files = run_of(jailbox_run(server, out, plants, *asked)) / "files"
    assert snapshot(outside) == before
    assert (files / "sub" / "x").read_text() == "x\n" and not (files / "sub").is_symlink()
    assert os.readlink(files / "sub" / "deeper" / "l") == f"{outside}/secret"  # copied as a link, never read
    assert (files / "dirlink" / "y").read_text() == "y\n" and not (files / "dirlink").is_symlink()
    assert not (files / "other").exists()
    for bad in ("../x", "/etc", "trajectory.json", "answer.txt/x"):
        refused = jailbox_run(server, tmp_path / "never", "true", "--copy-out", bad)
        assert refused.returncode == 2 and "copy-out" in error_line(refused.stderr)


@pytest.mark.slow
def test_an_answer_is_bounded_and_the_record_says_when_it_was_cut(tmp_path, server):
    cut = "larger than 1048576 bytes"
    for n, command in enumerate(
        [
            "head -c 1048577 /dev/zero > /testbed/output/answer.txt",
            "head -c 5000000 /dev/urandom > /testbed/output/answer.txt",
            "yes | head -c 3000000 > /testbed/output/answer.txt",
        ]
    ):
        summary = json.loads(jailbox_run(server, tmp_path / f"out{n}", command).stdout.splitlines()[-1])
        assert summary["answer"] is None and cut in summary["error"]
        run = Path(summary["output_dir"])
        assert not (run / "files" / "answer.txt").exists()
        assert cut in load_trajectory(run / "trajectory.json").error
    r = jailbox_run(server, tmp_path / "exact", "head -c 1048576 /dev/zero | tr '\\0' a > /testbed/output/answer.txt")
    assert (run_of(r) / "files" / "answer.txt").read_bytes() == b"a" * (1 << 20)


IDS = ["..", ".", "a/b", "a_b", ".hidden", "", "x" * 300, "y" * 300, "a\u0000b", "../../escape"]


@pytest.mark.slow
def test_bench_task_directories_and_resume_stay_in_the_output_directory(tmp_path, server, outside):
    out = tmp_path / "out"
    before = snapshot(outside)
    tasks = [{"id": i, "query": f"RUN: echo {n} > /testbed/output/answer.txt"} for n, i in enumerate(IDS)]
    first = write_tasks(tmp_path / "first.jsonl", tasks[0])
    assert bench(first, server, out).returncode == 0
    # links an earlier run could have left: a task directory, an output directory, a trajectory
    (out / "tasks").mkdir(exist_ok=True)
    (out / "tasks" / "a%2Fb").symlink_to(outside)
    (out / "tasks" / "a_b").mkdir()
    (out / "tasks" / "a_b" / "output").symlink_to(outside / "sub")
    (out / "tasks" / "a_b" / "trajectory.json").symlink_to(outside / "secret")
    everything = write_tasks(tmp_path / "all.jsonl", *tasks)
    r = bench(everything, server, out, "--resume")
    assert r.returncode == 0, r.stderr
    assert snapshot(outside) == before
    done = results(out)
    assert sorted(done) == sorted(IDS) and all(done[i].answer == str(n) for n, i in enumerate(IDS))
    assert sorted(p.name for p in out.iterdir()) == ["results.jsonl", "summary.json", "summary.md", "tasks"]
    found = {}
    for directory in (out / "tasks").iterdir():
        assert not directory.name.startswith(".") and directory.is_dir() and not directory.is_symlink()
        n = int(load_trajectory(directory / "trajectory.json").problem_statement.split()[2])
        assert n not in found and (directory / "output" / "answer.txt").read_text() == f"{n}\n"
        found[n] = directory.name
    assert sorted(found) == list(range(len(IDS)))  # every task its own directory


# --- hostfs: the two writes the agent's record needs ---------------------------------------------


def test_a_record_replaced_over_planted_links_never_writes_through_them(tmp_path, outside):
    from jailbox.sandbox.hostfs import Destination

    before = snapshot(outside)
    out = tmp_path / "out"
    out.mkdir()
    (out / "trajectory.json").symlink_to(outside / "secret")
    (out / "answer.txt").symlink_to(outside / "secret")
    (out / "keep").mkdir()
    with Destination(out) as d:
        d.replace("trajectory.json", b"{}")
        d.unlink("answer.txt")
        d.unlink("keep")  # a directory stays
        d.unlink("absent")
    assert snapshot(outside) == before
    assert (out / "trajectory.json").read_bytes() == b"{}" and not (out / "trajectory.json").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["keep", "trajectory.json"]  # no temporary file left


# --- the RL environment: the same rules ----------------------------------------------------------


def test_the_environment_holds_tasks_to_the_same_rules(tmp_path, root, outside):
    with Environment(inputs_root=root) as env:
        with pytest.raises(ValueError, match=r"task 'e1': scorer 'os:popen' is unknown; valid names: exact"):
            env.reset(Task(id="e1", query="q", answer="r", scorer="os:popen"))
        for value in (f"@{outside}/secret", "@../outside/secret", "@link", "@linkdir/secret"):
            task = Task(id="e2", query="q", input_files={"/testbed/input/x": value})
            with pytest.raises(ValueError, match=r"task 'e2': input_files\['/testbed/input/x'\]"):
                env.reset(task)
        env.reset(Task(id="e3", query="q", answer="6 7", input_files={"/testbed/input/x": "@data/n.txt"}))
        env.step("execute_bash", {"command": "cp /testbed/input/x /testbed/output/answer.txt"})
        assert env.step("submit").reward == 1.0
        env.reset(Task(id="e4", query="q", answer="a"))
        env.step("execute_bash", {"command": "head -c 2000000 /dev/zero > /testbed/output/answer.txt"})
        last = env.step("submit")
        assert (last.answer, last.reward) == (None, 0.0)


# --- the Ray executor: inputs opened on the node, files written back by the driver ----------------


@pytest.mark.slow
@pytest.mark.needs("ray")
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time: with another beside it, a raylet died
def test_ray_reads_inputs_by_the_same_rules_and_writes_back_through_the_same_guard(tmp_path, server, root, outside):
    before = snapshot(outside)
    out = tmp_path / "out"
    (out / "tasks" / "t0").mkdir(parents=True)
    (out / "tasks" / "t0" / "output").symlink_to(outside / "sub")  # as an earlier run could have left it
    (out / "tasks" / "t1").symlink_to(outside)
    good = {
        **GOOD,
        "query": f"RUN: {GOOD['query'][5:]} && mkdir /testbed/output/k && ln -s {outside}/secret /testbed/output/k/l",
        "input_files": {"/testbed/input/n": "@data/n.txt"},
    }
    tasks = write_tasks(root / "tasks.jsonl", good, reading("@link"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="jbray-", dir="/tmp"))  # Ray's socket paths must be short
    try:
        env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
        # --resume: the planted directory is an earlier run's, which bench refuses to start over in
        r = bench(tasks, server, out, "--executor", "ray", "--copy-out", "k", "--resume", cwd=root, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert snapshot(outside) == before
    done = results(out)
    assert done["t0"].answer == "6 7" and "symlink" in done["t1"].error and "input_files" in done["t1"].error
    assert (out / "tasks" / "t0" / "output" / "answer.txt").read_text() == "6 7\n"
    assert not (out / "tasks" / "t0" / "output").is_symlink() and not (out / "tasks" / "t1").is_symlink()
    assert not (out / "tasks" / "t0" / "output" / "k" / "l").exists()  # links are not sent back


# --- 5. a hostile LLM endpoint -------------------------------------------------------------------

# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child's starts at its parent's (pytest's)
RSS_PROBE = (
    "import atexit, re, sys\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    sys.stderr.write('peak %s\\n' % re.search(r'VmHWM:\\s*(\\d+) kB', status).group(1))\n"
    "atexit.register(peak)\n"
    "from jailbox.cli import main\n"
    "main()\n"
)
GiB = 1 << 30
LIMIT = 16 * MiB  # the default --llm-max-reply


def measured(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """``jailbox ARGS`` as a user types it, and the most memory its process held (its resident set's peak)."""
    r = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    found = re.search(r"^peak (\d+)$", r.stderr, re.M)
    assert found, r.stderr
    return r, int(found.group(1)) * 1024


def run_against(server: ScriptedServer, out: Path, *options: str) -> tuple[dict, subprocess.CompletedProcess, int]:
    """``jailbox run --network none`` against ``server``: its JSON summary, the process and its peak memory."""
    flags = ["--llm_name", "m", "--llm_base_url", server.url, "--api_key", "k", "--network", "none"]
    r, rss = measured("run", "--query", "6*7?", *flags, "--output_dir", str(out), "--json", *options)
    return json.loads(r.stdout.splitlines()[-1]), r, rss


def written(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def quiet_rss(tmp_path_factory) -> int:
    """The peak memory of a run whose one step is a short reply: what every run costs anyway."""
    with ScriptedServer([reply("I am done.")]) as server:
        summary, _, rss = run_against(server, tmp_path_factory.mktemp("quiet"), "--max-steps", "1")
    assert summary["exit_status"] == "max_steps"
    return rss


HUGE = [
    pytest.param(Step(stream=filler(GiB), length=filled(GiB)), id="content-length"),
    pytest.param(Step(stream=filler(GiB), close=True), id="no-length-until-close"),
    pytest.param(Step(stream=filler(GiB)), id="chunked"),
    pytest.param(Step(stream=lambda: [gzipped(GiB)], headers={"Content-Encoding": "gzip"}), id="gzip-bomb"),
    pytest.param(Step(status=502, stream=filler(GiB)), id="error-page"),
    pytest.param(
        Step(stream=filler(14 * MiB, tail=b'", "x": [' + b"[]," * (MiB // 3) + b"[]]}}]}")), id="small-values"
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("step", HUGE)
def test_a_huge_reply_costs_the_host_no_more_than_the_reply_limit(tmp_path, quiet_rss, step):
    """A GiB of reply, one string of a chat completion's content however it is framed or compressed (gzip
    inflating 1000:1), took `jailbox run` to 8.3 GB of memory and 3.2 GB of record; 16 MiB of small values,
    parsed, to about a GiB. The reply is read to 16 MiB, decoded, its values counted before it is parsed, and
    the run ends llm_error in one line naming the flag that raises the bound; it is not asked again."""
    with ScriptedServer([step]) as server:
        summary, r, rss = run_against(server, tmp_path / "out")
        assert len(server.requests) == 1
    assert summary["exit_status"] == "llm_error" and summary["steps"] == 0
    assert "max_reply_bytes (16777216 bytes)" in summary["error"]
    assert "--llm-max-reply" in error_line(r.stderr)
    assert rss - quiet_rss < 3 * LIMIT, f"{(rss - quiet_rss) / MiB:.0f} MiB over a quiet run"
    assert written(tmp_path / "out") < 64 * 1024


@pytest.mark.slow
def test_replies_within_the_limit_leave_a_bounded_record_whatever_usage_says(tmp_path, quiet_rss):
    """Replies just under the limit, of a content string or of unknown fields, each saying it used one token:
    the conversation counts at least a token per 16 characters whatever a server says it counted, so no second
    request goes out, and the record holds the one reply (a run of three such steps wrote about 0.5 GB)."""
    content = "a" * (LIMIT - 4096)
    lying = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    for n, step in enumerate([reply(content, usage=lying), reply("hi", usage=lying, extra=[content])]):
        with ScriptedServer([step] * 3) as server:
            summary, _, rss = run_against(server, tmp_path / f"out{n}", "--max-steps", "3")
            assert len(server.requests) == 1
        assert summary["exit_status"] == "token_limit" and summary["steps"] == 1
        assert rss - quiet_rss < 8 * LIMIT, f"{(rss - quiet_rss) / MiB:.0f} MiB over a quiet run"
        assert written(tmp_path / f"out{n}") < 4 * LIMIT


@pytest.mark.slow
def test_thousands_of_tool_calls_in_a_reply_run_at_most_64(tmp_path):
    """Each call's observation is bounded, their number was not: 3000 calls printing 40 kB each ran 3000
    commands and recorded 90 MB. The first 64 run; every other one is answered that it was not."""
    command = json.dumps({"command": "yes | head -c 40000"})
    call = {"type": "function", "function": {"name": "execute_bash", "arguments": command}}
    calls = [{"id": f"c{n}", **call} for n in range(3000)]
    with ScriptedServer([reply(None, tool_calls=calls, finish_reason="tool_calls")]) as server:
        summary, _, _ = run_against(server, tmp_path / "out", "--max-steps", "2")
    assert summary["exit_status"] == "token_limit" and summary["steps"] == 1
    [step] = load_trajectory(Path(summary["output_dir"]) / "trajectory.json").steps
    assert len(step.actions) == len(step.observations) == 3000
    assert sum(facts is not None for facts in step.exec) == 64
    assert all(o.startswith("Not run: a reply may make at most 64 tool calls") for o in step.observations[64:])
    assert "this was call 3000 of 3000" in step.observations[-1]
    assert written(tmp_path / "out") < 16 * MiB


TRICKLES = [
    pytest.param(Step(stream=lambda: iter([b" "] * 100_000), close=True, gap=0.2), id="body"),
    pytest.param(Step(stream=lambda: [b"{}"], length=2, trickle_head=True, gap=0.2), id="status-line-and-headers"),
]


@pytest.mark.parametrize("step", TRICKLES)
@pytest.mark.slow
def test_a_trickling_endpoint_holds_a_run_no_longer_than_the_deadline(tmp_path, step):
    """A byte every 0.2 s keeps every read within its ten minutes: the run waited for ever. The whole request
    has a deadline (--llm-timeout), past which the run ends llm_error, naming the flag; not asked again."""
    with ScriptedServer([step]) as server:
        summary, r, _ = run_against(server, tmp_path / "out", "--llm-timeout", "3")
        assert len(server.requests) == 1
    assert summary["exit_status"] == "llm_error"
    assert "no whole reply within timeout.total (3 s)" in summary["error"]
    assert "--llm-timeout" in error_line(r.stderr)


@pytest.mark.slow
def test_bench_bounds_the_models_and_the_judges_replies(tmp_path):
    """`jailbox bench` holds its model's endpoint and its judge's to the same bounds: a gzip bomb from the
    model is every task's llm_error, one from the judge is the task's error, and neither costs the bench's
    process more than the limit allows over the same bench with quiet endpoints."""
    in_jail = write_tasks(tmp_path / "jail.jsonl", {"id": "t0", "query": "RUN: echo x > /testbed/output/answer.txt"})
    judged = write_tasks(tmp_path / "judged.jsonl", {"id": "p", "query": "q", "answer": "d", "scorer": "judge"})
    bomb = Step(raw=gzipped(GiB), headers={"Content-Encoding": "gzip"})

    def measured_bench(tasks: Path, model: ScriptedServer, judge: ScriptedServer, out: Path, *options: str):
        flags = ["--judge-model", "j", "--judge-base-url", judge.url, "--judge-repeats", "1", *options]
        return measured(*bench_command(tasks, model.url, out, *flags)[3:])

    with ScriptedServer(responder=obeying) as model:
        _, quiet = measured_bench(in_jail, model, model, tmp_path / "quiet")
    with ScriptedServer([bomb]) as model:
        r, rss = measured_bench(in_jail, model, model, tmp_path / "a")
        assert len(model.requests) == 1
    assert r.returncode == 1 and "every task failed alike" in r.stderr and "--llm-max-reply 64M" in r.stderr
    assert "larger than max_reply_bytes" in (results(tmp_path / "a")["t0"].error or "")
    assert rss - quiet < 3 * LIMIT, f"{(rss - quiet) / MiB:.0f} MiB over a quiet bench"

    with ScriptedServer(responder=lambda _: reply("d")) as model, ScriptedServer([reply("CORRECT")]) as judge:
        _, quiet = measured_bench(judged, model, judge, tmp_path / "quiet-judge", "--mode", "llm")
    with ScriptedServer(responder=lambda _: reply("d")) as model, ScriptedServer([bomb]) as judge:
        r, rss = measured_bench(judged, model, judge, tmp_path / "b", "--mode", "llm")
        assert len(judge.requests) == 1
    result = results(tmp_path / "b")["p"]
    assert result.score == 0.0 and "scorer 'judge'" in (result.error or "")
    assert "larger than max_reply_bytes" in (result.error or "")
    assert rss - quiet < 3 * LIMIT, f"{(rss - quiet) / MiB:.0f} MiB over a quiet bench"
