"""Attacks from inside on what the jail's root can see of the host and of its own init, and on
timeouts: host-wide kernel state, the init's /proc entries (directly and through the host's file
API), host paths in mountinfo, and a command's processes leaving the tag a timeout kills them by."""

from __future__ import annotations

import errno
import os
import textwrap
import time
from pathlib import Path

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.config import SeccompPolicy
from jailbox.sandbox.errors import SandboxFileError

PROC_FILES = (
    "kpagecount", "kpageflags", "kpagecgroup", "slabinfo", "kcore", "keys", "key-users", "timer_list",
    "sched_debug", "interrupts", "kallsyms", "kmsg", "vmallocinfo", "pagetypeinfo", "iomem", "ioports",
)  # fmt: skip
MASKED_DIRS = ("/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/devices/virtual/powercap")


def py(sb: Sandbox, code: str, **kw):
    return sb.exec(["python3", "-c", textwrap.dedent(code)], **kw)


def test_host_wide_kernel_state_in_proc_and_sys_is_masked(sb):
    files = [f"/proc/{name}" for name in PROC_FILES if os.path.exists(f"/proc/{name}")]
    dirs = [path for path in MASKED_DIRS if os.path.isdir(path)]
    assert "/proc/kpagecount" in files and "/proc/slabinfo" in files
    r = py(
        sb,
        f"""
        import os
        for path in {files!r}:
            with open(path, 'rb') as f:
                print(path, os.fstat(f.fileno()).st_rdev == os.makedev(1, 3), f.read(64))
        for path in {dirs!r}:
            print(path, os.listdir(path), bool(os.statvfs(path).f_flag & os.ST_RDONLY))
        """,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [f"{p} True b''" for p in files] + [f"{p} [] True" for p in dirs]


def test_no_process_knob_in_proc_is_writable(sb):
    """The init's oom_score_adj (which a jail's root could raise, to make the OOM killer take the
    init first), every command's own knobs, by any path to them."""
    before = sb.exec("cat /proc/1/oom_score_adj /proc/1/comm").stdout
    targets = (
        "/proc/1/oom_score_adj", "/proc/1/task/1/oom_score_adj", "/proc/1/oom_adj", "/proc/1/comm",
        "/proc/self/oom_score_adj", "/proc/thread-self/comm", "/proc/self/timerslack_ns", "/proc/self/coredump_filter",
        "/proc/sys/kernel/hostname",
    )  # fmt: skip
    r = py(
        sb,
        f"""
        import os
        for path in {targets!r}:
            try:
                fd = os.open(path, os.O_WRONLY)
                print(path, 'written', os.write(fd, b'1000'))
            except OSError as e:
                print(path, e.errno)
        """,
    )
    # the init's entries and /proc/sys belong to the host's root in a rootless jail: permission is
    # refused there before the read-only mount is consulted; a process's own entries are its own
    refused = {path: int(err) for path, err in (line.split() for line in r.stdout.splitlines())}
    assert refused.keys() == set(targets)
    own = ("/proc/self/", "/proc/thread-self/")
    assert all(err == errno.EROFS or (err == errno.EACCES and not p.startswith(own)) for p, err in refused.items())
    assert sb.exec("cat /proc/1/oom_score_adj /proc/1/comm").stdout == before


def test_host_file_api_never_serves_procfs_or_magic_links(sb, tmp_path: Path):
    """The init opens files for the host with its own identity: through /proc that would be the
    init's environment, maps and descriptors, and /proc/1/exe the host's Python."""
    sb.exec("ln -s /proc/1/environ /tmp/env; ln -s /proc/self /tmp/me; ln -s /proc /tmp/p; ln -s /proc/1/root /tmp/r")
    reads = (
        "/proc/1/environ", "/proc/self/maps", "/proc/self/environ", "/proc/thread-self/status",
        "/proc/1/task/1/environ", "/proc/self/fdinfo/0", "/proc/1/exe", "/proc/self/root/etc/hostname",
        "/proc/self/fd/0", "/dev/stdin", "/tmp/env", "/tmp/me/maps", "/tmp/p/1/environ", "/tmp/r/etc/hostname",
        "/proc/version", "/proc/sys/kernel/hostname",
    )  # fmt: skip
    for path in reads:
        with pytest.raises(SandboxFileError) as exc:
            sb.read_file(path)
        assert exc.value.errno in (errno.EACCES, errno.ELOOP), (path, exc.value)
    for path in ("/proc/1", "/proc/self", "/tmp/me", "/tmp/p"):
        with pytest.raises(SandboxFileError) as exc:
            sb.get(path, tmp_path / "out")
        assert exc.value.errno == errno.EACCES, (path, exc.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SandboxFileError):
        sb.write_file("/proc/self/comm", "x")
    assert sb.read_file("/etc/hostname") == b"sandbox\n"
    sb.exec("mkdir -p /tmp/tree/sub && echo hi > /tmp/tree/sub/f && ln -s /proc/1 /tmp/tree/link")
    sb.get("/tmp/tree", tmp_path / "tree")
    assert (tmp_path / "tree/sub/f").read_text() == "hi\n"
    assert os.readlink(tmp_path / "tree/link") == "/proc/1"


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_mountinfo_names_no_host_path(upper):
    with Sandbox(upper=upper) as sb:
        mountinfo = sb.exec("cat /proc/self/mountinfo").stdout
        state = os.environ["JAILBOX_STATE_DIR"]
        assert state not in mountinfo and "/stage" not in mountinfo
        root = mountinfo.splitlines()[0].split()
        assert root[4] == "/" and root[-1].startswith("rw,lowerdir=lower,upperdir=")


# A command whose daemonised grandchild (double fork, setsid or a new process group) drops the tag
# the init kills a command's processes by, then lives on (re-exec'ing itself in one variant).
ESCAPE = """
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
how = sys.argv[1]

def untag():
    if libc.prctl(29, 1, 0, 0, 0) != 0:  # PR_SET_TIMERSLACK
        print('prctl refused', ctypes.get_errno(), flush=True)
    try:
        with open('/proc/self/timerslack_ns', 'w') as f:
            f.write('1')
    except OSError as e:
        print('timerslack_ns refused', e.errno, flush=True)

def daemon():
    if os.fork() == 0:
        os.setpgid(0, 0) if how == 'pgrp' else os.setsid()
        if os.fork() == 0:
            untag()
            if how == 'reexec':
                os.execvp('sleep', ['sleep', '900'])
            time.sleep(900)
        os._exit(0)

if how == 'thread':  # a thread drops its own slack (it is per thread) and forks from there
    thread = threading.Thread(target=lambda: (untag(), daemon()))
    thread.start()
    thread.join()
else:
    daemon()
time.sleep(900)
"""

LEFT = "import os; print(sorted(p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())))"


def _left(sb: Sandbox) -> str:
    """Processes in the jail other than its init and this probe, once killed ones are reaped."""
    for _ in range(50):
        left = sb.exec(["python3", "-c", LEFT]).stdout.strip()
        if left == "[]":
            break
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(
    "config",
    [{}, {"seccomp": SeccompPolicy(deny=("chmod",))}, {"user": "1000:1000"}],
    ids=["spawned", "filter-in-child", "other-user"],
)
@pytest.mark.parametrize("how", ["setsid", "pgrp", "reexec", "thread"])
def test_a_timeout_kills_processes_that_try_to_drop_their_tag(how, config):
    with Sandbox(**config) as sb:
        r = sb.exec(["python3", "-c", ESCAPE, how], timeout=1.5)
        assert r.timed_out
        assert _left(sb) == "[]"
        assert "prctl refused 1" in r.stdout and f"timerslack_ns refused {errno.EROFS}" in r.stdout
        # a filter installed by each command's child answers without the init: refusals go unnamed
        named = {} if "seccomp" in config else {"prctl": 2 if how == "thread" else 1}
        assert r.refused_syscalls == named
        assert sb.exec("echo ok").stdout == "ok\n"


def test_a_timeout_kills_a_shell_daemon_that_writes_its_timer_slack(sb):
    r = sb.exec("(setsid sh -c 'echo 1 > /proc/self/timerslack_ns; exec sleep 900' &); sleep 900", timeout=1)
    assert r.timed_out and _left(sb) == "[]"
    assert "Read-only file system" in r.stderr
