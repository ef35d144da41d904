"""seccomp policies by syscall name, compiled to classic BPF on the host.

The program checks the architecture first (a foreign ABI such as i386 or x32 is refused), sends
numbers above the highest syscall this table knows to ENOSYS (a newer kernel's syscalls never slip
through a denylist by being unknown; libc treats ENOSYS as "not supported here" and falls back),
applies the argument rules every jail gets (``clone`` with namespace flags, ``socket`` for AF_ALG,
AF_VSOCK and NETLINK_USERSOCK, ``ioctl(TIOCSTI)``, ``prctl(PR_SET_TIMERSLACK)``: the timer slack is
the tag the init finds a command's processes by on timeout), then the policy's allow and deny lists.
NETLINK_USERSOCK is the one netlink protocol whose sockets send to each other without privilege, a
memcpy into a queue no cgroup counts: 3,000 pairs filled 1.1 GiB in 0.2 s, faster than any sampling
holds (the watcher holds what the kernel's own netlink replies fill, ``limits/watch.py``).

A jail with a read-write bind also gets the mode rules (``guard_modes``): what it makes there is a
file on the host, owned by a subordinate id every host user can run. seccomp sees no paths, so
everywhere in the jail: no setuid or setgid bit by chmod/fchmod/fchmodat/fchmodat2, nor at
creation (open/openat/creat with O_CREAT or O_TMPFILE, mknod/mknodat); no mknod/mknodat of
anything but a regular file (device nodes, FIFOs, sockets); ``openat2`` (its mode is in memory BPF
cannot read) is ENOSYS, so libc falls back to ``openat``; ``io_uring_setup`` (its opens bypass
seccomp) is refused even where the policy allows it.

A jail whose memory the host's watcher holds (no cgroup) gets ``memfd_create`` as ENOSYS, as on a
kernel before 3.17, and programs fall back to a file in /dev/shm or /tmp (the jail's bounded tmpfs).
A memfd's pages belong to no tmpfs with a size, and to no process's pages until mapped and touched:
written with ``write()``, or held only by a mapping or a message in flight, they are memory the
watcher cannot see (1 GiB was written past a 256M limit that way).

``io_setup`` is ENOSYS in every jail unless the policy allows it by name, as on a kernel built
without AIO: programs that use native AIO (databases, QEMU) fall back to threads. Its events are
one count for the whole host (``fs.aio-max-nr``, 65536 by default), which no namespace, cgroup or
rlimit divides: one default jail reserved all of them, and every host process's ``io_setup()``,
root's too, failed with EAGAIN until the jail ended.

Refused calls go to the jail's init as ``SECCOMP_RET_USER_NOTIF`` when the kernel supports a
listener: the init answers with the policy's errno and counts them per command, which is how an
``ExecResult`` can name them. Without a listener the same program answers the errno directly.
"""

from __future__ import annotations

import errno as errnos
import struct

from ..errors import ConfigError
from .policy import SeccompPolicy
from .syscalls import AUDIT_ARCH, arch, syscall_numbers, syscall_table

# classic BPF
_LD_W_ABS = 0x20
_AND_K = 0x54
_JEQ = 0x15
_JGT = 0x25
_JSET = 0x45
_RET = 0x06

RET_ALLOW = 0x7FFF0000
RET_NOTIFY = 0x7FC00000
RET_ERRNO = 0x00050000

# seccomp_data offsets
_NR, _ARCH, _ARG0, _ARG1, _ARG2, _ARG3 = 0, 4, 16, 24, 32, 40

X32_BIT = 0x40000000
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
AF_NETLINK, AF_ALG, AF_VSOCK = 16, 38, 40
NETLINK_USERSOCK = 2
TIOCSTI = 0x5412
PR_SET_TIMERSLACK = 29
SET_ID_BITS = 0o6000  # S_ISUID | S_ISGID
S_IFMT, S_IFREG = 0o170000, 0o100000
CREATING = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE (the same bits on x86_64 and aarch64)
# syscall -> (argument offset of its flags, or None; of its mode): where a mode can set a set-id bit
MODE_ARGS: dict[str, tuple[int | None, int]] = {
    "chmod": (None, _ARG1),
    "fchmod": (None, _ARG1),
    "fchmodat": (None, _ARG2),
    "fchmodat2": (None, _ARG2),
    "creat": (None, _ARG1),
    "open": (_ARG1, _ARG2),
    "openat": (_ARG2, _ARG3),
}
MKNOD_ARGS = {"mknod": _ARG1, "mknodat": _ARG2}  # the mode, which also holds the file type

# Docker's default profile, as names: what an unprivileged container may not do.
DEFAULT_DENY = (
    "acct", "add_key", "adjtimex", "bpf", "chroot", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "fanotify_init", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm",
    "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mbind", "migrate_pages",
    "mount", "mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "open_tree_attr", "perf_event_open", "pidfd_getfd", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot",
    "request_key", "set_mempolicy", "set_mempolicy_home_node", "setns", "settimeofday", "swapoff", "swapon",
    "_sysctl", "sysfs", "syslog", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vhangup", "vm86",
    "vm86old",
)  # fmt: skip


# What the jail's init calls while serving (from strace of a busy init). A policy that refuses none
# of these is installed on the init itself, so commands start by vfork and refusals are reported
# by name; any other policy is installed by each command's own child right before execve.
INIT_SYSCALLS = frozenset(
    "access brk chdir chmod clone close dup dup2 dup3 exit exit_group fchdir fchmod fcntl fstat ftruncate futex "
    "getcwd getdents64 getpid getrandom getsockname getsockopt gettid ioctl kill lseek lstat madvise memfd_create "
    "mkdir mkdirat mmap mprotect mremap munmap newfstatat openat pipe2 poll ppoll pread64 prctl prlimit64 read "
    "readlink readlinkat recvmsg restart_syscall rt_sigaction rt_sigprocmask rt_sigreturn rseq sendmsg sendto "
    "set_robust_list sigaltstack stat statx symlink symlinkat tgkill unlink unlinkat wait4 write".split()
)


def init_can_live_under(policy: SeccompPolicy) -> bool:
    return policy.default == "allow" and not (INIT_SYSCALLS & set(policy.deny))


# What the init's epoll maker calls beyond what the init does (``child/epoll.py``)
MAKER_SYSCALLS = frozenset({"setgroups", "setresgid", "setresuid", "epoll_create1"})


def epoll_calls(policy: SeccompPolicy) -> tuple[int, int]:
    """The numbers of ``epoll_create1`` and ``epoll_create`` (-1: not one) whose instances the init's
    maker can make for the jail (``child/epoll.py``): the init lives under the policy, which lets
    the maker switch ids and make them, and lets the jail call them. (-1, -1) where it cannot."""
    if not init_can_live_under(policy):
        return -1, -1
    custom_deny = set(policy.deny)
    allowed = set(policy.allow) - custom_deny
    denied = custom_deny | ((set(DEFAULT_DENY) if policy.docker_defaults else set()) - allowed)
    if MAKER_SYSCALLS & denied:
        return -1, -1
    table = syscall_table(arch())
    create = table.get("epoll_create", -1) if "epoll_create" not in denied else -1
    return table["epoll_create1"], create


Jump = int | str  # an offset, or the name of a label further on


class _Program:
    """A forward-only BPF assembler: jumps name labels, resolved when the program is done."""

    def __init__(self) -> None:
        self.code: list[tuple[int, Jump, Jump, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: Jump = 0, jf: Jump = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = []
        for pc, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                off = self.labels[target] - pc - 1 if isinstance(target, str) else target
                if not 0 <= off <= 255:
                    raise ConfigError("seccomp policy too large for one BPF jump; use fewer names")
                offsets.append(off)
            out.append(struct.pack("HBBI", code, offsets[0], offsets[1], k & 0xFFFFFFFF))
        return b"".join(out)


def compile_policy(
    policy: SeccompPolicy,
    notify: bool,
    guard_modes: bool = False,
    chroot: bool = False,
    no_memfd: bool = False,
    make_epoll: bool = False,
) -> bytes:
    """The BPF program (struct sock_filter array) for ``policy`` on this machine; ``guard_modes``
    for a jail with a read-write bind (see the module docstring); ``chroot`` takes ``chroot`` off
    Docker's denylist, as Docker's profile does for a container holding CAP_SYS_CHROOT (a chroot
    inside the jail's mount namespace leads no further out than the jail's root); ``no_memfd`` makes
    ``memfd_create`` ENOSYS, for a jail whose memory no cgroup counts (see the module docstring);
    ``make_epoll`` sends ``epoll_calls`` to the listener too, where the init has them made (with ``notify``)."""
    machine = arch()
    table = syscall_table(machine)
    refuse = RET_NOTIFY if notify else RET_ERRNO | policy.errno
    enosys = RET_ERRNO | errnos.ENOSYS
    custom_deny = set(syscall_numbers(list(policy.deny), machine, strict=True))
    allow = set(syscall_numbers(list(policy.allow), machine, strict=True)) - custom_deny
    if policy.docker_defaults:
        docker = [name for name in DEFAULT_DENY if not (chroot and name == "chroot")]
        deny = custom_deny | set(syscall_numbers(docker, machine, strict=False))
    else:
        deny = set(custom_deny)
    deny -= allow
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.op(_JEQ, AUDIT_ARCH[machine], 0, "refuse")
    p.op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        p.op(_JSET, X32_BIT, "refuse", 0)
    p.op(_JGT, max(table.values()), "enosys", 0)
    p.op(_JEQ, table["clone3"], "enosys", 0)  # its flags live in memory BPF cannot read
    if no_memfd:
        p.op(_JEQ, table["memfd_create"], "enosys", 0)
    if "io_setup" not in policy.allow:
        p.op(_JEQ, table["io_setup"], "enosys", 0)  # the host's one AIO count (see the module docstring)
    # any other prctl goes on to the policy's lists, so this rule comes first and reloads the number
    p.op(_JEQ, table["prctl"], 0, "lists")
    p.op(_LD_W_ABS, _ARG0)
    p.op(_JEQ, PR_SET_TIMERSLACK, "refuse", 0)
    p.op(_LD_W_ABS, _NR)
    p.label("lists")
    if guard_modes:
        _mode_rules(p, table)
    if notify and make_epoll:
        for nr in epoll_calls(policy):
            if nr >= 0:
                p.op(_JEQ, nr, "make", 0)
    p.op(_JEQ, table["clone"], "clone", 0)
    p.op(_JEQ, table["socket"], "socket", 0)
    p.op(_JEQ, table["ioctl"], "ioctl", 0)
    for nr in sorted(allow):
        p.op(_JEQ, nr, "allow", 0)
    for nr in sorted(deny):
        p.op(_JEQ, nr, "refuse", 0)
    p.op(_RET, RET_ALLOW if policy.default == "allow" else refuse)
    p.label("clone")
    p.op(_LD_W_ABS, _ARG0)
    p.op(_JSET, NAMESPACE_FLAGS, "refuse", "allow")
    p.label("socket")
    p.op(_LD_W_ABS, _ARG0)
    p.op(_JEQ, AF_ALG, "refuse", 0)
    p.op(_JEQ, AF_NETLINK, "netlink", 0)
    p.op(_JEQ, AF_VSOCK, "refuse", "allow")
    p.label("netlink")
    p.op(_LD_W_ABS, _ARG2)
    p.op(_JEQ, NETLINK_USERSOCK, "refuse", "allow")
    p.label("ioctl")
    p.op(_LD_W_ABS, _ARG1)
    p.op(_JEQ, TIOCSTI, "refuse", "allow")
    p.label("make")
    p.op(_RET, RET_NOTIFY)
    p.label("allow")
    p.op(_RET, RET_ALLOW)
    p.label("refuse")
    p.op(_RET, refuse)
    p.label("enosys")
    p.op(_RET, enosys)
    return p.assemble()


def _mode_rules(p: _Program, table: dict[str, int]) -> None:
    """Inline, before the lists (BPF jumps only forward): a call that passes its rule reloads
    the number and goes on to the lists at ``checked``."""
    names = [n for n in (*MODE_ARGS, *MKNOD_ARGS) if n in table]  # aarch64 has no chmod, open, creat, mknod
    p.op(_JEQ, table["openat2"], "enosys", 0)
    p.op(_JEQ, table["io_uring_setup"], "refuse", 0)
    for name in names:
        p.op(_JEQ, table[name], f"mode_{name}", 0)
    p.op(_JSET, 0, "checked", "checked")  # nothing is set in 0: always the false branch
    for name in names:
        p.label(f"mode_{name}")
        if name in MKNOD_ARGS:
            p.op(_LD_W_ABS, MKNOD_ARGS[name])
            p.op(_JSET, SET_ID_BITS, "refuse", 0)
            p.op(_AND_K, S_IFMT)
            p.op(_JEQ, 0, "reload", 0)  # no type: a regular file
            p.op(_JEQ, S_IFREG, "reload", "refuse")
            continue
        flags, mode = MODE_ARGS[name]
        if flags is not None:  # the mode counts only when the call creates a file
            p.op(_LD_W_ABS, flags)
            p.op(_JSET, CREATING, 0, "reload")
        p.op(_LD_W_ABS, mode)
        p.op(_JSET, SET_ID_BITS, "refuse", "reload")
    p.label("reload")
    p.op(_LD_W_ABS, _NR)
    p.label("checked")
