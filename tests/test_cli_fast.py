"""``jailbox exec -- CMD`` through the per-user service (``servers/exec_service/quick.py``), run as users run it:
real client processes, a real service, real jails. Every answer is held to the in-process run's
(``JAILBOX_NO_SERVICE=1``): the same bytes on both streams, the same exit code. Each test has a state
directory, so a service, of its own.

Which path a call took is told by the client itself, through a wrapper around the console script's
``main`` that records on exit whether the full CLI (click) was loaded: the output cannot show it, by design.
"""

from __future__ import annotations

import fcntl
import os
import pty
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import host_tree
from support.cli import JAILBOX
from support.service_probe import ended, listener_pid
from support.waits import wait_until

from jailbox.sandbox.floor import wire
from jailbox.servers.exec_service import quick

HANG = 120  # seconds: a hang guard only, never a measure
WRAPPER = """
import atexit, os, sys

def mark():
    with open(os.environ["FAST_MARK"], "a") as f:
        f.write("full\\n" if "jailbox.cli" in sys.modules else "fast\\n")

real_exit = os._exit

def _exit(code):
    mark()
    real_exit(code)

os._exit = _exit
atexit.register(mark)
from jailbox.console import main
main()
"""
CLIENT = [sys.executable, "-c", WRAPPER]


class Fast:
    """A state directory of the test's own, and the console script run against it."""

    def __init__(self, base: Path, idle: float) -> None:
        self.base = base
        self.marks = base.parent / f"{base.name}.marks"
        self.env = {
            **os.environ,
            "JAILBOX_STATE_DIR": str(base),
            "JAILBOX_SERVICE_IDLE": str(idle),
            "XDG_CONFIG_HOME": str(base.parent / f"{base.name}.config"),  # no settings file unless a test writes one
            "FAST_MARK": str(self.marks),
        }
        self.env.pop(off_env(), None)

    def run(self, *args: str, in_process: bool = False, **kw) -> tuple[subprocess.CompletedProcess, str]:
        """The call's result and the path it took ("fast" or "full")."""
        kw.setdefault("timeout", HANG)
        kw.setdefault("stdin", subprocess.DEVNULL)
        env = {**self.env, off_env(): "1"} if in_process else self.env
        self.marks.unlink(missing_ok=True)
        r = subprocess.run([*CLIENT, *args], capture_output=True, env=env, **kw)
        return r, self.took()

    def took(self) -> str:
        return self.marks.read_text().strip() if self.marks.exists() else "none"

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen([*CLIENT, *args], env=self.env, **kw)

    @property
    def socket(self) -> Path:
        return self.base / "service.sock"

    def pid(self) -> int | None:
        """The service's pid; None when none listens."""
        return listener_pid(self.socket)

    def starting(self) -> bool:
        """A service the fast path started is alive (it holds the start lock), listening or not yet."""
        try:
            fd = os.open(self.base / "service.start", os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def warm(self) -> int:
        """Start the service the way the first call does, and wait until it serves: its pid."""
        r, took = self.run("exec", "--", "true")
        assert (r.returncode, took) == (0, "full"), r.stderr
        pid = wait_until(self.pid, lambda: f"the service; its log: {(self.base / 'service.log').read_text()}", HANG)
        r, took = self.run("exec", "--", "true")
        assert (r.returncode, took) == (0, "fast"), r.stderr
        return pid

    def sandbox_dirs(self) -> list[str]:
        return sorted(os.listdir(self.base / "sandboxes")) if (self.base / "sandboxes").exists() else []


def off_env() -> str:
    return "JAILBOX_NO_SERVICE"


@pytest.fixture
def fast(request: pytest.FixtureRequest) -> Iterator[Fast]:
    idle = getattr(request, "param", 600)
    base = Path(tempfile.mkdtemp(prefix="jbf-", dir="/tmp"))  # short: a socket path has at most 107 bytes
    f = Fast(base / "state", idle)
    f.base.mkdir(mode=0o700)
    try:
        yield f
    finally:
        pid = f.pid()
        deadline = time.monotonic() + HANG
        while pid is None and f.starting() and time.monotonic() < deadline:  # started by the last call's exit
            time.sleep(0.05)
            pid = f.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert ended(pid, HANG)
        subprocess.run([*JAILBOX, "cleanup", "--force"], env=f.env, capture_output=True, timeout=HANG)
        shutil.rmtree(base, ignore_errors=True)


def processes(argv: list[str]) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == argv]


def gone(argv: list[str]) -> bool:
    return wait_until(lambda: not processes(argv), f"{argv} to end", HANG, every=0.1)


# --- parity with the in-process run -----------------------------------------------------------------

BINARY = bytes(range(256)) * 4096  # every byte value, a megabyte: more than one message
DEFAULTS = (  # what a command finds: directory, ids, name, umask, limits, environment, files, privileges
    "pwd; id; hostname; umask; ulimit -a; env | sort; ls -A /tmp /testbed; "
    "grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status"
)


@pytest.mark.parametrize(
    "argv, stdin",
    [
        (["sh", "-c", "echo out; echo err >&2"], b""),
        (["sh", "-c", "echo partial; echo oops >&2; exit 3"], b""),
        (["sh", "-c", "echo before; kill -9 $$"], b""),
        (["sh", "-c", "kill -TERM $$"], b""),
        (["cat"], BINARY),
        (["sh", "-c", "cat; cat >&2"], BINARY[:100_000]),
        (["no-such-command-here"], b""),
        (["/etc/passwd"], b""),
        (["sh", "-c", DEFAULTS], b""),
        (["printf", "%s|", "exec", "--", "-x", "--help"], b""),
    ],
    ids=["exit0", "exit3", "sigkill", "sigterm", "binary", "binary-stderr", "127", "126", "defaults", "dashes"],
)
@pytest.mark.slow
def test_fast_and_in_process_give_the_same_bytes_and_exit_code(fast, argv, stdin):
    fast.warm()
    args = ["exec", "--", *argv]  # whatever follows "--" is the command's, dashes and all
    r_fast, took = fast.run(*args, input=stdin, stdin=None)
    assert took == "fast"
    r_full, took = fast.run(*args, input=stdin, stdin=None, in_process=True)
    assert took == "full"
    assert (r_fast.returncode, r_fast.stdout, r_fast.stderr) == (r_full.returncode, r_full.stdout, r_full.stderr)
    if argv == ["cat"]:
        assert r_fast.stdout == BINARY


@pytest.mark.parametrize(
    "argv, stdout",
    [
        (["echo", "hi", "there"], b"hi there\n"),
        (["sh", "-c", "echo hi; exit 7"], b"hi\n"),  # from CMD on, dashes are the command's, as with docker run
        (["echo", "hi", "--hostname", "x", "--", "-m"], b"hi --hostname x -- -m\n"),
    ],
    ids=["words", "dashes", "jailbox-options"],
)
@pytest.mark.slow
def test_the_form_without_dashes_is_fast_too_and_the_same(fast, argv, stdout):
    fast.warm()
    r_fast, took = fast.run("exec", *argv)
    assert took == "fast"
    r_full, took = fast.run("exec", *argv, in_process=True)
    assert took == "full"
    assert (r_fast.returncode, r_fast.stdout, r_fast.stderr) == (r_full.returncode, r_full.stdout, r_full.stderr)
    assert r_fast.stdout == stdout


def test_the_service_runs_the_default_configuration_exec_builds():
    from jailbox.cli import _config, exec_cmd
    from jailbox.servers.exec_service.server import default_config

    params = exec_cmd.make_context("exec", ["--", "true"]).params
    jail = {k: v for k, v in params.items() if k not in ("command", "timeout", "sandbox_id")}
    assert _config(**jail) == default_config()


# --- streaming, freshness, concurrency ------------------------------------------------------------


def _max_rss_kb(shell: str, env: dict[str, str]) -> tuple[int, str]:
    """Run ``shell``: the largest resident set of any process it ran, and its stdout."""
    probe = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(['sh', '-c', sys.argv[1]], capture_output=True, text=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.stdout, end='')"
    )
    out = subprocess.run([sys.executable, "-c", probe, shell], capture_output=True, text=True, env=env, timeout=HANG)
    first, _, rest = out.stdout.partition("\n")
    return int(first), rest


@pytest.mark.slow
def test_stdin_streams_with_bounded_memory(fast):
    pid = fast.warm()
    client = " ".join(f"'{a}'" for a in CLIENT)
    fast.marks.unlink()
    rss, out = _max_rss_kb(f"yes | {client} exec -- head -n1", fast.env)
    assert (out, fast.took()) == ("y\n", "fast") and rss < 200_000, rss  # endless input, one line: it ends
    fast.marks.unlink()
    rss, out = _max_rss_kb(f"head -c 300000000 /dev/zero | {client} exec -- wc -c", fast.env)
    assert (out.strip(), fast.took()) == ("300000000", "fast") and rss < 200_000, rss  # every byte, none held
    assert psutil.Process(pid).memory_info().rss < 400 << 20
    rss, out = _max_rss_kb(f"{client} exec -- yes | head -n2", fast.env)  # our stdout closes first
    assert out == "y\ny\n" and rss < 200_000, rss
    assert gone(["yes"])


@pytest.mark.slow
def test_each_call_gets_a_fresh_sandbox(fast):
    fast.warm()
    for _ in range(4):  # more calls than the pool holds: refilled ones are fresh too
        r, took = fast.run("exec", "--", "sh", "-c", "ls -A /tmp /testbed; echo planted > /tmp/x; touch /testbed/y")
        assert (r.returncode, took) == (0, "fast"), r.stderr
        assert r.stdout == b"/testbed:\n\n/tmp:\n", r.stdout


@pytest.mark.slow
def test_a_long_service_log_is_set_aside_when_the_next_service_starts(fast):
    """Services started by the fast path append to one log: it never grows past one service's share."""
    log = fast.base / quick.LOG_NAME
    log.write_bytes(b"x" * (quick.LOG_MAX + 1))
    fast.warm()
    assert log.stat().st_size < quick.LOG_MAX
    assert (fast.base / f"{quick.LOG_NAME}.1").stat().st_size == quick.LOG_MAX + 1


@pytest.mark.slow
def test_eight_calls_at_once(fast):
    fast.warm()
    fast.marks.unlink()
    procs = [
        fast.popen("exec", "--", "sh", "-c", f"sleep 0.2; echo {n}; echo e{n} >&2; exit {n}", stdout=subprocess.PIPE)
        for n in range(8)
    ]
    for n, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=HANG)
        assert (proc.returncode, out) == (n, f"{n}\n".encode())
    assert fast.marks.read_text().split() == ["fast"] * 8


@pytest.mark.slow
def test_only_a_context_the_jail_would_inherit_differently_runs_in_process(fast):
    """A context the jail would inherit differently (umask, a setting) runs in-process, with its own answer."""
    fast.warm()
    old = os.umask(0o077)
    try:
        r, took = fast.run("exec", "--", "sh", "-c", "umask")
    finally:
        os.umask(old)
    assert (r.stdout, took) == (b"0077\n", "full")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lower_soft_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard, 512), hard))

    # ... but not a soft limit on open files: every holder lifts it to the hard one before its first jail
    r, took = fast.run("exec", "--", "sh", "-c", "ulimit -n", preexec_fn=lower_soft_nofile)
    r_full, _ = fast.run("exec", "--", "sh", "-c", "ulimit -n", preexec_fn=lower_soft_nofile, in_process=True)
    assert (r.returncode, r.stdout, took) == (0, r_full.stdout, "fast"), r.stderr
    fast.env["JAILBOX_SOMETHING_NEW"] = "1"  # any setting: the service's were others
    r, took = fast.run("exec", "--", "true")
    assert (r.returncode, took) == (0, "full")


# --- interruption and failure ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
def test_interrupting_the_client_kills_the_commands_tree(fast, sig):
    fast.warm()
    fast.marks.unlink()
    sleeper = ["sleep", f"47{sig:02d}"]
    script = f"echo started; (exec {' '.join(sleeper)}) & exec {' '.join(sleeper)}"
    proc = fast.popen("exec", "--", "sh", "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    # the one in the background starts too
    wait_until(lambda: len(processes(sleeper)) >= 2, "both sleepers", HANG)
    assert len(processes(sleeper)) == 2
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG)
    if sig == signal.SIGINT:
        assert (proc.returncode, err) == (1, b"\nAborted!\n")  # as click ends the in-process run
    else:
        assert proc.returncode == -sig
    assert gone(sleeper)


@pytest.mark.slow
def test_ctrl_c_ends_the_in_process_run_the_same_way(fast):
    proc = subprocess.Popen(
        [*CLIENT, "exec", "--", "sh", "-c", "echo started; exec sleep 4799"],
        env={**fast.env, off_env(): "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG)
    assert (proc.returncode, err) == (1, b"\nAborted!\n")
    assert gone(["sleep", "4799"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
def test_a_service_that_stops_mid_run_is_one_line_and_125(fast, sig):
    pid = fast.warm()
    sleeper = ["sleep", f"48{sig:02d}"]
    proc = fast.popen(
        "exec",
        "--",
        "sh",
        "-c",
        f"echo started; exec {' '.join(sleeper)}",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"started\n"
    os.kill(pid, sig)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 125
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jailbox: "), err  # lost it, or told the sandbox died
    if sig == signal.SIGTERM:  # stopped, not killed: it closed the running sandbox and the warm ones
        assert ended(pid, HANG)
        assert gone(sleeper)
        assert fast.sandbox_dirs() == []


@pytest.mark.slow
def test_the_default_state_directory_works_too(fast):
    """No $JAILBOX_STATE_DIR: the service (which is given it) and the client still share one context."""
    env = {k: v for k, v in fast.env.items() if k != "JAILBOX_STATE_DIR"}
    env["XDG_STATE_HOME"] = str(fast.base.parent / "xdg")
    base = fast.base.parent / "xdg" / "jailbox"
    fast.env = env
    took = []
    for _ in range(2):  # the first makes the state directory, the second starts the service
        r, path = fast.run("exec", "--", "echo", "hi")
        took.append(path)
        assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr
    fast.base = base  # the fixture stops this service (set first: a wait that fails leaves it to the fixture)
    wait_until((base / "service.sock").exists, "the service's socket", HANG)
    wait_until(fast.pid, "the service", HANG)
    r, path = fast.run("exec", "--", "echo", "hi")
    assert (r.returncode, r.stdout, [*took, path]) == (0, b"hi\n", ["full", "full", "fast"]), r.stderr


class FakeService:
    """Something listening on the service's socket that answers as told (a service gone bad)."""

    def __init__(self, path: Path, answer) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    wire.recv(conn, max_fds=0)
                    self.answer(conn)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _hang_up(conn: socket.socket) -> None:
    pass


def _nonsense(conn: socket.socket) -> None:
    conn.send(b"\xff not json")


def _refuse(conn: socket.socket) -> None:
    wire.send(conn, {"ok": False, "error": "no"})


def _start_then_garbage(conn: socket.socket) -> None:
    wire.send(conn, {"ok": True, "id": "x"})
    wire.send(conn, {"stream": "stdout", "data": "!!not base64!!"})


def _start_then_hang_up(conn: socket.socket) -> None:
    wire.send(conn, {"ok": True, "id": "x"})


@pytest.mark.parametrize("answer", [_hang_up, _nonsense, _refuse], ids=["hang-up", "nonsense", "refusal"])
@pytest.mark.slow
def test_nothing_started_means_the_call_runs_in_process(fast, answer):
    fake = FakeService(fast.socket, answer)
    try:
        r, took = fast.run("exec", "--", "sh", "-c", "echo ran; exit 4")
    finally:
        fake.close()
    assert (r.returncode, r.stdout, took) == (4, b"ran\n", "full"), r.stderr


@pytest.mark.parametrize("answer", [_start_then_garbage, _start_then_hang_up], ids=["garbage", "hang-up"])
def test_a_service_lost_after_the_start_is_one_line_and_125(fast, answer):
    fake = FakeService(fast.socket, answer)
    try:
        r, took = fast.run("exec", "--", "true")
    finally:
        fake.close()
    assert (r.returncode, took) == (125, "fast")
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jailbox: lost the jailbox service"), r.stderr


@pytest.mark.slow
def test_the_jail_cannot_reach_the_service(fast):
    fast.warm()
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n    s.connect(sys.argv[1]); print('reached')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
    )
    r, took = fast.run("exec", "--", "python3", "-c", probe, str(fast.socket))
    assert (r.returncode, took) == (0, "fast"), r.stderr
    assert r.stdout == b"FileNotFoundError\n"
    r, _ = fast.run("exec", "--", "ls", str(fast.base))
    assert r.returncode != 0 and r.stdout == b""


@pytest.mark.slow
def test_a_jail_shown_the_socket_is_refused_all_the_same(fast):
    """A jail whose filesystem shows the socket (here a bind of the state directory) runs rootless as the
    service's own uid: it is told apart by its user namespace, whatever it asks."""
    from jailbox.sandbox import Mount, Sandbox, SandboxConfig

    fast.warm()
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n    s.connect(sys.argv[1])\n"
        "except OSError:\n    print('refused'); sys.exit()\n"
        "s.send(sys.argv[2].encode())\n"
        "print(s.recv(65536).decode())\n"
    )
    requests = (
        '{"op":"ps"}',
        '{"op":"create","config":{"mounts":[{"src":"/","dst":"/host","readonly":false}]}}',
        '{"op":"run","argv":["true"],"context":{}}',
    )
    with Sandbox(SandboxConfig(mounts=[Mount(fast.base, "/svc")])) as sb:
        for request in requests:
            r = sb.exec(["python3", "-c", probe, "/svc/service.sock", request], timeout=HANG)
            assert r.exit_code == 0, r.stderr
            out = r.stdout.strip()
            assert out == "refused" or '"ok":false' in out.replace(" ", ""), (request, out)
            assert "own user" in out or out == "refused", out


# --- what goes to the full CLI --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("exec", "--network", "none", "--", "echo", "hi"),
        ("exec", "--timeout", "60", "--", "echo", "hi"),
        ("exec", "-m", "1g", "--cpus", "1.5", "--pids-limit", "100", "--", "echo", "hi"),
        ("--version",),
        ("exec", "--help"),
    ],
    ids=["network", "timeout", "bounds", "version", "help"],
)
@pytest.mark.slow
def test_any_option_goes_to_the_full_cli(fast, args):
    fast.warm()
    r, took = fast.run(*args)
    assert (r.returncode, took) == (0, "full"), r.stderr
    r_off, _ = fast.run(*args, in_process=True)
    assert (r.returncode, r.stdout, r.stderr) == (r_off.returncode, r_off.stdout, r_off.stderr)


@pytest.mark.parametrize(
    "args, error",
    [
        (("exec", "--xyzzy", "--", "true"), "No such option '--xyzzy'."),
        (("exec", "--memroy", "1g", "--", "true"), "No such option '--memroy'. Did you mean '--memory'?"),
        (("exec", "-x", "true"), "No such option '-x'."),
    ],
    ids=["unknown", "misspelt", "short"],
)
@pytest.mark.slow
def test_an_unknown_option_is_refused_on_both_paths(fast, args, error):
    """Not run as the command (exit 127, "command not found"): click's usage error, whichever path."""
    fast.warm()
    r, took = fast.run(*args)
    assert (r.returncode, took, r.stdout) == (2, "full", b""), r.stderr
    assert r.stderr.decode().rstrip().splitlines()[-1] == f"Error: {error}", r.stderr
    r_off, _ = fast.run(*args, in_process=True)
    assert (r.returncode, r.stdout, r.stderr) == (r_off.returncode, r_off.stdout, r_off.stderr)


@pytest.mark.slow
def test_a_terminal_on_stdin_or_a_settings_file_goes_to_the_full_cli(fast):
    fast.warm()
    main, other = pty.openpty()
    try:
        r, took = fast.run("exec", "--", "sh", "-c", "test -t 0 || echo not-a-tty", stdin=other)
    finally:
        os.close(main)
        os.close(other)
    assert (r.returncode, r.stdout, took) == (0, b"not-a-tty\n", "full"), r.stderr
    settings = Path(fast.env["XDG_CONFIG_HOME"]) / "jailbox" / "config.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text("exec:\n  hostname: from-settings\n")
    r, took = fast.run("exec", "--", "hostname")
    assert (r.returncode, r.stdout, took) == (0, b"from-settings\n", "full"), r.stderr


# --- lifetime -------------------------------------------------------------------------------------


def _cgroup_dirs(pid: int) -> set[str]:
    """The directories of every cgroup ``pid`` is in, v1 controllers and v2 alike."""
    unified = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "/sys/fs/cgroup/unified"
    dirs = set()
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f.read().splitlines():
            _, controllers, path = line.split(":", 2)
            top = f"/sys/fs/cgroup/{controllers.removeprefix('name=')}" if controllers else unified
            dirs.add(top + path)
    return dirs


@pytest.mark.parametrize("fast", [5], indirect=True)
@pytest.mark.slow
def test_the_idle_service_exits_and_leaves_nothing(fast):
    pid = fast.warm()
    wait_until(lambda: len(host_tree(pid)) >= 2 or not psutil.pid_exists(pid), "the pool to refill", HANG)
    jails = host_tree(pid)
    assert jails
    groups: set[str] = set()
    for proc in jails:
        try:
            groups |= _cgroup_dirs(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            pass  # a helper process of a jail being built, gone already
    groups -= _cgroup_dirs(pid)
    assert ended(pid, HANG)
    assert not fast.socket.exists()
    assert fast.sandbox_dirs() == []
    assert os.listdir(fast.base / "stage") == []
    assert not [p for p in jails if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not [g for g in groups if os.path.exists(f"/sys/fs/cgroup{g}")]
    r, took = fast.run("exec", "--", "echo", "again")  # the next call starts a new one
    assert (r.returncode, r.stdout, took) == (0, b"again\n", "full")
