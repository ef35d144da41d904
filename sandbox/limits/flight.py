"""Host side: the watcher's bound on descriptors in flight, which the kernel counts per host uid.

Runs in the host process, called by the watcher thread (``watch.py``); ``PROBE`` is the text of the
probe, a ``python -I -S`` process of its own, one per host uid probed, started by that thread.

Descriptors sent in UNIX messages and not yet received count against the sender's host uid, and the
kernel refuses a sender (ETOOMANYREFS) once its uid has more in flight than the sender's own soft
``RLIMIT_NOFILE``. A rootless jail's root is the user: a jail that keeps 1,025 in flight refuses
every process of the user at the usual soft limit of 1,024 (D-Bus, Wayland and systemd's socket
activation pass descriptors), and, at 20,000 or so, the host's own jailbox. As root, the jails of
root's shared range share their root's uid the same way. No rlimit of the jail bounds this without
breaking programs that need many descriptors, seccomp cannot read what a message carries, and the
kernel gives no count, for a uid or for a jail: only its refusal.

So a probe of that uid, whose soft limit is ``MARK``, passes one descriptor to itself at each
sample, and the next sample reads its answer (the watcher never waits on it): refused, the uid had
more than ``MARK`` in flight. Only then are
the jails of that uid looked at. A socket's queue shows how many descriptors are in flight in it
(``scm_fds`` in ``/proc/PID/fdinfo/FD``, Linux 5.6), and the jail whose commands' sockets show the
most (at least one) loses every process but its init, reported as ``oom_killed``; the next jail of
that uid is judged ``SETTLE`` later, once what the killed held is freed. Queues go with their
sockets; what the kernel holds only in cycles of sockets nobody holds is freed by its collector
(measured: within 0.1 s). Weaknesses, in docs/bounds.md: a queue sent in a message and closed shows as
one descriptor whatever it carries, so a jail that nests its queues may be found after another that
shows more; what the jail put in flight between two samples refuses the user's processes until it
is killed; the kernel's count is one for the uid, so the user's own descriptors in flight count
towards ``MARK`` too (a jail then is killed only if its sockets show some).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence

from .. import hostids
from ..floor import small
from ..floor.idmap import IdMap
from . import proc
from .enforcement import Enforcement, Verdict, held
from .procs import Procs

FDINFO_KERNEL = (5, 6)  # a socket's fdinfo shows its queue's descriptors in flight (scm_fds)
MARK = 512  # descriptors in flight a probed uid may have: half the usual soft RLIMIT_NOFILE of 1,024
LOOKS = 4096  # descriptors one search reads, all jails together (about 15 ms)
SETTLE = 0.2  # seconds after a kill before another jail of the same uid may be killed: its queues go
PROBE_LATE = 10.0  # seconds a probe may take to start, or to answer, before it is taken for broken
PROBE_RETRY = 5.0  # seconds after a probe broke (ended, was late or answered wrong) before another starts
PASSED, REFUSED, FAILED = b"y", b"n", b"e"  # the probe says b"y" once it is ready, too

# The probe: takes ``uid`` and ``gid`` (as root: its capabilities go, or it would never be refused)
# and a soft limit of ``MARK``, says it is ready, then answers each byte on its socket with whether
# it could pass /dev/null to itself. It ends when the watcher closes its end (or the host is gone).
PROBE = """# jailbox: the probe of descriptors in flight
import array, errno, os, resource, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
uid, gid, mark = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if os.getuid() != uid:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (min(mark, hard), hard))
null = array.array("i", [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)])
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.send(b"y")
while sock.recv(1):
    try:
        a.sendmsg([b"p"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, null)])
    except OSError as exc:
        sock.send(b"n" if exc.errno == errno.ETOOMANYREFS else b"e")
        continue
    for fd in socket.recv_fds(b, 1, 1)[1]:
        os.close(fd)
    sock.send(b"y")
"""


class _Probe:
    """One probe process and the watcher's end of its socket. Never waited for: each sample reads
    the answer to the last sample's question, if it has come, and asks again, so a probe slow to
    start or to answer on a loaded host never holds the watcher's other bounds."""

    def __init__(self, uid: int, gid: int, now: float) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", PROBE, str(theirs.fileno()), str(uid), str(gid), str(MARK)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        mine.setblocking(False)
        self.sock = mine
        self.asked = now  # when the answer waited for was asked (its start: the first is "ready")
        self.broken = False  # gone, late or wrong: closed, and another started after PROBE_RETRY

    def refused(self, now: float) -> bool:
        """Whether the probe's uid had more than ``MARK`` descriptors in flight at the last sample
        (False while no answer has come, and once the probe is broken)."""
        try:
            answer = self.sock.recv(1)
        except BlockingIOError:
            self.broken = now - self.asked > PROBE_LATE
            return False
        except OSError:
            answer = FAILED
        try:
            self.sock.send(b"?")
        except OSError:
            answer = FAILED
        self.asked = now
        self.broken = answer not in (PASSED, REFUSED)
        return answer == REFUSED

    def close(self) -> None:
        """End it at once: a sample, or a jail's ``close()``, does not wait on it."""
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


class Probes:
    """The probes of the host uids the watched jails' roots are, started as first needed."""

    def __init__(self) -> None:
        self._probes: dict[tuple[int, int], _Probe] = {}
        self._retry: dict[tuple[int, int], float] = {}  # host ids -> when a broken probe may be started again
        self._owner = os.getpid()

    def refused(self, ids: Iterable[tuple[int, int]], now: float) -> list[tuple[int, int]]:
        """Of ``ids`` (host uid, gid), those with more than ``MARK`` descriptors in flight."""
        refused = []
        for key in set(ids):
            probe = self._probes.get(key)
            if probe is None and now >= self._retry.get(key, 0.0):
                try:
                    probe = self._probes[key] = _Probe(*key, now)
                except OSError:
                    self._retry[key] = now + PROBE_RETRY
                    continue
            if probe is None:
                continue
            if probe.refused(now):
                refused.append(key)
            if probe.broken:
                self._probes.pop(key).close()
                self._retry[key] = now + PROBE_RETRY
        return refused

    def keep(self, ids: Iterable[tuple[int, int]]) -> None:
        """End the probes of uids no watched jail's root is any more (a forked child only lets go
        of its copies: the probes are its parent's)."""
        if self._owner != os.getpid():
            for probe in self._probes.values():
                probe.sock.close()
            self._probes, self._retry, self._owner = {}, {}, os.getpid()
        wanted = set(ids)
        for key in [key for key in self._probes if key not in wanted]:
            self._probes.pop(key).close()
        self._retry = {key: when for key, when in self._retry.items() if key in wanted}


def shown(pids: Iterable[int], most: int) -> dict[int, tuple[int, int]]:
    """{pid: (descriptors its sockets' queues show in flight, its descriptors looked at)} of
    ``pids``, read in that order until ``most`` descriptors were looked at in all."""
    found: dict[int, tuple[int, int]] = {}
    looked = 0
    for pid in pids:
        if looked >= most:
            break
        found[pid] = _in_queues(pid, most - looked)
        looked += found[pid][1]
    return found


def _in_queues(pid: int, most: int) -> tuple[int, int]:
    """(descriptors in flight its sockets' queues show, descriptors looked at) of ``pid``."""
    count = looked = 0
    with contextlib.suppress(OSError), os.scandir(f"/proc/{pid}/fd") as it:
        for entry in it:
            if looked >= most:
                break
            looked += 1
            try:
                if not os.readlink(entry.path).startswith("socket:"):
                    continue
            except OSError:
                continue
            info = small.read(f"/proc/{pid}/fdinfo/{entry.name}", 4096)
            at = info.find(b"scm_fds:")
            if at >= 0:
                with contextlib.suppress(ValueError, IndexError):
                    count += int(info[at + 8 :].split()[0])
    return count, looked


_settled: dict[tuple[int, int], float] = {}  # host ids -> when what their last kill freed is gone


def probed_ids(id_map: IdMap, own: bool, userns: bool) -> tuple[int, int] | None:
    """The host uid and gid of the jail's root where the kernel's count of descriptors in flight for
    them is shared (rootless: yours; as root, root's shared range), which the watcher then probes;
    None where the root is host root (whom the kernel never refuses) or ids of the jail's own."""
    uid, gid = id_map.host_root() if userns else (os.getuid(), os.getgid())
    if uid == 0 or own or not hostids.kernel_at_least(FDINFO_KERNEL):
        return None
    return uid, gid


def plan(id_map: IdMap, own: bool, userns: bool) -> Enforcement:
    """How the descriptors the jail sends in UNIX messages are bounded."""
    ids = probed_ids(id_map, own, userns)
    if ids is None and own:
        uid = id_map.host_root()[0]
        return held(
            "in_flight", f"per jail: its root is host uid {uid}, no other jail's, so what it holds refuses only itself"
        )
    if ids is None and not hostids.kernel_at_least(FDINFO_KERNEL):
        why = f"Linux {os.uname().release} is older than 5.6, whose sockets show what is in flight"
        return Enforcement("in_flight", Verdict.NOT_BOUNDED, why)
    if ids is None:
        why = "the jail's root is host root, whom the kernel never refuses, counted as no other user"
        return Enforcement("in_flight", Verdict.NONE_NEEDED, why)
    whose = "yours" if ids[0] == os.getuid() else "root's shared range, with other root jails"
    return held(
        "in_flight",
        f"host watcher: a probe as host uid {ids[0]} ({whose}) with a soft RLIMIT_NOFILE of {MARK} passes "
        f"a descriptor every sample; once refused, the uid's jail whose commands' sockets show the most in flight "
        f"loses every process but its init, reported as oom_killed",
    )


def due(key: tuple[int, int], now: float) -> bool:
    """Whether what the last kill for ids ``key`` freed is gone, so another jail of theirs may be judged."""
    return now >= _settled.get(key, 0.0)


def check(key: tuple[int, int], jails: Sequence[Procs], tree: dict[int, list[int]], now: float) -> None:
    """Host ids ``key`` have more than ``MARK`` descriptors in flight: the jail (of ``jails``, whose
    root they are) whose commands' sockets show the most in their queues loses every process but its
    init. Processes are read fewest descriptors first, at most ``LOOKS`` descriptors in all; if those
    read show none, the jail with the most descriptors left unread is taken instead: a queue may hide
    behind a hundred thousand other descriptors. Another jail of these ids is judged ``SETTLE`` later."""
    owner: dict[int, Procs] = {}
    for p in jails:
        owner.update(dict.fromkeys(proc.descendants(tree, p.init_pid), p))
    sizes = {pid: proc.descriptors(pid) for pid in owner}
    found = shown(sorted(owner, key=sizes.__getitem__), LOOKS)
    in_queues: dict[Procs, int] = {}
    unread: dict[Procs, int] = {}
    for pid, p in owner.items():
        count, looked = found.get(pid, (0, 0))
        in_queues[p] = in_queues.get(p, 0) + count
        unread[p] = unread.get(p, 0) + max(0, sizes[pid] - looked)
    culprit = max((p for p in in_queues if in_queues[p] > 0), key=in_queues.__getitem__, default=None)
    if culprit is None:
        culprit = max((p for p in unread if unread[p] > 0), key=unread.__getitem__, default=None)
    if culprit is not None:
        # all its processes but the init: a queue is handed from process to process in a message
        culprit.kill_trees(tree, tree.get(culprit.init_pid, []))
        _settled[key] = now + SETTLE
