"""The jailbox command stays import-light: ``jailbox exec -- true`` (in-process, and through the service's
fast path) and ``jailbox --help``, run as a user runs them (a real process, a real jail), import only what
they use. Python's ``-X importtime`` lists
every module a process imported; the checks are a deny-list and a module count (beyond what a bare
interpreter in the same environment imports), plus a generous budget of the import time Python itself
reports. Also here: what replaced an import (process start times from /proc, the syscall table loaded
by path) gives the answers the import gave."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.service_probe import ended, listener_pid
from support.waits import wait_until

from jailbox.sandbox import Sandbox, SandboxConfig
from jailbox.sandbox.floor.procstat import start_ticks
from jailbox.sandbox.seccomp.syscalls import NEWER, syscall_table

MAIN = "import sys; from jailbox.cli import main; sys.exit(main())"  # the full CLI
QUICK = "import sys; from jailbox.console import main; sys.exit(main())"  # the console script's body

# Measured on a 2-core VM (Python 3.11): exec -- true 301 modules beyond a bare interpreter with a
# regular install (what CI runs), 267 editable (whose finder loads pathlib, re and more up front);
# --help 50, --version 41 (76 with a regular install); --help's count leaves jailbox's own modules
# out (the test lists those exactly). The budgets leave room for a dependency's minor release.
EXEC_MODULES = 330
HELP_MODULES = 80
CLI_DIR = Path(__file__).resolve().parent.parent / "cli"
CLI_MODULES = ["jailbox.cli", *(f"jailbox.cli.{p.stem}" for p in CLI_DIR.glob("*.py") if p.stem[0] != "_")]
# Python's own count of microseconds spent importing (self times summed); several times what a loaded
# 2-core machine showed, so only a heavy new import (the agent, httpx: hundreds of ms) crosses it.
EXEC_IMPORT_US = 3_000_000
HELP_IMPORT_US = 1_000_000
# The fast path (exec through a running service): 28 modules beyond a bare interpreter with the editable
# install (whose finder already loads typing and pathlib), 52 with a regular one; about 20 ms of imports on
# the same VM. Only the stdlib and these of jailbox.
FAST_MODULES = 70
FAST_IMPORT_US = 300_000
FAST_JAILBOX = [
    "jailbox",
    "jailbox.console",
    "jailbox.sandbox",
    "jailbox.sandbox.floor",
    "jailbox.sandbox.floor.wire",
    "jailbox.servers",
    "jailbox.servers.exec_service",
    "jailbox.servers.exec_service.quick",
]

NEVER = ("jailbox.agent", "httpx", "httpcore", "anyio", "sympy", "ray", "yaml")  # and their submodules
EXEC_DENIED = (
    *NEVER,
    "asyncio",  # only AsyncSandbox and the allow: proxy use it
    "jailbox.sandbox.net.proxy",  # only for --network allow:
    "jailbox.sandbox.checks",  # the doctor's probes: only when a jail fails
    "jailbox.sandbox.rootfs.store",  # only for a stored rootfs, not "host"
    "jailbox.servers.exec_service",  # only exec --id
    "psutil",
    "ptrace",  # the syscall table is one data file of it, loaded by path
)
HELP_DENIED = (*NEVER, "pydantic", "pydantic_core", "importlib.metadata", "pathlib", "jailbox.sandbox.config")


def imported(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    """Run ``python -X importtime -c CODE ARGS``: the process, and module -> self microseconds."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,  # not a terminal, whatever runs the tests
        env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"},  # no user config file (it would load yaml)
    )
    modules = {}
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, _, name = line.removeprefix("import time:").split("|")
            modules[name.strip()] = int(self_us)
    return proc, modules


def beyond_bare(*argv: str, code: str = MAIN) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    """The jailbox process and the modules it imported that ``python -c pass`` (site, an editable
    install's finder) did not."""
    _, bare = imported("pass")
    proc, modules = imported(code, *argv)
    return proc, {name: us for name, us in modules.items() if name not in bare}


def denied(modules: dict[str, int], deny: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == d or m.startswith(d + ".") for d in deny))


def test_exec_imports_only_the_jail() -> None:
    proc, modules = beyond_bare("exec", "--", "true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert denied(modules, EXEC_DENIED) == []
    assert len(modules) <= EXEC_MODULES, sorted(modules)
    assert sum(modules.values()) <= EXEC_IMPORT_US, sorted(modules.items(), key=lambda kv: -kv[1])[:20]


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A running service in a state directory of the test's own (short: a socket path has at most 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="jbi-", dir="/tmp"))
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(base))
    monkeypatch.setenv("JAILBOX_SERVICE_IDLE", "600")
    monkeypatch.delenv("JAILBOX_NO_SERVICE", raising=False)  # conftest turns the fast path off for the others
    proc, _ = imported(QUICK, "exec", "--", "true")  # no service yet: this one runs in-process, starts one
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = None
    try:
        log = base / "service.log"
        pid = wait_until(
            lambda: listener_pid(base / "service.sock"), lambda: f"the service; its log: {log.read_text()}", 120
        )
        yield base
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert ended(pid, 120)
        shutil.rmtree(base, ignore_errors=True)


def test_the_fast_path_imports_the_stdlib_and_the_wire_format_only(service: Path) -> None:
    proc, modules = beyond_bare("exec", "--", "true", code=QUICK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(m for m in modules if m.startswith("jailbox")) == FAST_JAILBOX
    assert (
        sorted(m for m in modules if not m.startswith("jailbox") and m.split(".")[0] not in sys.stdlib_module_names)
        == []
    )
    assert len(modules) <= FAST_MODULES, sorted(modules)
    assert sum(modules.values()) <= FAST_IMPORT_US, sorted(modules.items(), key=lambda kv: -kv[1])[:20]


@pytest.mark.parametrize("argv", [("--help",), ("--version",), ("exec", "--help"), ("run", "--help")])
def test_help_and_version_import_click_and_nothing_of_the_jail(argv: tuple[str, ...]) -> None:
    proc, modules = beyond_bare(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert denied(modules, HELP_DENIED) == []
    jailbox = sorted(m for m in modules if m.startswith("jailbox"))
    # errors: what every command catches; escapes: what prints others' text; limits: the default bounds
    # --help shows (constants, no import)
    assert jailbox == sorted(
        [
            "jailbox",
            *CLI_MODULES,  # the commands' declarations: each imports what it runs inside its body
            "jailbox.sandbox",
            "jailbox.sandbox.errors",
            "jailbox.sandbox.escapes",
            "jailbox.sandbox.limits",
        ]
    )
    others = sorted(m for m in modules if not m.startswith("jailbox"))
    assert len(others) <= HELP_MODULES, others
    assert sum(modules.values()) <= HELP_IMPORT_US, sorted(modules.items(), key=lambda kv: -kv[1])[:20]


def test_a_flag_error_on_exec_still_names_the_flag_without_importing_pydantic_first() -> None:
    """``_fed_by`` imports pydantic only to tell its errors from others: a bad --env (no model yet) and a
    bad --workdir (SandboxConfig's) both get one line naming the flag and exit 2."""
    for flag, value in (("--env", "NOEQUALS"), ("--workdir", "relative/dir"), ("--bind", "/nonexistent-src")):
        proc, _ = imported(MAIN, "exec", flag, value, "--", "true")
        assert proc.returncode == 2, (flag, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"jailbox: {flag}"), (flag, last)


# --- what replaced an import answers as it did ---------------------------------------------------

NASTY_NAMES = (") R 1 2 3 4 5 6 7 8", "a b)(c) 9 9", "))))))))))))))", "x\n) 1", "plain")


def _named(name: str) -> subprocess.Popen[str]:
    """A live process that set its own name (as anything inside a jail may, its init included)."""
    code = "import sys; open('/proc/self/comm', 'w').write(sys.argv[1]); print('ok', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "ok\n"
    return child


def _boot_ticks() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("name", NASTY_NAMES)
def test_start_ticks_reads_past_any_name_a_process_gives_itself(name: str) -> None:
    before = _boot_ticks()
    child = _named(name)
    try:
        assert before - 1 <= start_ticks(child.pid) <= _boot_ticks()  # the kernel's tick, from the boot clock
    finally:
        child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: a zombie
    assert start_ticks(child.pid) is None  # dead, though its pid is still taken
    child.wait()
    assert start_ticks(child.pid) is None  # reaped: gone, not a wrong start


def test_start_ticks_of_a_jails_init_and_of_nothing() -> None:
    before = _boot_ticks()
    with Sandbox(SandboxConfig()) as sb:
        assert before - 1 <= start_ticks(sb.init_pid) <= _boot_ticks()
    for pid in (-1, 0, 2**22 + 1):
        assert start_ticks(pid) is None


def test_the_syscall_table_is_python_ptraces() -> None:
    from ptrace.syscall.linux.aarch64 import SYSCALL_NAMES as AARCH64
    from ptrace.syscall.linux.x86_64 import SYSCALL_NAMES as X86_64

    for machine, names in (("x86_64", X86_64), ("aarch64", AARCH64)):
        expected = {name: nr for nr, name in names.items() if nr < 512}
        expected.update({name: nr for nr, name in NEWER.items()})
        assert syscall_table(machine) == expected
