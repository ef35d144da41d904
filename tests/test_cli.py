"""The jailbox command, run as users run it: a real process, a real pty for the shell."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import JAILBOX

ROOT = Path(__file__).resolve().parent.parent


def jailbox(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)


def test_exec_prints_output_and_exits_with_the_commands_code():
    r = jailbox("exec", "--", "python3", "-c", "print(6*7)")
    assert (r.returncode, r.stdout) == (0, "42\n")
    r = jailbox("exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")


def test_exec_options(tmp_path):
    (tmp_path / "in.txt").write_text("bound")
    tmp_path.chmod(0o755)  # as root, the jail's root is a subordinate id: it reads host files as others do
    r = jailbox(
        "exec",
        "--bind",
        f"{tmp_path}:/data",
        "--env",
        "A=1",
        "--env",
        "B=two=2",
        "--workdir",
        "/work",
        "--hostname",
        "cli-box",
        "--",
        "sh",
        "-c",
        "cat /data/in.txt; echo $A $B; pwd; hostname; touch /data/x",
    )
    assert r.stdout == "bound1 two=2\n/work\ncli-box\n"
    assert r.returncode != 0 and "Read-only" in r.stderr
    rw = "give" if os.getuid() == 0 else "rw"  # as root: give the directory to the jail's root
    r = jailbox("exec", "--bind", f"{tmp_path}:/data:{rw}", "--", "touch", "/data/x")
    assert r.returncode == 0 and (tmp_path / "x").exists()


@pytest.mark.slow
def test_exec_timeout_stdin_and_errors():
    r = jailbox("exec", "--timeout", "0.5", "--", "sleep", "30")
    assert r.returncode == 124 and "timed out" in r.stderr
    r = jailbox("exec", "--", "tr", "a-z", "A-Z", input="shout\n")
    assert r.stdout == "SHOUT\n"
    r = jailbox("exec", "--rootfs", "/no/such/rootfs", "--", "true")
    assert r.returncode == 125 and "/no/such/rootfs" in r.stderr
    r = jailbox("exec", "--bind", "/no/such/dir:/x", "--", "true")
    assert r.returncode == 2 and "/no/such/dir" in r.stderr
    r = jailbox("exec", "--env", "NOEQUALS", "--", "true")
    assert r.returncode == 2 and "K=V" in r.stderr


def test_network_flag(loopback_server):
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server.port} && head -1 <&3"
    assert jailbox("exec", "--", "bash", "-c", probe).returncode != 0
    r = jailbox("exec", "--network", "host", "--", "bash", "-c", probe)
    assert r.stdout == "host-secret-service\n"


@pytest.mark.parametrize("command", [[], ["exec"], ["shell"], ["cleanup"]])
def test_help(command):
    r = jailbox(*command, "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout


def test_shell_on_a_pty():
    pid, master = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execv(sys.executable, [*JAILBOX, "shell", "--hostname", "ttybox"])
    output = b""

    def read_until(marker: bytes, limit: float = 60.0) -> None:
        nonlocal output
        end = time.monotonic() + limit
        while marker not in output and time.monotonic() < end:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    output += os.read(master, 65536)
                except OSError:
                    return

    os.write(master, b"tty; hostname; echo $((6*7))x\n")
    read_until(b"42x")
    os.write(master, b"exit 5\n")
    read_until(b"\x00never")
    _, status = os.waitpid(pid, 0)
    os.close(master)
    text = output.decode(errors="replace")
    assert "/dev/pts/" in text and "ttybox" in text and "42x" in text
    assert os.waitstatus_to_exitcode(status) == 5


def test_cleanup_command(tmp_path, monkeypatch):
    """In a state directory of its own, so that no other test's leftovers count: one sandbox's remains
    whose host process is dead are removed, and then nothing is."""
    base = tmp_path / "state"
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(base))
    never = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    left = base / "sandboxes" / "leftover0001"
    left.mkdir(parents=True, mode=0o700)
    (left / "meta.json").write_text(json.dumps({"host_pid": never, "host_start": 1}))
    first, second = jailbox("cleanup"), jailbox("cleanup")
    assert first.returncode == 0 and f"removed {left}\n" in first.stdout and not left.exists()
    assert first.stdout.splitlines()[-1].startswith("1 removed, 0 failed; cgroups: ")
    assert second.returncode == 0 and second.stdout.splitlines()[-1].startswith("0 removed, 0 failed; cgroups: ")


def test_installed_console_script():
    exe = shutil.which("jailbox", path=os.path.dirname(sys.executable))
    assert exe, "the jailbox console script is installed next to this Python"
    r = subprocess.run([exe, "exec", "--", "python3", "-c", "print(6*7)"], capture_output=True, text=True, timeout=120)
    assert r.stdout == "42\n"
