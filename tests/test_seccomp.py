"""seccomp: what the default policy refuses, how (errno), that it is reported by name, and that
ordinary programs do not notice it."""

from __future__ import annotations

import errno
import subprocess
import zipfile

import pytest
from pydantic import ValidationError

from jailbox.sandbox import Mount, Sandbox, SandboxConfig
from jailbox.sandbox.errors import SecurityWarning
from jailbox.sandbox.seccomp.policy import SeccompPolicy

SYSCALL = "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"


def raw(sb: Sandbox, call: str):
    """Run ``libc.syscall(...)`` inside; return (result, errno, ExecResult)."""
    r = sb.exec(["python3", "-c", SYSCALL + f"r = {call}; print(r, ctypes.get_errno())"])
    assert r.exit_code == 0, r.stderr
    result, err = r.stdout.split()
    return int(result), int(err), r


REFUSED = [  # (name, call): refused by the default policy
    ("unshare", "libc.unshare(0x10000000)"),
    ("setns", "libc.setns(0, 0)"),
    ("mount", "libc.mount(b'none', b'/mnt', b'tmpfs', 0, None)"),
    ("umount2", "libc.umount2(b'/proc', 2)"),
    ("pivot_root", "libc.syscall(155, b'/', b'/')"),
    ("chroot", "libc.chroot(b'/tmp')"),
    ("keyctl", "libc.syscall(250, 0, 0, 0, 0, 0)"),
    ("add_key", "libc.syscall(248, b'user', b'x', b'y', 1, 0)"),
    ("bpf", "libc.syscall(321, 0, 0, 0)"),
    ("userfaultfd", "libc.syscall(323, 0)"),
    ("perf_event_open", "libc.syscall(298, 0, 0, -1, -1, 0)"),
    ("io_uring_setup", "libc.syscall(425, 1, 0)"),
    ("ptrace", "libc.ptrace(16, 1, 0, 0)"),
    ("process_vm_readv", "libc.syscall(310, 1, 0, 0, 0, 0, 0)"),
    ("open_by_handle_at", "libc.syscall(304, -100, 0, 0)"),
    ("init_module", "libc.syscall(175, 0, 0, b'')"),
    ("reboot", "libc.syscall(169, 0, 0, 0, 0)"),
    ("swapon", "libc.swapon(b'/tmp/x', 0)"),
    ("acct", "libc.acct(None)"),
    ("clock_settime", "libc.syscall(227, 0, 0)"),
    ("kexec_load", "libc.syscall(246, 0, 0, 0, 0)"),
    ("clone", "libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)"),
    ("clone", "libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0)"),
    ("socket", "libc.socket(38, 5, 0)"),
    ("socket", "libc.socket(40, 1, 0)"),
]


@pytest.mark.parametrize(("name", "call"), REFUSED)
def test_default_policy_refuses_with_eperm_and_reports_by_name(sb, name, call):
    result, err, r = raw(sb, call)
    assert (result, err) == (-1, errno.EPERM)
    assert r.refused_syscalls.get(name, 0) >= 1, r.refused_syscalls


def test_each_refusal_is_the_filters_own_answer():
    """Nine of the rows above fail with EPERM in a user namespace without any filter (mount, ptrace,
    reboot...): under a policy whose errno is EACCES, which no namespace gives, each is the filter's."""
    with Sandbox(seccomp=SeccompPolicy(errno=errno.EACCES)) as sb:
        for name, call in REFUSED:
            result, err, r = raw(sb, call)
            assert (result, err, r.refused_syscalls) == (-1, errno.EACCES, {name: 1}), name


def test_x32_clone3_and_unknown_numbers(sb):
    result, err, r = raw(sb, "libc.syscall(0x40000000 | 39)")  # x32 getpid
    assert (result, err) == (-1, errno.EPERM)
    assert r.refused_syscalls == {"x32:39": 1}
    result, err, r = raw(sb, "libc.syscall(435, 0, 0)")  # clone3: libc falls back to clone
    assert (result, err, r.refused_syscalls) == (-1, errno.ENOSYS, {})
    result, err, r = raw(sb, "libc.syscall(1023)")  # newer than any table
    assert (result, err, r.refused_syscalls) == (-1, errno.ENOSYS, {})


def test_tiocsti_is_refused(sb):
    r = sb.exec(
        ["python3", "-c", "import fcntl, os, termios; m, s = os.openpty(); fcntl.ioctl(s, termios.TIOCSTI, b'x')"]
    )
    assert "Operation not permitted" in r.stderr
    assert r.refused_syscalls == {"ioctl": 1}


@pytest.mark.needs("gcc", "git")
def test_ordinary_programs_work(sb):
    sb.write_file("/testbed/m.c", '#include <stdio.h>\nint main(void) { printf("%d\\n", 6 * 7); return 0; }\n')
    r = sb.exec(
        "set -e; cd /testbed; gcc m.c -o m; ./m;"
        "git init -q repo; cd repo; git -c user.email=a@b -c user.name=n commit -q --allow-empty -m one;"
        "git log --oneline | wc -l;"
        "python3 -c 'import threading, multiprocessing as mp; t = threading.Thread(target=print, args=(1,));"
        " t.start(); t.join(); print(mp.Pool(2).map(abs, [-2, -3]))'",
        timeout=120,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "42\n1\n1\n[2, 3]\n"
    assert r.refused_syscalls == {}


def test_pip_installs_a_local_wheel(sb, tmp_path):
    wheel = tmp_path / "hello_jail-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("hello_jail.py", "def hi():\n    return 'hi from a wheel'\n")
        z.writestr("hello_jail-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hello-jail\nVersion: 1.0\n")
        z.writestr(
            "hello_jail-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr("hello_jail-1.0.dist-info/RECORD", "")
    sb.put(wheel, f"/testbed/{wheel.name}")
    r = sb.exec(
        f"python3 -m pip install --no-index --target /testbed/lib /testbed/{wheel.name} -q &&"
        " PYTHONPATH=/testbed/lib python3 -c 'import hello_jail; print(hello_jail.hi())'",
        timeout=300,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip().endswith("hi from a wheel")
    assert r.refused_syscalls == {}


def test_custom_policy_by_name_with_its_own_errno():
    policy = SeccompPolicy(deny=("link", "linkat"), errno=errno.EACCES)
    with Sandbox(seccomp=policy) as sb:
        r = sb.exec("touch /testbed/a && ln /testbed/a /testbed/b")
        assert r.exit_code != 0 and "Permission denied" in r.stderr
        assert r.refused_syscalls == {"linkat": 1}
        result, err, _ = raw(sb, "libc.unshare(0x10000000)")  # Docker's list still applies
        assert (result, err) == (-1, errno.EACCES)
    loose = SeccompPolicy(docker_defaults=False, allow=("unshare",))
    with Sandbox(seccomp=loose) as sb:
        result, err, r = raw(sb, "libc.unshare(0x10000000)")
        assert result == 0 and r.refused_syscalls == {}


def test_policy_the_init_cannot_live_under_is_applied_per_command(tmp_path):
    """Denying what the init itself needs (mkdir here) moves the filter into each command."""
    with Sandbox(seccomp=SeccompPolicy(deny=("mkdir", "mkdirat"))) as sb:
        r = sb.exec("mkdir /testbed/d")
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr
        (tmp_path / "tree" / "sub").mkdir(parents=True)
        sb.put(tmp_path / "tree", "/testbed/tree")  # the init still works for the host
        assert sb.exec("ls /testbed/tree").stdout == "sub\n"


GETPPID = "#include <stdio.h>\n#include <errno.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n"
GETPPID += 'int main(void) { long r = syscall(SYS_getppid); printf("%ld %d\\n", r, r < 0 ? errno : 0); return 0; }\n'
DENY_ALLOW = (
    "execve brk arch_prctl mmap munmap mprotect access openat newfstatat fstat close read pread64 "
    "set_tid_address set_robust_list rseq prlimit64 getrandom exit_group write readlinkat uname"
).split()


@pytest.mark.needs("gcc")
def test_deny_by_default_policy(tmp_path):
    """A static program makes only the listed calls and getppid, which every namespace allows: with
    default "deny" it is refused with EPERM unless listed. (Refusals of a policy the init cannot live
    under are answered in each command, with no report by name: refused_syscalls stays empty.)"""
    (tmp_path / "p.c").write_text(GETPPID)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(tmp_path / "p"), str(tmp_path / "p.c")], check=True)
    tmp_path.chmod(0o755)  # root's jails run as a subordinate id
    tool = Mount(tmp_path, "/tool")
    with Sandbox(seccomp=SeccompPolicy(default="deny", allow=tuple(DENY_ALLOW)), mounts=[tool]) as sb:
        assert sb.exec(["true"]).exit_code == 0
        r = sb.exec(["/tool/p"])
        assert (r.exit_code, r.stdout) == (0, f"-1 {errno.EPERM}\n"), r.stderr
    with Sandbox(seccomp=SeccompPolicy(default="deny", allow=(*DENY_ALLOW, "getppid")), mounts=[tool]) as sb:
        r = sb.exec(["/tool/p"])
        assert (r.exit_code, r.stdout) == (0, "1 0\n"), r.stderr  # the init is the command's parent


def test_unknown_names_are_a_clear_error():
    with pytest.raises(ValidationError, match=r"unknown syscall name.*no_such_call"):
        SeccompPolicy(deny=("no_such_call",))
    with pytest.raises(ValidationError, match="unknown syscall name"):
        SandboxConfig(seccomp={"allow": ["mount", "frobnicate"]})


def test_seccomp_off_warns_and_is_off():
    with pytest.warns(SecurityWarning, match="seccomp is OFF"):
        sb = Sandbox(seccomp=None)
    with sb:
        result, err, r = raw(sb, "libc.unshare(0x10000000)")
        assert (result, err) == (0, 0) and r.refused_syscalls == {}
