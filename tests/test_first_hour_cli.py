"""A new user's first hour with the ``jailbox`` command, through real CLI processes, real jails and real
loopback servers: a command that cannot start says why; a dead or failing LLM endpoint is shown retry by
retry and ends with the fix; a bad flag (or config-file key) is one line naming the flag and a valid use;
the subordinate-id fix suggests a range no one holds; bench never loses results; and the small things a
newcomer tries first (--version, completion, examples in --help, an empty store, the config reference)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from support.batch_tasks import ROOT, bench_command, responder, tasks_file
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, error

from jailbox import cli
from jailbox.agent.tasks import read_results
from jailbox.sandbox import hostids
from jailbox.sandbox.checks import doctor

HANG_GUARD = 300


def jailbox(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JAILBOX, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def dead_port() -> int:
    """A loopback port with nothing listening (bound, never listened on, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# item 5: a command that cannot start


@pytest.mark.parametrize(
    ("command", "code", "why"),
    [
        (["nosuchcmd"], 127, "nosuchcmd: command not found"),
        (["/etc/passwd"], 126, "/etc/passwd: Permission denied"),
        (["/etc/passwd/x"], 126, "/etc/passwd/x: Not a directory"),
        (["/tmp"], 126, "/tmp: Permission denied"),
    ],
)
def test_exec_says_why_a_command_did_not_start(command: list[str], code: int, why: str) -> None:
    r = jailbox("exec", "--", *command)
    assert r.returncode == code
    assert r.stderr.startswith("jailbox: ") and r.stderr.rstrip().endswith(why), r.stderr
    assert r.stdout == ""


def test_a_streaming_caller_is_told_why_a_command_did_not_start() -> None:
    from jailbox import Sandbox

    seen: list[bytes] = []
    with Sandbox() as sb:
        r = sb.exec(["nosuchcmd"], on_stderr=seen.append)
        assert r.exit_code == 127
        assert b"".join(seen) == r.stderr_bytes and r.stderr.endswith("nosuchcmd: command not found\n")
        r = sb.exec(["sh", "-c", "echo started >&2; exit 3"], on_stderr=seen.append)  # ran: nothing added
        assert r.exit_code == 3 and seen[-1] == b"started\n"


# item 6: every CLI error names the flag and a valid example, in one line

EXEC_ERRORS = [
    (["--network", "bogus"], "--network", "--network allow:"),
    (["--network", "allow:!!"], "--network", "--network allow:"),
    (["--bind", "just-a-path"], "--bind", "--bind ./data:/testbed/data:ro"),
    (["--bind", "/no/such/dir:/x"], "--bind", "--bind ./data:/testbed/data:ro"),
    (["--env", "NOVALUE"], "--env", "--env PIP_INDEX_URL="),
    (["--env", "=x"], "--env", "--env PIP_INDEX_URL="),
    (["--workdir", "relative"], "--workdir", "--workdir /testbed"),
    (["--hostname", "a/b"], "--hostname", "--hostname sandbox"),
    (["--publish", "8080:80"], "--publish", "--network full --publish 8080:80"),
    (["--timeout", "soon"], "--timeout", "--timeout 60"),  # click's own refusals: one line too
    (["-m", "4Q"], "--memory", "--memory 4G"),
    (["--memory", "0"], "--memory", "--memory 4G"),
    (["--cpus", "0"], "--cpus", "--cpus 1.5"),
    (["--cpus", "half"], "--cpus", "--cpus 1.5"),
    (["--pids-limit", "0"], "--pids", "--pids 1024"),
    (["--disk", "lots"], "--disk", "--disk 10G"),
    (["--inodes", "10"], "--inodes", "--inodes 100000"),
]
RUN_ERRORS = [
    (["--memory", "4Q"], "--memory", "--memory 4G"),
    (["--network", "bogus"], "--network", "--network allow:"),
    (["--llm-base-url", "localhost:8000"], "--llm-base-url", "--llm-base-url http://localhost:8000/v1"),
    (["--max-steps", "0"], "--max-steps", "--max-steps 100"),
    (["--time-limit", "-1"], "--time-limit", "--time-limit 600"),
    (["--max-token-limit", "-5"], "--max-token-limit", "--max-token-limit "),
    (["--extra-body", "{"], "--extra-body", "--extra-body '{"),
    (["--extra-body", "[1]"], "--extra-body", "--extra-body '{"),
    (["--copy-out", "../x"], "--copy-out", "--copy-out results.csv"),
    (["--query", "@/no/such/file"], "--query", "--query @task.txt"),
    (["--llm-max-retries", "-1"], "--llm-max-retries", "--llm-max-retries 6"),
    (["--llm-max-reply", "lots"], "--llm-max-reply", "--llm-max-reply 64M"),
    (["--llm-timeout", "0"], "--llm-timeout", "--llm-timeout 3600"),
    (["--temperature", "hot"], "--temperature", "--temperature 0.7"),
    (["--max-tokens-per-call", "0"], "--max-tokens-per-call", "--max-tokens-per-call 4096"),
]
BENCH_ERRORS = [
    (["--workers", "0"], "--workers", "--workers 4"),
    (["--network", "bogus"], "--network", "--network allow:"),
    (["--llm-base-url", "ftp://x"], "--llm-base-url", "--llm-base-url http://"),
    (["--copy-out", "/abs"], "--copy-out", "--copy-out results.csv"),
    (["--llm-max-retries", "many"], "--llm-max-retries", "--llm-max-retries 6"),
    (["--llm-max-reply", "0"], "--llm-max-reply", "--llm-max-reply 64M"),
    (["--executor", "fibers"], "--executor", "--executor threads"),
    (["--mode", "both"], "--mode", "--mode sandbox"),
]


def one_line_naming(r: subprocess.CompletedProcess, flag: str, example: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"jailbox: {flag}"), r.stderr
    assert f"e.g. {example}" in lines[0], r.stderr
    for raw in ("validation error", "pydantic", "type=", "input_value", "Traceback"):
        assert raw not in r.stderr


@pytest.mark.parametrize(("args", "flag", "example"), EXEC_ERRORS, ids=lambda v: str(v))
def test_a_bad_exec_flag_is_one_line_naming_it(args: list[str], flag: str, example: str) -> None:
    one_line_naming(jailbox("exec", *args, "--", "true"), flag, example)


@pytest.mark.parametrize(("args", "flag", "example"), EXEC_ERRORS[:3], ids=lambda v: str(v))
@pytest.mark.slow
def test_a_bad_flag_of_shell_and_replay_is_one_line_naming_it(
    args: list[str], flag: str, example: str, tmp_path: Path
) -> None:
    one_line_naming(jailbox("shell", *args), flag, example)
    trajectory = tmp_path / "trajectory.json"
    trajectory.write_text("{}")
    one_line_naming(jailbox("replay", str(trajectory), *args), flag, example)


@pytest.mark.parametrize(("args", "flag", "example"), RUN_ERRORS, ids=lambda v: str(v))
@pytest.mark.slow
def test_a_bad_run_flag_is_one_line_naming_it(args: list[str], flag: str, example: str) -> None:
    base = ["run", "--query", "q", "--llm-name", "m", "--llm-base-url", f"http://127.0.0.1:{dead_port()}/v1"]
    one_line_naming(jailbox(*base, *args), flag, example)


@pytest.mark.parametrize(("args", "flag", "example"), BENCH_ERRORS, ids=lambda v: str(v))
@pytest.mark.slow
def test_a_bad_bench_flag_is_one_line_naming_it(args: list[str], flag: str, example: str, tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path / "tasks.jsonl", 1)
    url = f"http://127.0.0.1:{dead_port()}/v1"
    one_line_naming(jailbox(*bench_command(tasks, url, tmp_path / "out", *args)[len(JAILBOX) :]), flag, example)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("line", ['{"id": "a"}', '{"id": "a", "query": "q", "max_steps": "many"}', "not json"])
def test_a_bad_tasks_file_is_one_line_naming_the_line(line: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(line + "\n")
    r = jailbox(*bench_command(tasks, "http://127.0.0.1:9/v1", tmp_path / "out")[len(JAILBOX) :])
    one_line_naming(r, "TASKS", 'a line per task like {"id": "t1", "query": "2+2?", "answer": "4"}')
    assert f"{tasks}:1: " in r.stderr


def test_no_endpoint_at_all_names_the_flag() -> None:
    env = {"OPENAI_BASE_URL": "", "LLM_BASE_URL": ""}
    one_line_naming(
        jailbox("run", "--query", "q", "--llm-name", "m", env=env),
        "--llm-base-url",
        "--llm-base-url http://localhost:8000/v1",
    )


@pytest.mark.parametrize(
    ("section", "flag", "example"),
    [
        ("run:\n  memory: 4Q\n", "--memory", "--memory 4G"),
        ("run:\n  network: bogus\n", "--network", "--network allow:"),
        ("exec:\n  envs: [NOVALUE]\n", "--env", "--env PIP_INDEX_URL="),
        ("exec:\n  binds: [just-a-path]\n", "--bind", "--bind ./data"),
        ("run:\n  temperature: hot\n", "--temperature", "--temperature 0.7"),  # refused by click itself
        ("exec:\n  timeout: soon\n", "--timeout", "--timeout 60"),
        ("exec:\n  cpus: 0\n", "--cpus", "--cpus 1.5"),
        ("exec:\n  disk: 4Q\n", "--disk", "--disk 10G"),
    ],
)
def test_a_bad_config_file_value_names_the_flag_and_the_key(
    section: str, flag: str, example: str, tmp_path: Path
) -> None:
    (tmp_path / "jailbox").mkdir()
    (tmp_path / "jailbox" / "config.yaml").write_text(section)
    command = section.split(":")[0]
    args = ["run", "--query", "q", "--llm-name", "m"] if command == "run" else ["exec", "--", "true"]
    r = jailbox(*args, env={"XDG_CONFIG_HOME": str(tmp_path), "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    one_line_naming(r, flag, example)
    assert f"(from {tmp_path / 'jailbox' / 'config.yaml'}, key {command}." in r.stderr


@pytest.mark.parametrize("rootfs", ["/no/such/tree", "no-such-stored-name"])
def test_no_message_suggests_python_syntax_on_the_command_line(rootfs: str, store) -> None:
    r = jailbox("exec", "--rootfs", rootfs, "--", "true")
    assert r.returncode == 125
    assert '"host"' in r.stderr
    assert not re.search(r"\b[a-z_]+=[\"']", r.stderr), r.stderr  # rootfs="host" is Python, not a flag


# item 4: a dead or failing endpoint is visible while it happens, and ends with the fix


@pytest.mark.slow
def test_run_against_a_dead_port_shows_each_retry_and_ends_with_the_fix(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{dead_port()}/v1"
    r = jailbox(
        "run",
        "--network",
        "none",
        "--query",
        "q",
        "--llm-name",
        "m",
        "--llm-base-url",
        url,
        "--output-dir",
        str(tmp_path / "o"),
        "--llm_max_retries",  # 6 by default: their backoff alone would take about 30 s
        "3",
    )
    assert r.returncode == 1
    assert r.stdout.startswith("llm_error")
    retries = [line for line in r.stderr.splitlines() if line.startswith("[LLM request failed")]
    assert len(retries) == 3, r.stderr
    assert all("Connection refused" in line for line in retries)
    assert [re.search(r"retry (\d)/3", line).group(1) for line in retries] == ["1", "2", "3"]
    last = r.stderr.strip().splitlines()[-1]
    assert "Connection refused" in last and f"is a server listening on {url}?" in last


@pytest.mark.slow
def test_run_shows_server_errors_as_they_are_retried_then_goes_on(tmp_path: Path) -> None:
    failures = [error(500, "model is loading"), error(503, "overloaded"), error(500, "model is loading")]
    script = responder()
    with ScriptedServer(failures, responder=script) as server:
        query = "Task t1: what is 2*3?"
        r = jailbox(
            "run",
            "--network",
            "none",
            "--query",
            query,
            "--llm-name",
            "m",
            "--llm-base-url",
            server.url,
            "--output-dir",
            str(tmp_path),
        )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("submitted: answer='6'")
    retries = [line for line in r.stderr.splitlines() if line.startswith("[LLM request failed")]
    assert [line.split(": ")[1].split()[1] for line in retries] == ["500", "503", "500"], r.stderr
    assert "model is loading" in retries[0] and "retry 3/6" in retries[2]


def test_bench_exits_1_when_every_task_failed_for_one_infrastructure_cause(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{dead_port()}/v1"
    tasks = tasks_file(tmp_path / "tasks.jsonl", 2)
    options = ("--llm-max-retries", "1")  # each retry's backoff is time the test waits
    r = jailbox(*bench_command(tasks, url, tmp_path / "out", *options)[len(JAILBOX) :], cwd=ROOT)
    assert r.returncode == 1, r.stderr
    assert "every task failed alike" in r.stderr and "Connection refused" in r.stderr
    assert f"is a server listening on {url}?" in r.stderr
    assert len(read_results(tmp_path / "out" / "results.jsonl")) == 2


# item 7: the subordinate-id fix suggests a free range


def test_free_range_skips_every_range_in_either_file(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("alice:100000:65536\n# a comment\nbroken line\n")
    subgid.write_text("alice:100000:65536\nbob:165536:65536\n")
    assert hostids.free_range(65536, (subuid, subgid)) == 231072
    assert hostids.free_range(65536, (subuid,)) == 165536
    subuid.write_text("carol:100000:1000\ndave:200000:65536\n")  # a gap big enough for 65536, then not
    assert hostids.free_range(65536, (subuid,)) == 101000
    assert hostids.free_range(100000, (subuid,)) == 265536
    assert hostids.free_range(65536, (tmp_path / "missing",)) == 100000
    assert hostids.subuid_fix("erin", (subuid, subgid)) == (
        "sudo usermod --add-subuids 265536-331071 --add-subgids 265536-331071 erin"
    )


def test_doctor_suggests_a_range_that_no_other_user_holds(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("alice:100000:65536\n")
    subgid.write_text("alice:100000:65536\n")
    host = doctor.Host(subuid=subuid, subgid=subgid, uid=4242, user="newbie")
    probes = [doctor.id_ranges(host), doctor.rootfs_build(host)]
    fixes = [p.fix for p in probes if p.fix and "usermod" in p.fix]
    assert fixes, probes
    for fix in fixes:
        assert "--add-subuids 165536-231071 --add-subgids 165536-231071 newbie" in fix
        assert "100000-" not in fix and fix.count("sudo ") >= 1


# item 8: bench never loses results


@pytest.mark.slow
def test_bench_refuses_an_earlier_run_and_overwrite_moves_it_aside(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "out"
    with ScriptedServer(responder=responder()) as server:
        first = jailbox(*bench_command(tasks, server.url, out)[len(JAILBOX) :], cwd=ROOT)
        assert first.returncode == 0, first.stderr
        before = (out / "results.jsonl").read_text()
        again = jailbox(*bench_command(tasks, server.url, out)[len(JAILBOX) :], cwd=ROOT)
        assert again.returncode == 2 and "--output-dir" in again.stderr and "--resume" in again.stderr
        assert (out / "results.jsonl").read_text() == before
        both = jailbox(*bench_command(tasks, server.url, out, "--resume", "--overwrite")[len(JAILBOX) :], cwd=ROOT)
        assert both.returncode == 2 and (out / "results.jsonl").read_text() == before
        moved = jailbox(*bench_command(tasks, server.url, out, "--overwrite")[len(JAILBOX) :], cwd=ROOT)
        assert moved.returncode == 0, moved.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.")]
    assert len(aside) == 1 and (aside[0] / "results.jsonl").read_text() == before
    assert str(aside[0]) in moved.stderr
    assert len(read_results(out / "results.jsonl")) == 2


@pytest.mark.slow
def test_resume_keys_results_by_task_mode_and_model(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out"
    with ScriptedServer(responder=responder()) as server:

        def bench(model: str, mode: str) -> None:
            command = bench_command(tasks, server.url, out, "--resume", "--mode", mode)
            command[command.index("--llm_name") + 1] = model
            r = jailbox(*command[len(JAILBOX) :], cwd=ROOT)
            assert r.returncode == 0, r.stderr

        bench("m1", "sandbox")
        asked_before = len(server.requests)
        bench("m1", "sandbox")  # all done for this model and mode: nothing asked
        assert len(server.requests) == asked_before
        bench("m2", "sandbox")
        bench("m1", "llm")
    results = read_results(out / "results.jsonl")
    keys = sorted((r.id, r.mode, r.model) for r in results)
    assert keys == sorted(
        (f"t{i}", mode, model)
        for i in range(3)
        for mode, model in [("sandbox", "m1"), ("sandbox", "m2"), ("llm", "m1")]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert sorted({(row["mode"], row["model"]) for row in summary}) == [
        ("llm", "m1"),
        ("sandbox", "m1"),
        ("sandbox", "m2"),
    ]


# item 10: small expectations


def test_version() -> None:
    from importlib.metadata import version

    r = jailbox("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"jailbox {version('jailbox')}"


def test_an_empty_store_says_so_and_how_to_fill_it(store) -> None:
    r = jailbox("rootfs", "list", env={"JAILBOX_CACHE_DIR": str(store.root)})
    assert r.returncode == 0 and r.stdout == ""
    assert "no root filesystems stored" in r.stderr and "jailbox rootfs pull" in r.stderr
    assert "jailbox rootfs build" in r.stderr
    assert json.loads(jailbox("rootfs", "list", "--json", env={"JAILBOX_CACHE_DIR": str(store.root)}).stdout) == []


def test_shell_completion_prints_a_script() -> None:
    for shell in ("bash", "zsh", "fish"):
        r = subprocess.run(
            [str(Path(sys.executable).parent / "jailbox")],  # the installed script: completion keys on its name
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "_JAILBOX_COMPLETE": f"{shell}_source"},
        )
        assert r.returncode == 0 and "_JAILBOX_COMPLETE" in r.stdout, (shell, r.stderr)


def all_commands() -> list[list[str]]:
    found: list[list[str]] = [[]]

    def walk(group, path: list[str]) -> None:
        for name, command in group.commands.items():
            found.append([*path, name])
            if hasattr(command, "commands"):
                walk(command, [*path, name])

    walk(cli.main, [])
    return found


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: " ".join(c) or "jailbox")
def test_every_command_help_has_an_example(command: list[str]) -> None:
    r = jailbox(*command, "--help")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "Example:")
    assert lines[at + 1].strip().startswith("jailbox ") or "jailbox " in lines[at + 1], r.stdout


JAIL_COMMANDS = [["exec", "--", "true"], ["shell"], ["create"], ["run", "--query", "q"], ["bench", "tasks.jsonl"]]


@pytest.mark.parametrize("command", JAIL_COMMANDS, ids=lambda c: c[0])
def test_a_misspelt_option_is_refused_with_the_closest_one(command: list[str], tmp_path: Path) -> None:
    """Placed before ``--``, an option the command does not know is click's usage error naming it, never
    the command to run: on every command that makes a jail, each of which takes --memory."""
    (tmp_path / "tasks.jsonl").write_text("")
    r = jailbox(command[0], "--memroy", "1g", *command[1:], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    last = r.stderr.rstrip().splitlines()[-1]
    assert last.startswith("Error: No such option '--memroy'. ") and "'--memory'" in last, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: " ".join(c) or "jailbox")
def test_help_lists_each_option_once_with_its_aliases_beside_it(command: list[str]) -> None:
    r = jailbox(*command, "--help")
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split("\nOptions:\n", 1)[1]
    entries = [sorted(m.group(1).split(", ")) for m in re.finditer(r"^  (-[\w-]+(?:, -[\w-]+)*)", listed, re.M)]
    obj = cli.main
    for name in command:
        obj = obj.commands[name]
    options = [p for p in obj.params if isinstance(p, click.Option) and not p.hidden]
    assert sorted(entries) == sorted([sorted(p.opts) for p in options] + [["--help", "-h"]]), r.stdout


def test_the_config_reference_has_every_option_of_every_command() -> None:
    reference = jailbox("config", "--reference").stdout
    import yaml

    data = yaml.safe_load(reference)
    for command in all_commands()[1:]:
        obj = cli.main
        for name in command:
            obj = obj.commands[name]
        options = [p.name for p in obj.params if isinstance(p, click.Option) and p.name]
        if not options:
            continue  # nothing to set (rootfs path NAME): no section
        section = data
        for name in command:
            section = section[name]
        assert sorted(section) == sorted(options), command


def test_unknown_config_keys_are_warned_about(tmp_path: Path) -> None:
    (tmp_path / "jailbox").mkdir()
    (tmp_path / "jailbox" / "config.yaml").write_text(
        "run:\n  llm-nmae: x\nrootfs:\n  pull:\n    platfrom: linux/amd64\nnosuch: {a: 1}\ndoctor: {as_json: false}\n"
    )
    r = jailbox("doctor", env={"XDG_CONFIG_HOME": str(tmp_path)})
    warned = [line for line in r.stderr.splitlines() if "unknown key" in line]
    assert sorted(re.search(r"unknown key '([^']+)'", line).group(1) for line in warned) == [
        "nosuch",
        "rootfs.pull.platfrom",
        "run.llm_nmae",
    ]
    assert all("jailbox config --reference" in line for line in warned)


def test_every_need_in_the_first_hour_section_names_a_doctor_check_that_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## First hour\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what ")]
    assert len(rows) >= 6
    r = jailbox("doctor", "--json")
    checks = {probe["name"] for probe in json.loads(r.stdout)}
    for row in rows:
        named = re.findall(r"`([^`]+)`", row.rstrip(" |").rsplit("|", 1)[1])
        assert named, f"no doctor check named for: {row}"
        assert set(named) <= checks, (named, sorted(checks))
    for word in ("uidmap", "/etc/subuid", "/dev/net/tun", "slirp4netns", "mmdebstrap"):
        assert word in section


@pytest.mark.needs("docker-registry", "skopeo")
def test_rootfs_pull_piped_prints_a_line_per_blob(tmp_path: Path, store) -> None:
    from support.oci_images import E, Layout, LocalRegistry, tar_bytes

    (tmp_path / "registry").mkdir()
    registry = LocalRegistry(tmp_path / "registry")
    try:
        layout = Layout(tmp_path / "layout")
        layers = [tar_bytes([E("a", data=b"a" * 300_000)]), tar_bytes([E("b", data=b"b" * 200_000)])]
        layout.tag("v1", layout.image(layers))
        registry.push(layout.path, "v1", "test/piped")
        r = jailbox("rootfs", "pull", f"{registry.host}/test/piped:v1", "--name", "piped")
    finally:
        registry.close()
    assert r.returncode == 0, r.stderr
    downloaded = [line for line in r.stderr.splitlines() if line.endswith("downloaded")]
    assert len(downloaded) == 3, r.stderr  # the image config and both layers
    assert "\r" not in r.stderr


MMDEBSTRAP_VERBOSE = """\
I: running apt-get update...
Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
Get:4 http://deb.debian.org/debian bookworm/main amd64 Packages [8790 kB]
Fetched 9422 kB in 2s (4225 kB/s)
I: downloading packages with apt...
0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.
Need to get 38.0 MB of archives.
Get:1 http://deb.debian.org/debian bookworm/main amd64 gcc-12-base amd64 12.2.0-14+deb12u1 [37.6 kB]
Get:2 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9+deb12u14 [2759 kB]
Get:3 http://security.debian.org/debian-security bookworm-security/main amd64 bash amd64 5.2.15-2+b13 [1491 kB]
I: extracting archives...
I: installing essential packages...
Selecting previously unselected package gcc-12-base:amd64.
Preparing to unpack .../gcc-12-base_12.2.0-14+deb12u1_amd64.deb ...
Unpacking gcc-12-base:amd64 (12.2.0-14+deb12u1) ...
Unpacking libc6:amd64 (2.36-9+deb12u14) ...
Unpacking bash (5.2.15-2+b13) ...
Setting up gcc-12-base:amd64 (12.2.0-14+deb12u1) ...
Setting up libc6:amd64 (2.36-9+deb12u14) ...
Setting up bash (5.2.15-2+b13) ...
I: installing remaining packages inside the chroot...
0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.
Get:1 http://deb.debian.org/debian bookworm/main amd64 python3 amd64 3.11.2-1+b1 [26.3 kB]
Unpacking python3 (3.11.2-1+b1) ...
Setting up python3 (3.11.2-1+b1) ...
I: success in 109.5836 seconds
"""


def test_build_progress_counts_packages_with_an_eta() -> None:
    from jailbox.sandbox.rootfs.build import BuildProgress

    now = [0.0]
    progress = BuildProgress(clock=lambda: now[0])
    updates = []
    for line in MMDEBSTRAP_VERBOSE.splitlines():
        now[0] += 1.0
        update = progress.feed(line)
        if update is not None:
            updates.append(update)
    stages = [u.text for u in updates if not u.transient]
    assert stages[0] == "I: running apt-get update..." and stages[-1].startswith("I: success")
    assert "I: 3 packages to install (3 in all)" in stages and "I: 1 packages to install (4 in all)" in stages
    packages = [u for u in updates if u.transient]
    assert [(u.phase, u.count, u.total) for u in packages[:3]] == [("downloaded", i, 3) for i in (1, 2, 3)]
    assert packages[3].text.split()[:3] == ["unpacked", "1/3", "gcc-12-base"]  # the arch is dropped
    assert [(u.phase, u.count, u.total) for u in packages[-3:]] == [
        ("downloaded", 4, 4),
        ("unpacked", 4, 4),
        ("set up", 4, 4),
    ]
    assert packages[0].text.endswith("ETA -") and packages[-1].text.endswith("ETA 0:00")
    assert re.search(r"ETA \d+:\d\d$", packages[4].text)
    assert not any("Preparing" in u.text or "Selecting" in u.text or "InRelease" in u.text for u in updates)


@pytest.mark.needs("mmdebstrap", "subids")
@pytest.mark.slow
@pytest.mark.network
def test_rootfs_build_piped_shows_package_counts_and_an_eta(store) -> None:
    r = jailbox("rootfs", "build", "slim")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert any(line.startswith("I: installing") for line in lines)
    counted = [line for line in lines if re.match(r"^\s*(downloaded|unpacked|set up)\s+\d+/\d+ \S+  ETA ", line)]
    assert counted, r.stderr[-3000:]
    last = [line for line in counted if line.strip().startswith("set up")][-1]
    done, total = re.search(r"(\d+)/(\d+)", last).groups()
    assert done == total and int(total) > 20 and last.endswith("ETA 0:00")
    assert not any(line.startswith(("Preparing to unpack", "Selecting previously", "Setting up")) for line in lines)
    assert "\r" not in r.stderr
