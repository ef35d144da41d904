"""Child side: pid 1 of a jail.

Forked from the launcher with every module it needs already imported, so it runs after
``pivot_root`` without reading a single file of the host's Python. It serves requests from the
host over one seqpacket control socket, forks commands, reaps every orphan, and drains the
output pipes of background processes so they never die of SIGPIPE. Nothing here trusts the
jail; the host does not trust this process either (untrusted code may have replaced it).

Each command's process tree carries a timer-slack tag (inherited by every thread and child across
fork, exec and setsid) so a timeout can find and kill daemonised grandchildren that left the tree.
No process in the jail can change its tag: every seccomp policy refuses ``prctl(PR_SET_TIMERSLACK)``
and /proc, where ``timerslack_ns`` is, is read-only; the init sets its own through a file it opened
before. The host's file API serves nothing on procfs, so the init never opens its own entries for
the host.

The init outlives what its commands do: it reads at most ``MAX_REQUEST`` bytes of a request and
drops a malformed or oversized one (its reply socket closes unanswered; the control socket stays
usable, and the host refuses such a request before sending it). It sits at the lowest
``oom_score_adj`` this namespace lets it take and puts every command at the highest, so an OOM kill
(a cgroup's, or the host's) takes a command, not the jail: the init sets it once the command has
exec'd, and on every process of the command's tag that was forked before (looked for then, and a
few times in the next 200 ms: a fork under way when the init looks shows its child only later). Stdlib only.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import heapq
import math
import os
import resource
import select
import signal
import socket
import stat
import struct
import termios
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..floor import linux as L
from ..floor import procstat, small, wire
from . import mounts, netns
from .epoll import EpollMaker
from .protocol import InitReady, Step, failure, step
from .replies import (
    DoneReply,
    Entry,
    ExitReply,
    FailureReply,
    Kind,
    OpenedReply,
    PtyOpenedReply,
    Reply,
    StatReply,
    WalkReply,
)
from .requests import (
    MAX_REQUEST,
    MAX_WALK_ENTRIES,
    ConnectRequest,
    DrainRequest,
    ExecRequest,
    KillRequest,
    MkdirRequest,
    OpenRequest,
    Request,
    StatRequest,
    SymlinkRequest,
    WalkRequest,
    decode_request,
    wants_reply,
)
from .spec import JailSpec, SeccompSpec

SLACK_BASE = 50_000
LOOPBACK_FLAGS = 0x1 | 0x40  # IFF_UP | IFF_RUNNING
NOTIF_SIZE = 80  # struct seccomp_notif
NOTIF_ARGS = 32  # offset of its data.args
X32_BIT = 0x40000000
MAX_REFUSED_KINDS = 256
SPAWN_ATTEMPTS = 5
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD)
INIT_OOM_ADJ = (b"-999", b"0")  # lowest first; below -999 the init could never be taken, even by the host
COMMAND_OOM_ADJ = b"1000"
FORK_CHECKS = (0.002, 0.02, 0.2)  # seconds after a command's start at which the init sets it (and its forks) again
SWEEPS = 3  # passes over a command's tag for processes it forked before its oom_score_adj was set
EXEC_WAIT = 1.0  # seconds the init waits for a forked command to exec before going on
IPC_SYSCTLS = frozenset({"shmmax", "shmall", "msgmni", "sem"})  # what the host may set of /proc/sys/kernel
Handler = Callable[[Any, list[int], Any], None]  # an ``op_*`` method: its request's own type, fds, reply


class _StartError(Exception):
    """A command could not be started; reported like a shell would (exit 127 or 126)."""

    def __init__(self, what: str, exc: OSError) -> None:
        super().__init__(f"jailbox: {what}: {exc.strerror}")
        self.code = 127 if exc.errno == errno.ENOENT else 126
        self.errno = exc.errno


def boot(spec: JailSpec, ctl: socket.socket, lifeline: int, reparented: int, trees: dict[str, int]) -> None:
    """Build the jail, tie its life to the launcher, report ready, then serve forever. ``trees``:
    host path -> a detached idmapped mount of it (``mounts.build``)."""
    try:
        upper = mounts.build(spec, trees)
        with step(Step.HOSTNAME):
            L.sethostname(spec.hostname)
            set_name("jailbox-init")
        with step(Step.RLIMITS):
            _bound_ipc(spec.ipc)
        with step(Step.PROC):
            slack, proc = mounts.seal_proc()
            _lowest_oom_adj(proc)
        if spec.net.new_netns:
            with step(Step.LOOPBACK):
                _loopback_up()
        with step(Step.NETWORK):
            net_fds = netns.setup(spec.net)
        with step(Step.LIFELINE):
            if os.read(reparented, 1) != b"1":
                os._exit(1)
            os.close(reparented)
            L.prctl(L.PR_SET_PDEATHSIG, signal.SIGKILL)
            if wire.wait_readable(lifeline, 0):
                os._exit(1)
        with step(Step.PRIVILEGES):
            L.prctl(L.PR_SET_DUMPABLE, 0)
            L.prctl(L.PR_SET_NO_NEW_PRIVS, 1)
            L.bound_exec_capabilities(spec.caps)
        with step(Step.RLIMITS):
            for name, value in spec.rlimits.items():
                resource.setrlimit(getattr(resource, name), (value, value))
        with step(Step.SECCOMP):
            listener = _install_seccomp(spec.seccomp)
    except BaseException as exc:
        wire.send(ctl, failure(exc, Step.PROTOCOL).to_wire())
        os._exit(1)
    # the network side's descriptors, then the writable layer's (the host copies it for a checkpoint)
    wire.send(ctl, InitReady(seccomp_notify=listener >= 0).to_wire(), [*net_fds, upper])
    for fd in [*net_fds, upper]:
        os.close(fd)
    Init(ctl, spec.seccomp, listener, slack, proc).serve()


def _bound_ipc(values: dict[str, str]) -> None:
    """Set the SysV IPC limits of the jail's own IPC namespace (its root may: it owns it). Nothing
    in the jail can raise them later: /proc is made read-only next, and remounting needs CAP_SYS_ADMIN."""
    for name, value in values.items():
        if name not in IPC_SYSCTLS:
            raise ValueError(f"not a SysV IPC limit: {name!r}")
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(value)


def _lowest_oom_adj(proc: int) -> None:
    """Take the lowest ``oom_score_adj`` allowed here: a negative one needs CAP_SYS_RESOURCE of the
    host's user namespace, else the lowest any earlier privileged writer left."""
    for value in INIT_OOM_ADJ:
        try:
            _write_oom_adj(proc, "self", value)
            return
        except OSError:
            continue


def _write_oom_adj(proc: int, pid: str, value: bytes) -> None:
    """Through the detached copy of the jail's /proc (the mounted one is read-only)."""
    fd = os.open(f"{pid}/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def _install_seccomp(filters: SeccompSpec | None) -> int:
    """The last step before serving: everything the init starts from now on inherits the filter.
    Returns the user-notify listener, or -1 where the kernel has none (refusals then go unnamed).
    A policy the init could not live under is left to each command's own child (``in_child``)."""
    if filters is None or filters.in_child:
        return -1
    try:
        return L.install_seccomp(base64.b64decode(filters.notify), listener=True)
    except OSError:
        L.install_seccomp(base64.b64decode(filters.errno), listener=False)
        return -1


def set_name(name: str) -> None:
    """What ``ps`` shows inside the jail for pid 1 (and on the host for the launcher)."""
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | LOOPBACK_FLAGS))  # SIOCSIFFLAGS


class Init:
    def __init__(self, ctl: socket.socket, seccomp: SeccompSpec | None, listener: int, slack: int, proc: int) -> None:
        self.ctl = ctl
        self.listener = listener
        self.slack = slack  # our own timerslack_ns, written to tag what we start next
        self.proc = proc  # the detached copy of the jail's /proc: each command's oom_score_adj is set there
        self.root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.proc_dev = os.stat("/proc").st_dev
        self.refuse_errno = seccomp.errno_value if seccomp else 1
        self.audit_arch = seccomp.audit_arch if seccomp else 0
        self.refused: dict[int, dict[str, int]] = {}  # exec id -> refused syscall key -> count
        self.by_tag: dict[int, int] = {}  # tag -> exec id
        self.child_filter = base64.b64decode(seccomp.errno) if seccomp is not None and seccomp.in_child else None
        self.shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        self.execs: dict[int, tuple[socket.socket, int]] = {}  # pid -> (reply socket, exec id)
        self.tags: dict[int, int] = {}  # exec id -> tag
        self.drains: set[int] = set()
        self.poll = select.poll()
        self.checks: list[tuple[float, int, int]] = []  # heap of (when, pid, tag): looks for forks (FORK_CHECKS)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.poll.register(ctl.fileno(), select.POLLIN)
        self.poll.register(self.wake_r, select.POLLIN)
        if listener >= 0:
            self.poll.register(listener, select.POLLIN)
        self.epoll: EpollMaker | None = None  # where the jail's epoll instances are made (child/epoll.py)
        if listener >= 0 and seccomp is not None and seccomp.epoll_create1 >= 0:
            self.epoll = EpollMaker(
                listener, self.poll, seccomp.epoll_create1, seccomp.epoll_create, seccomp.epoll_maker, slack, SLACK_BASE
            )

    def serve(self) -> None:
        handlers: dict[type[Request], Handler] = {
            ExecRequest: self.op_exec,
            KillRequest: self.op_kill,
            DrainRequest: self.op_drain,
            OpenRequest: self.op_open,
            StatRequest: self.op_stat,
            MkdirRequest: self.op_mkdir,
            WalkRequest: self.op_walk,
            SymlinkRequest: self.op_symlink,
            ConnectRequest: self.op_connect,
        }
        ctl = self.ctl.fileno()
        while True:
            # reap first; an event of a descriptor closed meanwhile (a maker reaped) is passed over:
            # taken for the control socket's, it would wait there for the host's next request
            for fd, _ in sorted(self._poll(), key=lambda event: event[0] != self.wake_r):
                if fd == self.wake_r:
                    self._reap()
                elif fd == self.listener:
                    self._notified()
                elif self.epoll is not None and fd == self.epoll.fileno:
                    self.epoll.made()
                elif fd in self.drains:
                    self._drain(fd)
                elif fd == ctl:
                    self._request(handlers)

    def _poll(self) -> list[tuple[int, int]]:
        self._due_checks()
        wait = None if not self.checks else max(0, math.ceil((self.checks[0][0] - time.monotonic()) * 1000))
        try:
            return self.poll.poll(wait)
        except InterruptedError:
            return []

    def _request(self, handlers: dict[type[Request], Handler]) -> None:
        try:
            msg = wire.recv(self.ctl, max_fds=4, max_bytes=MAX_REQUEST)
        except wire.WireError:
            return  # dropped with its descriptors: its reply socket closes unanswered, the next request is served
        except OSError:
            os._exit(2)
        if msg is None:
            os._exit(0)
        obj, fds = msg
        reply = None
        req: Request | None = None
        try:
            if fds and wants_reply(obj):
                reply = socket.socket(fileno=fds[-1])  # not a socket: it stays in fds, closed below
                fds.pop()
            req = decode_request(obj)  # a malformed request is answered below, like any failure
            handlers[type(req)](req, fds, reply)
        except OSError as exc:
            self._answer(reply, FailureReply(exc.errno or 0, exc.strerror or str(exc)))
        except Exception as exc:  # a bug here must not take the jail down
            self._answer(reply, FailureReply(0, f"{type(exc).__name__}: {exc}"))
        finally:
            for fd in fds:
                os.close(fd)
            if reply is not None and not isinstance(req, ExecRequest):
                reply.close()

    @staticmethod
    def _answer(reply: socket.socket | None, answer: Reply, fds: Sequence[int] = ()) -> None:
        if reply is None:
            return
        try:
            wire.send(reply, answer.to_wire(), fds)
        except OSError:
            pass

    # --- commands -----------------------------------------------------------------------------

    def op_exec(self, req: ExecRequest, fds: list[int], reply: socket.socket) -> None:
        argv = [self.shell, "-c", req.shell] if req.shell is not None else list(req.argv or ())
        tag = SLACK_BASE + 1 + req.id % 100_000
        os.write(self.slack, str(tag).encode())  # inherited by what we fork or spawn next
        pid = self._start(argv, req, fds, reply)
        if pid is None:
            return
        self.execs[pid] = (reply, req.id)
        self.tags[req.id] = tag
        self.by_tag[tag] = req.id
        self._raise_oom_adj(pid, tag)

    def _raise_oom_adj(self, pid: int, tag: int) -> None:
        """Put a command at the highest ``oom_score_adj``, now and at ``FORK_CHECKS`` after its start.
        Until then it has the init's value, and so has what it forks meanwhile (the init may be
        descheduled after the start). The kernel also wakes a spawner before the new program is
        made dumpable, and until then its /proc files are host root's. The init never raises its
        own to pass the value on: an OOM kill in such a moment would take it (the most memory at
        the top when a command's processes hold theirs in the kernel, as CI saw)."""
        self._settle(pid, tag)
        for delay in FORK_CHECKS:
            heapq.heappush(self.checks, (time.monotonic() + delay, pid, tag))

    def _settle(self, pid: int, tag: int) -> None:
        """Set the command ``pid`` if it is not set, and every process of its ``tag`` if it may have
        forked one before: it has children, or it ended and left the init children it did not start."""
        if pid in self.execs:  # still running (or not reaped yet)
            if _oom_adj(pid) != 1000:
                with contextlib.suppress(OSError):  # not dumpable yet, or gone
                    _write_oom_adj(self.proc, str(pid), COMMAND_OOM_ADJ)
            if not _has_children(pid):
                return
        elif not self._orphans():
            return
        for _ in range(SWEEPS):
            found = 0
            for name in os.listdir("/proc"):
                if name.isdigit() and name != "1" and _slack_of(int(name)) == tag and _oom_adj(int(name)) != 1000:
                    found += 1
                    with contextlib.suppress(OSError):  # gone, or not ours to change (a set-id program's)
                        _write_oom_adj(self.proc, name, COMMAND_OOM_ADJ)
            if not found:
                return

    def _orphans(self) -> bool:
        """Whether the init has children that are no command it started (left by one that ended)."""
        try:
            with open("/proc/1/task/1/children", "rb") as f:
                pids = f.read(1 << 20).split()
        except OSError:
            return True
        maker = 0 if self.epoll is None else self.epoll.pid
        return any(int(pid) not in self.execs and int(pid) != maker for pid in pids)

    def _due_checks(self) -> None:
        now = time.monotonic()
        while self.checks and self.checks[0][0] <= now:
            _, pid, tag = heapq.heappop(self.checks)
            self._settle(pid, tag)

    def _start(self, argv: list[str], req: ExecRequest, fds: list[int], reply: socket.socket) -> int | None:
        """The command's pid, or None once a failure to start it has been answered."""
        for attempt in range(SPAWN_ATTEMPTS):
            try:
                if req.tty:
                    pid = self._start_tty(argv, req, reply)
                elif self.child_filter is not None or req.user is not None:
                    pid = self._fork_exec(argv, req, fds[:3], tty=False)
                else:
                    pid = self._spawn(argv, req, fds)
                break
            except _StartError as exc:
                if exc.errno == errno.EAGAIN and attempt + 1 < SPAWN_ATTEMPTS:
                    # a full pids cap: killed processes may just not be reaped yet
                    self._reap()
                    time.sleep(0.01)
                    continue
                self._answer(reply, ExitReply(exc.code, None, error=str(exc)))
                reply.close()
                return None
        return pid

    @staticmethod
    def _spawn(argv: list[str], req: ExecRequest, fds: list[int]) -> int:
        """vfork+exec: no copy of this process. Privileges were shed at boot, so the command
        inherits the timer-slack tag, a new session, default signals, and nothing else of ours."""
        what = f"cd {req.cwd}"
        try:
            os.chdir(req.cwd)
            what = f"exec {argv[0]}"
            path = _which(argv[0], req.env.get("PATH", ""))
            actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds[:3])]
            return os.posix_spawn(
                path, argv, req.env, file_actions=actions, setsid=True, setsigdef=DEFAULT_SIGNALS, setsigmask=()
            )
        except OSError as exc:
            raise _StartError(what, exc) from None
        finally:
            os.chdir("/")

    def _start_tty(self, argv: list[str], req: ExecRequest, reply: socket.socket) -> int:
        """fork+exec on a new pty of the jail's own devpts, so ttyname() works inside."""
        master, slave = os.openpty()
        try:
            pid = self._fork_exec(argv, req, [slave] * 3, tty=True)
            self._answer(reply, PtyOpenedReply(), [master])
            return pid
        finally:
            os.close(master)
            os.close(slave)

    def _fork_exec(self, argv: list[str], req: ExecRequest, stdio: list[int], tty: bool) -> int:
        """fork+exec, for a pty and for policies the init itself could not live under: the
        child installs the seccomp filter as its last step before execve. Returns once the child
        has exec'd or ended (or after ``EXEC_WAIT``): until it has, its /proc files are host
        root's (it is a copy of the undumpable init), and its ``oom_score_adj`` cannot be set."""
        execd, exec_w = os.pipe2(os.O_CLOEXEC)  # the child's end closes at its exec, or its end
        pid = os.fork()
        if pid:
            os.close(exec_w)
            try:
                wire.wait_readable(execd, EXEC_WAIT)
            finally:
                os.close(execd)
            return pid
        what = "start"
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            if tty:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            os.closerange(3, exec_w)
            os.closerange(exec_w + 1, 1 << 20)
            if req.user is not None:
                uid, gid = req.user.uid, req.user.gid
                what = f"switch to uid {uid} gid {gid}"
                os.setgroups(req.user.groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            what = f"cd {req.cwd}"
            os.chdir(req.cwd)
            what = f"exec {argv[0]}"
            path = _which(argv[0], req.env.get("PATH", ""))
            if self.child_filter is not None:
                L.install_seccomp(self.child_filter, listener=False)
            os.execve(path, argv, req.env)
        except OSError as exc:
            os.write(2, f"jailbox: {what}: {exc.strerror}\n".encode(errors="replace"))
            os._exit(127 if exc.errno == errno.ENOENT else 126)
        finally:
            os._exit(127)

    def op_kill(self, req: KillRequest, fds: list[int], reply: socket.socket | None) -> None:
        tag = self.tags.get(req.id)
        if tag is not None:
            for pid, (_, exec_id) in list(self.execs.items()):
                if exec_id == req.id:
                    _kill(pid)
            for _ in range(100):
                if not self._kill_tagged(tag):
                    break
        self._answer(reply, DoneReply())

    @staticmethod
    def _kill_tagged(tag: int) -> int:
        found = 0
        for name in os.listdir("/proc"):
            if name.isdigit() and name != "1" and _slack_of(int(name)) == tag:
                found += 1
                _kill(int(name))
        return found

    def op_drain(self, req: DrainRequest, fds: list[int], reply: socket.socket | None) -> None:
        """Adopt output pipes of finished commands whose background children still write."""
        while fds:
            fd = fds.pop()
            os.set_blocking(fd, False)
            self.drains.add(fd)
            self.poll.register(fd, select.POLLIN)

    def _drain(self, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.poll.unregister(fd)
            self.drains.discard(fd)
            os.close(fd)

    def _notified(self) -> None:
        """Answer one syscall sent here: an epoll instance to make, or a refused call, answered with
        the policy's errno and counted for its command."""
        notif = bytearray(NOTIF_SIZE)
        try:
            fcntl.ioctl(self.listener, L.SECCOMP_IOCTL_NOTIF_RECV, notif, True)
        except OSError:
            return  # the caller died meanwhile
        notif_id, pid, _, nr, arch = struct.unpack_from("QIIiI", notif)
        if self.epoll is not None and arch == self.audit_arch and self.epoll.routes(nr):
            self.epoll.notified(notif_id, pid, nr, struct.unpack_from("Q", notif, NOTIF_ARGS)[0])
            return
        exec_id = self._exec_of(pid)  # while the caller is still blocked in the syscall
        try:
            fcntl.ioctl(
                self.listener, L.SECCOMP_IOCTL_NOTIF_SEND, struct.pack("QqiI", notif_id, 0, -self.refuse_errno, 0)
            )
        except OSError:
            pass
        if arch != self.audit_arch:
            key = f"arch-{arch:#x}:{nr}"
        elif nr & X32_BIT:
            key = f"x32:{nr & ~X32_BIT}"
        else:
            key = str(nr)
        counts = self.refused.setdefault(exec_id, {})
        if len(counts) < MAX_REFUSED_KINDS or key in counts:
            counts[key] = counts.get(key, 0) + 1

    def _exec_of(self, pid: int) -> int:
        """The command a process belongs to: by its tag, else by its ancestry, else the only one."""
        exec_id = self.by_tag.get(_slack_of(pid), 0)
        current = pid
        for _ in range(64):
            if exec_id or current <= 1:
                break
            if current in self.execs:
                exec_id = self.execs[current][1]
            current = procstat.parent(current)
        if not exec_id and len(self.execs) == 1:
            exec_id = next(iter(self.execs.values()))[1]
        return exec_id

    def _reap(self) -> None:
        for pid, status, usage in L.reaped(self.wake_r):
            if self.epoll is not None and self.epoll.reaped(pid):
                continue
            entry = self.execs.pop(pid, None)
            if entry is None:
                continue
            reply, exec_id = entry
            self.by_tag.pop(self.tags.pop(exec_id, 0), None)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = 128 + sig if sig is not None else os.waitstatus_to_exitcode(status)
            refused = self.refused.pop(exec_id, {})
            self._answer(
                reply,
                ExitReply(code, sig, None, refused, usage.ru_utime, usage.ru_stime, usage.ru_maxrss),
            )
            reply.close()

    # --- files --------------------------------------------------------------------------------

    def op_open(self, req: OpenRequest, fds: list[int], reply: socket.socket | None) -> None:
        path = req.path
        if req.write:
            if req.parents:
                os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, req.mode or 0o644)
        else:
            fd = self._open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "Not a regular file")
            os.set_blocking(fd, True)
            if req.write:
                os.ftruncate(fd, 0)
                if req.mode is not None:
                    os.fchmod(fd, req.mode)
            self._answer(reply, OpenedReply(st.st_size, stat.S_IMODE(st.st_mode)), [fd])
        finally:
            os.close(fd)

    def op_stat(self, req: StatRequest, fds: list[int], reply: socket.socket | None) -> None:
        fd = self._open(req.path, os.O_PATH)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self._answer(reply, StatReply(_kind(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode)))

    def _open(self, path: str, flags: int, mode: int = 0, within: int | None = None) -> int:
        """Open ``path`` for the host's file API: never through a magic link (``/proc/*/fd``,
        ``exe``, ``cwd``: ``/dev/stdin`` is one) and never on procfs. This process answers with its
        own privileges, so ``/proc/self`` and ``/proc/1`` would be the init's environment, maps and
        descriptors, and its ``exe`` the host's Python; copying /proc in or out means nothing."""
        try:
            fd = L.open_in_root(self.root if within is None else within, path, flags, mode)
        except OSError as exc:  # reported as open(2) would, without the wrapper's "open PATH: "
            raise OSError(exc.errno, os.strerror(exc.errno or 0)) from None
        if os.fstat(fd).st_dev == self.proc_dev:
            os.close(fd)
            raise PermissionError(errno.EACCES, "Permission denied (procfs is not served)")
        return fd

    def op_mkdir(self, req: MkdirRequest, fds: list[int], reply: socket.socket | None) -> None:
        os.makedirs(req.path, exist_ok=True)
        os.chmod(req.path, req.mode)
        self._answer(reply, DoneReply())

    def op_symlink(self, req: SymlinkRequest, fds: list[int], reply: socket.socket | None) -> None:
        if os.path.lexists(req.path) and not os.path.isdir(req.path):
            os.unlink(req.path)
        os.symlink(req.target, req.path)
        self._answer(reply, DoneReply())

    # --- ports --------------------------------------------------------------------------------

    def op_connect(self, req: ConnectRequest, fds: list[int], reply: socket.socket | None) -> None:
        """Connect to ``req.port`` on the jail's loopback (127.0.0.1, or ::1) from here, inside the
        jail's network namespace, and hand the socket over. Non-blocking: a connection still under
        way (loopback too answers a connect so) is the host's to wait for, never this loop's."""
        family, address = (socket.AF_INET6, "::1") if req.ipv6 else (socket.AF_INET, "127.0.0.1")
        with socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC) as sock:
            code = sock.connect_ex((address, req.port))
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, os.strerror(code))
            self._answer(reply, DoneReply(), [sock.fileno()])

    def op_walk(self, req: WalkRequest, fds: list[int], reply: socket.socket | None) -> None:
        """List a tree without following symlinks: [relpath, kind, mode, size, link target]."""
        entries: list[Entry] = []
        stack = [""]
        top = self._open(req.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while stack:
                rel = stack.pop()
                # by descriptor, each directory opened beneath the top one (links stay inside it)
                fd = self._open(rel, os.O_RDONLY | os.O_DIRECTORY, within=top) if rel else os.dup(top)
                try:
                    with os.scandir(fd) as it:
                        for entry in it:
                            st = entry.stat(follow_symlinks=False)
                            sub = f"{rel}/{entry.name}" if rel else entry.name
                            kind = _kind(st.st_mode)
                            target = os.readlink(entry.name, dir_fd=fd) if kind == "link" else None
                            entries.append((sub, kind, stat.S_IMODE(st.st_mode), st.st_size, target))
                            if kind == "dir" and st.st_dev != self.proc_dev:  # a /proc is listed, not entered
                                stack.append(sub)
                            if len(entries) > MAX_WALK_ENTRIES:
                                raise OSError(errno.EFBIG, f"more than {MAX_WALK_ENTRIES} entries")
                finally:
                    os.close(fd)
        finally:
            os.close(top)
        self._answer(reply, WalkReply(entries))


def _has_children(pid: int) -> bool:
    """Whether ``pid`` has forked a process still alive (one that ended leaves none; the kernel
    lists children per thread, and a command that just exec'd has one thread). True if unknown."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return bool(f.read(16).strip())
    except FileNotFoundError:
        return not os.path.exists(f"/proc/{pid}")  # no such file on this kernel; or the command is gone
    except OSError:
        return True


def _oom_adj(pid: int) -> int:
    return _proc_int(pid, "oom_score_adj", 1000)  # gone: nothing to set


def _slack_of(pid: int) -> int:
    """A process's timer slack: the tag of the command it descends from (0 if gone)."""
    return _proc_int(pid, "timerslack_ns", 0)


def _proc_int(pid: int, name: str, otherwise: int) -> int:
    """The number in ``/proc/PID/name``, or ``otherwise`` if the process is gone."""
    try:
        return int(small.read(f"/proc/{pid}/{name}", 32))
    except ValueError:  # gone (nothing read), or not a number
        return otherwise


def _kind(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _which(name: str, path: str) -> str:
    if "/" in name:
        return name
    for d in path.split(":"):
        candidate = f"{d or '.'}/{name}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, "command not found")
