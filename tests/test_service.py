"""Long-lived sandboxes from the shell: ``jailbox create``, ``exec --id``, ``cp``, ``ps``, ``stop``, and
the per-user service behind them, run as users run them (real CLI processes, a real service, real
jails). Each test has a state directory of its own, so it has a service of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import snapshot
from support.bound_probe import BOUNDS, PROBE_LINE, held
from support.cli import JAILBOX
from support.service_probe import ended, listener_pid
from support.waits import wait_until

from jailbox.sandbox.floor import wire

HANG = 120  # seconds: a hang guard only, never a measure


class Service:
    """A state directory of the test's own and ``jailbox`` run against it."""

    def __init__(self, base: Path, idle: float) -> None:
        self.base = base
        self.env = {**os.environ, "JAILBOX_STATE_DIR": str(base), "JAILBOX_SERVICE_IDLE": str(idle)}

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("timeout", HANG)
        return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, env=self.env, **kw)

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen([*JAILBOX, *args], env=self.env, **kw)

    def create(self, *args: str) -> str:
        r = self.run("create", *args)
        assert r.returncode == 0, r.stderr
        sid = r.stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{12}", sid), r.stdout
        return sid

    @property
    def socket(self) -> Path:
        return self.base / "service.sock"

    def pid(self) -> int | None:
        """The service's pid; None when none listens."""
        return listener_pid(self.socket)

    def sandbox_dirs(self) -> list[str]:
        return sorted(os.listdir(self.base / "sandboxes"))

    def init_pids(self) -> list[int]:
        pids = []
        for sid in self.sandbox_dirs():
            meta = json.loads((self.base / "sandboxes" / sid / "meta.json").read_text())
            pids.append(meta["init_pid"])
        return pids


def _service(idle: float) -> Iterator[Service]:
    # short: a UNIX socket's path has at most 107 bytes
    base = Path(tempfile.mkdtemp(prefix="jbs-", dir="/tmp"))
    svc = Service(base, idle)
    try:
        yield svc
    finally:
        pid = svc.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert ended(pid, HANG)
        svc.run("cleanup", "--force")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def svc() -> Iterator[Service]:
    yield from _service(idle=600)


@pytest.fixture
def quick() -> Iterator[Service]:
    yield from _service(idle=1)


@pytest.mark.slow
def test_a_sandbox_outlives_each_command_and_keeps_its_state(svc, tmp_path):
    sid = svc.create("--name", "box", "--env", "GREETING=hi", "--workdir", "/work")
    r = svc.run("exec", "--id", "box", "--", "sh", "-c", "echo $GREETING; pwd; echo kept > state.txt; echo e >&2")
    assert (r.returncode, r.stdout, r.stderr) == (0, "hi\n/work\n", "e\n")
    r = svc.run("exec", "--id", sid[:5], "--", "cat", "/work/state.txt")  # a unique prefix will do
    assert (r.returncode, r.stdout) == (0, "kept\n")
    r = svc.run(
        "exec", "--id", sid, "--env", "GREETING=bye", "--workdir", "/tmp", "--", "sh", "-c", "echo $GREETING; pwd"
    )
    assert r.stdout == "bye\n/tmp\n"
    r = svc.run("exec", "--id", "box", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7
    r = svc.run("exec", "--id", "box", "--rootfs", "/", "--", "true")
    assert r.returncode == 2 and "--rootfs" in r.stderr

    (tmp_path / "in.txt").write_text("from the host\n")
    assert svc.run("cp", str(tmp_path / "in.txt"), "box:/work/in.txt").returncode == 0
    assert svc.run("exec", "--id", "box", "--", "cat", "in.txt").stdout == "from the host\n"
    svc.run("exec", "--id", "box", "--", "sh", "-c", "mkdir -p t/sub && echo deep > t/sub/f")
    assert svc.run("cp", f"{sid}:/work/t", str(tmp_path / "out")).returncode == 0
    assert (tmp_path / "out" / "sub" / "f").read_text() == "deep\n"
    assert svc.run("cp", "box:/work/in.txt", f"{tmp_path}/").returncode == 0  # a trailing / means inside
    assert (tmp_path / "in.txt").read_text() == "from the host\n"

    other = svc.create()
    table = svc.run("ps").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "ROOTFS", "CREATED", "STATE"]
    assert any(line.startswith(sid) and " box " in line and line.endswith("running") for line in table[1:])
    listed = json.loads(svc.run("ps", "--json").stdout)
    assert [(b["id"], b["name"], b["rootfs"], b["state"]) for b in listed] == [
        (sid, "box", "host", "running"),
        (other, None, "host", "running"),
    ]
    assert svc.run("create", "--name", "box").returncode == 1  # names are unique

    r = svc.run("stop", "box")
    assert (r.returncode, r.stdout) == (0, f"{sid}\n")
    assert svc.sandbox_dirs() == [other]
    assert svc.run("stop", "--all").stdout == f"{other}\n"
    assert json.loads(svc.run("ps", "--json").stdout) == []
    assert svc.sandbox_dirs() == []


@pytest.mark.cgroup
@pytest.mark.slow
def test_create_takes_the_bounds_ps_shows_them_and_they_hold(svc):
    sid, other = svc.create(*BOUNDS), svc.create()
    listed = {b["id"]: b["limits"] for b in json.loads(svc.run("ps", "--json").stdout)}
    bounds = {"memory": 64 << 20, "cpus": 0.1, "pids": 16, "disk": 8 << 20, "inodes": 200}
    assert listed[sid] == {"swap": None, "file_size": None, "open_files": 65536, **bounds}
    assert listed[other] == {
        **listed[sid],
        "memory": 2 << 30,
        "cpus": None,
        "pids": 512,
        "disk": 4 << 30,
        "inodes": 1_000_000,
    }
    r = svc.run("exec", "--id", sid, "--", "sh", "-c", PROBE_LINE)
    assert r.returncode == 0, r.stderr
    held(r.stdout)
    r = svc.run("exec", "--id", sid, "-m", "1g", "--", "true")  # a running sandbox's bounds are create's
    assert r.returncode == 2 and "--memory cannot change a running sandbox" in r.stderr, r.stderr


@pytest.mark.slow
def test_an_unknown_id_is_one_line_naming_it_and_ps(svc, tmp_path):
    for args in (["exec", "--id", "nope", "--", "true"], ["stop", "nope"], ["cp", "nope:/etc/hostname", str(tmp_path)]):
        r = svc.run(*args)  # no service runs yet
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "'nope'" in r.stderr and "jailbox ps" in r.stderr
    sid = svc.create()
    svc.create()
    for args in (["exec", "--id", "nope", "--", "true"], ["stop", "nope"], ["cp", str(tmp_path), "nope:/x"]):
        r = svc.run(*args)
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "'nope'" in r.stderr and "jailbox ps" in r.stderr
    r = svc.run("exec", "--id", "", "--", "true")
    assert r.returncode != 0
    r = svc.run("exec", "--id", sid, "--env", "A B=1", "--", "true")
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and "A B" in r.stderr
    assert len(svc.sandbox_dirs()) == 2  # a failed stop stops nothing


@pytest.mark.slow
def test_cp_out_never_follows_a_link_the_jail_planted_in_the_destination(svc, tmp_path, outside):
    shared = tmp_path / "shared"
    shared.mkdir()
    sid = svc.create(
        "--bind", f"{shared}:/mnt:{'give' if os.getuid() == 0 else 'rw'}"
    )  # as root, the jail's root is a subordinate id
    before = snapshot(outside)
    planted = (
        f"ln -s {outside}/secret /mnt/file && ln -s {outside} /mnt/tree && mkdir /mnt/d && ln -s {outside} /mnt/d/sub"
        " && echo from-jail > /tmp/one && mkdir -p /tmp/t/sub && echo x > /tmp/t/sub/secret && echo y > /tmp/t/z"
    )
    assert svc.run("exec", "--id", sid, "--", "sh", "-c", planted).returncode == 0
    assert svc.run("cp", f"{sid}:/tmp/one", str(shared / "file")).returncode == 0
    assert svc.run("cp", f"{sid}:/tmp/t", str(shared / "tree")).returncode == 0
    assert svc.run("cp", f"{sid}:/tmp/t", str(shared / "d")).returncode == 0
    assert snapshot(outside) == before
    assert (shared / "file").read_text() == "from-jail\n" and not (shared / "file").is_symlink()
    assert (shared / "tree" / "sub" / "secret").read_text() == "x\n" and not (shared / "tree").is_symlink()
    assert (shared / "d" / "sub" / "secret").read_text() == "x\n" and not (shared / "d" / "sub").is_symlink()


@pytest.mark.slow
def test_cp_in_lands_in_the_jails_view_whatever_it_planted(svc, tmp_path, outside):
    sid = svc.create("--bind", f"{outside}:/ro")
    before = snapshot(outside)
    (tmp_path / "payload").write_text("overwrite?\n")
    plant = "ln -s /ro/secret /tmp/link && mkdir /tmp/d && ln -s /ro /tmp/d/in"
    assert svc.run("exec", "--id", sid, "--", "sh", "-c", plant).returncode == 0
    svc.run("cp", str(tmp_path / "payload"), f"{sid}:/tmp/link")
    svc.run("cp", str(tmp_path / "payload"), f"{sid}:/tmp/d/in/secret")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "secret").write_text("tree\n")
    svc.run("cp", str(tmp_path / "dir"), f"{sid}:/tmp/d/in")
    assert snapshot(outside) == before  # the read-only bind held, through every link
    assert svc.run("exec", "--id", sid, "--", "true").returncode == 0


def test_output_streams_while_the_command_runs(svc):
    sid = svc.create()
    for stream, redirect in (("stdout", ""), ("stderr", ">&2")):
        proc = svc.popen(
            "exec",
            "--id",
            sid,
            "--",
            "sh",
            "-c",
            f"echo a {redirect}; read go; echo b {redirect}",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out = proc.stdout if stream == "stdout" else proc.stderr
        assert out.readline() == b"a\n"  # the command is still waiting for our line: it has not ended
        assert proc.poll() is None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert out.readline() == b"b\n"
        assert proc.wait(HANG) == 0


def _max_rss_kb(shell: str, env: dict[str, str]) -> tuple[int, str]:
    """Run ``shell`` and report the largest resident set of any process it ran, and its stdout."""
    probe = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(['sh', '-c', sys.argv[1]], capture_output=True, text=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.stdout, end='')"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, shell], capture_output=True, text=True, env=env, timeout=HANG
    ).stdout
    first, _, rest = out.partition("\n")
    return int(first), rest


@pytest.mark.slow
def test_stdin_streams_with_bounded_memory(svc):
    sid = svc.create()
    jailbox = " ".join(f"'{a}'" for a in JAILBOX)
    rss, out = _max_rss_kb(f"yes | {jailbox} exec --id {sid} -- head -n1", svc.env)
    assert out == "y\n" and rss < 200_000, rss  # endless input, one line read: the pipeline ends
    rss, out = _max_rss_kb(f"head -c 300000000 /dev/zero | {jailbox} exec --id {sid} -- wc -c", svc.env)
    assert out.strip() == "300000000" and rss < 200_000, rss  # every byte, none of it held
    assert psutil.Process(svc.pid()).memory_info().rss < 400 << 20


@pytest.mark.slow
def test_ctrl_c_kills_the_command_and_a_timeout_too(svc):
    sid = svc.create()
    proc = svc.popen("exec", "--id", sid, "--", "sh", "-c", "echo started; exec sleep 4242", stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(HANG) == 130
    r = svc.run("exec", "--id", sid, "--timeout", "1", "--", "sh", "-c", "echo before; exec sleep 4343")
    assert (r.returncode, r.stdout) == (124, "before\n") and "timed out" in r.stderr

    def sleepers() -> list[psutil.Process]:
        return [
            p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] in (["sleep", "4242"], ["sleep", "4343"])
        ]

    wait_until(lambda: not sleepers(), "the stopped sandbox's commands to end", HANG, every=0.1)
    assert svc.run("exec", "--id", sid, "--", "echo", "still here").stdout == "still here\n"


@pytest.mark.slow
def test_the_service_leaves_once_idle_and_takes_nothing_with_it_but_its_own(quick):
    sid = quick.create()
    pid = quick.pid()
    time.sleep(3)  # longer than the idle timeout: a sandbox held keeps the service
    assert quick.run("exec", "--id", sid, "--", "echo", "up").stdout == "up\n"
    assert quick.pid() == pid
    assert quick.run("stop", sid).returncode == 0
    assert ended(pid, HANG)
    assert not quick.socket.exists()
    assert quick.sandbox_dirs() == []
    assert quick.run("create").returncode == 0  # and the next create starts a new one


@pytest.mark.slow
def test_a_stopped_service_closes_every_sandbox(svc):
    sids = [svc.create(), svc.create()]
    running = svc.popen("exec", "--id", sids[0], "--", "sh", "-c", "echo up; exec sleep 4545", stdout=subprocess.PIPE)
    assert running.stdout.readline() == b"up\n"
    pid = svc.pid()
    os.kill(pid, signal.SIGTERM)
    assert ended(pid, HANG)
    assert running.wait(HANG) == 125  # told, not left hanging
    assert svc.sandbox_dirs() == []
    assert not svc.socket.exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "4545"]]


@pytest.mark.slow
def test_a_killed_service_leaves_nothing_cleanup_does_not_remove(svc):
    sids = [svc.create(), svc.create(), svc.create("--upper", "tmpfs")]  # the last has no state directory
    for n, sid in enumerate(sids):
        svc.run("exec", "--id", sid, "--", "sh", "-c", f"sleep 444{n} > /dev/null 2>&1 &")
    inits = svc.init_pids()
    assert len(inits) == 2
    sleepers = [["sleep", f"444{n}"] for n in range(3)]
    assert len([p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] in sleepers]) == 3
    pid = svc.pid()
    os.kill(pid, signal.SIGKILL)
    assert ended(pid, HANG)
    r = svc.run("cleanup")
    assert r.returncode == 0, r.stderr
    assert svc.sandbox_dirs() == []
    assert not svc.socket.exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] in sleepers]
    assert not [p for p in inits if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert json.loads(svc.run("ps", "--json").stdout) == []
    assert svc.create()  # a fresh service, in place of the dead one


@pytest.mark.slow
def test_two_creates_at_once_start_one_service(svc):
    procs = [svc.popen("create", stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    sids = [p.communicate(timeout=HANG)[0].decode().strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    owners = {json.loads((svc.base / "sandboxes" / s / "meta.json").read_text())["host_pid"] for s in sids}
    assert owners == {svc.pid()}
    assert sorted(b["id"] for b in json.loads(svc.run("ps", "--json").stdout)) == sorted(sids)


def _raw(svc: Service, payload: bytes | dict, fds: list[int] | None = None) -> dict | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(str(svc.socket))
        if isinstance(payload, dict):
            wire.send(sock, payload, fds or [])
        elif fds:
            socket.send_fds(sock, [payload], fds)
        else:
            sock.send(payload)
        got = wire.recv(sock, max_fds=0)
        return None if got is None else got[0]


@pytest.mark.slow
def test_bad_requests_get_an_error_and_the_service_keeps_serving(svc):
    sid = svc.create()
    bad: list[bytes | dict] = [
        b"x" * (200 * 1024),  # larger than a message may be inline
        {"op": "create", "config": {}, "name": "n" * 40 + "x" * (2 << 20)},  # larger than any request (memfd)
        b"{not json",
        b"[1, 2]",
        {"op": "launch-missiles"},
        {"op": "ps", "extra": 1},
        {"op": "exec", "id": sid, "argv": "echo hi"},
        {"op": "exec", "id": sid, "argv": []},
        {"op": "exec", "id": "../../etc", "argv": ["true"]},
        {"op": "exec", "id": sid, "argv": ["true"], "timeout": "1"},
        {"op": "stop", "ids": [sid], "all": "yes"},
        {"op": "create", "config": {"rootfs": "host", "hostname": "not a hostname!"}},
        {"op": "get", "id": sid, "host": "relative/path", "jail": "/etc/hostname"},
    ]
    for payload in bad:
        reply = _raw(svc, payload)
        assert reply is not None and reply["ok"] is False and reply["error"], payload
    r, w = os.pipe()
    try:
        reply = _raw(svc, {"op": "ps"}, [r])  # descriptors are not taken
        assert reply is not None and reply["ok"] is False
    finally:
        os.close(r)
        os.close(w)
    assert [b["id"] for b in json.loads(svc.run("ps", "--json").stdout)] == [sid]
    assert svc.run("exec", "--id", sid, "--", "echo", "fine").stdout == "fine\n"
    assert svc.sandbox_dirs() == [sid]


@pytest.mark.slow
@pytest.mark.root
def test_another_user_cannot_reach_the_service(svc):
    sid = svc.create()
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('refused'); sys.exit()\n"
        's.send(b\'{"op":"stop","all":true}\')\n'
        "print(s.recv(65536).decode())\n"
    )

    def as_nobody() -> str:
        return subprocess.run(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", probe, str(svc.socket)],
            capture_output=True,
            text=True,
            timeout=HANG,
            cwd="/",
        ).stdout.strip()

    assert as_nobody() == "refused"  # the state directory is 0700
    os.chmod(svc.base, 0o711)
    assert as_nobody() == "refused"  # the socket itself is the owner's only
    os.chmod(svc.socket, 0o666)
    reply = json.loads(as_nobody())  # and past both: the service checks the peer's uid
    assert reply["ok"] is False and "own user" in reply["error"]
    r = subprocess.run(
        ["runuser", "-u", "nobody", "--", *JAILBOX, "stop", "--all"],
        capture_output=True,
        text=True,
        env=svc.env,
        timeout=HANG,
        cwd="/",
    )
    assert r.returncode != 0
    assert [b["id"] for b in json.loads(svc.run("ps", "--json").stdout)] == [sid]
