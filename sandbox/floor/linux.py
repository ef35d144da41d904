"""Thin ctypes wrappers for the Linux calls the standard library lacks.

Stdlib only: this module is imported by the launcher and the in-jail init, which run with
``python -I -S`` and must not touch site-packages. Every wrapper raises ``OSError`` with errno
and a short description of what was attempted, so a refused step names itself.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
from collections.abc import Iterable, Iterator

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101
SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
OPEN_TREE_CLONE = 1
MOUNT_ATTR_IDMAP = 0x00100000
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4

_SYSCALLS = {
    "x86_64": {
        "pivot_root": 155,
        "capget": 125,
        "capset": 126,
        "seccomp": 317,
        "getdents64": 217,
        "openat2": 437,
        "mount_setattr": 442,
        "open_tree": 428,
        "move_mount": 429,
        "pidfd_getfd": 438,
        "process_vm_readv": 310,
    },
    "aarch64": {
        "pivot_root": 41,
        "capget": 90,
        "capset": 91,
        "seccomp": 277,
        "getdents64": 61,
        "openat2": 437,
        "mount_setattr": 442,
        "open_tree": 428,
        "move_mount": 429,
        "pidfd_getfd": 438,
        "process_vm_readv": 270,
    },
}
_NR = _SYSCALLS.get(platform.machine(), _SYSCALLS["x86_64"])

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    what = f"mount {fstype or 'bind'} {source or ''} on {target}"
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), what)


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_libc.syscall(_NR["pivot_root"], _b(new_root), _b(put_old)), "pivot_root")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


def set_comm(name: bytes) -> None:
    """Name the calling thread (what ``ps`` shows), without /proc."""
    buf = ctypes.create_string_buffer(name[:15])
    prctl(PR_SET_NAME, ctypes.addressof(buf))


def make_readonly(path: str) -> None:
    """Make a mount and everything under it read-only (mount_setattr keeps locked flags intact)."""
    set_mount_attrs(path, MOUNT_ATTR_RDONLY)


def set_mount_attrs(path: str, attrs: int) -> None:
    """Set ``MOUNT_ATTR_*`` flags on a mount and everything under it (others stay as they are)."""
    attr = struct.pack("QQQQ", attrs, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = -100  # AT_FDCWD
    res = _libc.syscall(_NR["mount_setattr"], fd, _b(path), AT_RECURSIVE, buf, len(attr))
    _check(res, f"remount of {path}")


def clone_mount(path: str) -> int:
    """open_tree(OPEN_TREE_CLONE): a detached copy of the mount at ``path``, in no namespace."""
    return _check(_libc.syscall(_NR["open_tree"], -100, _b(path), OPEN_TREE_CLONE | os.O_CLOEXEC), f"clone {path}")


def idmapped_clone(path: str, userns: int) -> int:
    """A detached copy of ``path`` and everything mounted under it, whose files' ids are shown
    through ``userns``'s map (an id the file has on disk is taken as one inside the namespace and
    shown as the host id it maps to; writes the other way). Needs CAP_SYS_ADMIN over the
    filesystem, and a filesystem that supports it (ext4, xfs, btrfs, tmpfs...)."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE
    fd = _check(_libc.syscall(_NR["open_tree"], -100, _b(path), flags), f"clone {path}")
    try:
        attr = struct.pack("QQQQ", MOUNT_ATTR_IDMAP, 0, 0, userns)
        buf = ctypes.create_string_buffer(attr, len(attr))
        res = _libc.syscall(_NR["mount_setattr"], fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, buf, len(attr))
        _check(res, f"idmapped mount of {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def fs_type(path: str) -> int:
    """statfs(2)'s f_type of the filesystem ``path`` is on (its magic number)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    _check(_libc.statfs(_b(path), buf), f"statfs {path}")
    return int(struct.unpack_from("l", buf)[0])


def move_mount(tree: int, target: str) -> None:
    """Attach the detached mount ``tree`` (``clone_mount``, ``idmapped_clone``) at ``target``."""
    res = _libc.syscall(_NR["move_mount"], tree, b"", -100, _b(target), MOVE_MOUNT_F_EMPTY_PATH)
    _check(res, f"move mount to {target}")


MAX_LINKS = 40  # the kernel's own bound on symlinks in one lookup (ELOOP past it)
# openat2 calls made for one open while the kernel answers EAGAIN: a lookup held beneath a directory
# (RESOLVE_BENEATH, RESOLVE_IN_ROOT) gives up at a '..' when any rename or mount on the host happened
# during it, which any jail can cause (3-4% of such opens failed beside one renaming process here)
SCOPED_TRIES = 16


def _openat2(dir_fd: int, path: bytes, flags: int, mode: int, resolve: int) -> tuple[int, int]:
    """openat2 tried up to ``SCOPED_TRIES`` times while it answers EAGAIN: (descriptor, 0) or (-1, errno)."""
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, mode, resolve)
    buf = ctypes.create_string_buffer(how, len(how))
    err = errno.EAGAIN
    for _ in range(SCOPED_TRIES):
        res = _libc.syscall(_NR["openat2"], dir_fd, path, buf, len(how))
        if res >= 0:
            return int(res), 0
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    return -1, err


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """openat2(RESOLVE_IN_ROOT): symlinks in ``path`` resolve inside ``root_fd``, never above it.

    A jail with a read-write bind refuses openat2 itself (ENOSYS: seccomp cannot read the mode in
    its struct), and the init's file API runs under that filter too; and a jail's renames can make
    the kernel give up every try (EAGAIN, ``SCOPED_TRIES``). Then the same resolution is done here,
    a component at a time with ``O_NOFOLLOW``."""
    fd, err = _openat2(root_fd, os.fsencode(path), flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    if fd >= 0:
        return fd
    if err in (errno.ENOSYS, errno.EAGAIN):
        return _walk_in_root(root_fd, path, flags, mode)
    raise OSError(err, f"open {path}: {os.strerror(err)}")


def open_beneath(dir_fd: int, path: str | bytes, flags: int, resolve: int = 0) -> int:
    """openat2(RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS|``resolve``): ``path`` below ``dir_fd`` (EXDEV
    when resolution would leave it; tried again while a race elsewhere makes the kernel give up at a
    ``..``, ``SCOPED_TRIES``), as the host opens what a jail or an image made. With
    ``RESOLVE_NO_SYMLINKS`` (ELOOP for a link anywhere on the path), where openat2 is refused (ENOSYS:
    the host itself under a seccomp profile older than it), a component at a time with ``O_NOFOLLOW``;
    ``path`` is then names only, no ``..``."""
    raw = os.fsencode(path or ".")
    fd, err = _openat2(dir_fd, raw, flags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | resolve)
    if fd >= 0:
        return fd
    if err != errno.ENOSYS or not resolve & RESOLVE_NO_SYMLINKS:
        raise OSError(err, os.strerror(err), os.fsdecode(raw))
    *dirs, last = raw.split(b"/")
    fd = os.dup(dir_fd)
    try:
        for name in dirs:
            fd, parent = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd), fd
            os.close(parent)
        return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


DT_UNKNOWN, DT_DIR = 0, 4
_DIRENT = struct.Struct("QqHB")  # struct linux_dirent64: d_ino, d_off, d_reclen, d_type, then the name


def entries_from(fd: int, cookie: int) -> Iterator[tuple[bytes, int, int]]:
    """The entries of directory ``fd`` from ``cookie`` (0: its start; else a ``d_off`` it gave) as
    (name, d_type, the cookie after it), ``.`` and ``..`` left out: what ``seekdir`` and ``readdir``
    give, which ``os.scandir`` cannot (a removal resumes where it left a huge directory instead of
    reading it again from the start)."""
    os.lseek(fd, cookie, os.SEEK_SET)
    buf = ctypes.create_string_buffer(8192)  # a few dozen entries: a caller may want only the first
    while True:
        size = _check(_libc.syscall(_NR["getdents64"], fd, buf, len(buf)), "getdents64")
        if size == 0:
            return
        data, at = ctypes.string_at(buf, size), 0
        while at < size:
            _, after, length, kind = _DIRENT.unpack_from(data, at)
            name = data[at + _DIRENT.size : at + length].split(b"\0", 1)[0]
            at += length
            if name not in (b".", b".."):
                yield name, kind, after


def _walk_in_root(root_fd: int, path: str, flags: int, mode: int) -> int:
    """``open_in_root`` without openat2: each directory opened ``O_PATH|O_NOFOLLOW`` from the one
    before, ``..`` never above ``root_fd``, a symlink's target read and walked the same way (an
    absolute one from ``root_fd``), at most ``MAX_LINKS`` of them; the last component opened with
    ``flags`` and ``O_NOFOLLOW`` once it is known not to be a link."""
    stack = [os.dup(root_fd)]  # the directories walked, root first: ".." pops, never past the root
    pending = [c for c in path.split("/") if c not in ("", ".")]
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            try:
                target = os.readlink(name, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a link; ENOENT: made below
                    raise
            else:
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                pending = [c for c in target.split("/") if c not in ("", ".")] + pending
                continue
            if not pending:
                return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=stack[-1])
            stack.append(os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=stack[-1]))
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=stack[-1])  # the path named a directory
    finally:
        for fd in stack:
            os.close(fd)


CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)  # fmt: skip
"""Capability names without ``CAP_``, by number (linux/capability.h)."""


def cap_mask(names: Iterable[str]) -> int:
    """The bit mask of capability names (known ones, without ``CAP_``)."""
    mask = 0
    for name in names:
        mask |= 1 << CAPABILITIES.index(name)
    return mask


def bound_exec_capabilities(keep: int) -> None:
    """Let what this process execs hold at most the capabilities in the mask ``keep``, while it keeps its own.

    The bounding set shrinks to ``keep`` and the ambient and inheritable sets empty, so a program
    executed as uid 0 starts with exactly ``keep`` (of this user namespace), one executed as any
    other uid with none, and nothing any of them does later gets past the bounding set
    (``no_new_privs`` makes file capabilities and set-id bits count for nothing). With ``keep``
    empty, SECBIT_NOROOT (locked) as well: uid 0 then execs with no capabilities at all.
    """
    for cap in range(CAP_LAST_CAP + 1):
        if not keep >> cap & 1:
            prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if not keep:
        prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED)
    header = struct.pack("Ii", 0x20080522, 0)
    data = ctypes.create_string_buffer(24)
    _check(_libc.syscall(_NR["capget"], header, data), "capget")
    eff0, prm0, _, eff1, prm1, _ = struct.unpack("6I", data.raw)
    _check(_libc.syscall(_NR["capset"], header, struct.pack("6I", eff0, prm0, 0, eff1, prm1, 0)), "capset")


def setuid_keeping_capabilities(uid: int) -> None:
    """Take ``uid`` as real, effective and saved uid and keep every capability held (effective too):
    what makes the process privileged to the kernel's checks stays, only its uid changes."""
    prctl(PR_SET_KEEPCAPS, 1)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_KEEPCAPS, 0)
    header = struct.pack("Ii", 0x20080522, 0)
    data = ctypes.create_string_buffer(24)
    _check(_libc.syscall(_NR["capget"], header, data), "capget")
    _, prm0, inh0, _, prm1, inh1 = struct.unpack("6I", data.raw)
    _check(_libc.syscall(_NR["capset"], header, struct.pack("6I", prm0, prm0, inh0, prm1, prm1, inh1)), "capset")


def install_seccomp(program: bytes, listener: bool) -> int:
    """Load a BPF filter on the calling thread; with ``listener``, return the user-notify fd."""
    filters = ctypes.create_string_buffer(program, len(program))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(filters)), 16)
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if listener else 0
    return _check(_libc.syscall(_NR["seccomp"], SECCOMP_SET_MODE_FILTER, flags, fprog), "seccomp")


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A duplicate (close-on-exec) of descriptor ``fd`` of the process ``pidfd`` refers to: the same
    open file, as ``SCM_RIGHTS`` would pass it. Needs ptrace access to that process."""
    return _check(_libc.syscall(_NR["pidfd_getfd"], pidfd, fd, 0), "pidfd_getfd")


def read_memory(pid: int, address: int, size: int) -> bytes:
    """``size`` bytes at ``address`` of process ``pid`` (``process_vm_readv``; fewer if the range ends
    in unmapped memory). Needs ptrace access to that process."""
    buf = ctypes.create_string_buffer(size)
    local = struct.pack("QQ", ctypes.addressof(buf), size)
    remote = struct.pack("QQ", address, size)
    one, none = ctypes.c_ulong(1), ctypes.c_ulong(0)  # whole registers: a bare int leaves the upper half unset
    got = _check(_libc.syscall(_NR["process_vm_readv"], pid, local, one, remote, one, none), "process_vm_readv")
    return buf.raw[:got]


def reaped(wake_fd: int) -> Iterator[tuple[int, int, resource.struct_rusage]]:
    """Empty a signal wake-up pipe, then yield (pid, status, rusage) of every child that exited.
    The rusage covers the child and the descendants it waited for."""
    try:
        while os.read(wake_fd, 4096):
            pass
    except BlockingIOError:
        pass
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status, usage


def _read_cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 40


CAP_LAST_CAP = _read_cap_last_cap()
