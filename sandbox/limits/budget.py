"""Host side of the bounds shared by every sandbox: the pids budget and the per-user kernel counters.

Runs in the host process, before each jail is built; the launcher applies what it decides
(``child/zygote.py``), the kernel holds it.

Pids: every sandbox has its own cap (``Limits.pids``), but a host has one ``kernel.pid_max`` and
one ``kernel.threads-max`` for everyone, so all sandboxes on the host, of every user, get at most a
share of the lower (``pid_max()``): ``$JAILBOX_PIDS_BUDGET``, a count (``8000``) or a share
(``25%``), by default half. The kernel keeps no count across users that an unprivileged user could
cap, so the budget is split into parts that sum to it (``pids_share``): root's sandboxes hold
1/``ROOT_SHARE`` of it, and each other account that may run them (a login shell listed in
/etc/shells, or a subordinate range in /etc/subuid: ``sharers``) an equal part of the rest. Every
user reads the same world-readable files, so every user computes the same parts; nothing one user
writes changes another's. A user's part is held where the kernel counts that user: with cgroups,
``pids.max`` of the ``jailbox`` group every sandbox's group is created in; with a user namespace,
the ``RLIMIT_NPROC`` the launcher sets before it creates the jail's outer user namespace: the kernel
then refuses a fork inside the jail while the creating user has that many processes, jails and host
together (ucounts charge every process of a user namespace to its creator, up the chain). The
kernel sets no such cap on a namespace host root creates, so root creates it as one host uid
(``JailSpec.creator``): all root's jails on the host are counted there.

Kernel counters: inotify, fanotify and namespaces are counted per user (``/proc/sys/user/*``).
A jail's processes are charged to the host user that created its user namespace (root too), so
without a bound one jail could take them all and the host's own ``inotify_init()`` would fail.
Each jail gets a fraction of the caller's limits, set in a user namespace its own is nested in
(``child/zygote.py``): every process of the jail, whatever its uid, counts against them there, and
nothing in the jail can reach that namespace to raise them.

Pending signals, POSIX message-queue bytes and SysV shm locked in memory are counted per user too,
against an rlimit, and charged up the same chain: one jail could queue all of its caller's
signals, and the host user's (root's too) ``sigqueue()`` and ``timer_create()`` then fail, as its
``mq_open()`` does once a jail holds the user's queue bytes. A new user namespace keeps its
creator's soft rlimit of each as its cap on the counts under it, whatever its own processes set
later, so the jail's namespace is created with the jail's share (``RLIMIT_COUNTERS``) and A's with
1/``USER_SHARE`` of the caller's, which all jails of this user share (``rlimit_budget``).

Namespaces get 1/``COUNTER_SHARE`` of the caller's limits, at most ``NAMESPACES_MAX``. The counters
a jail can hold for as long as it likes (inotify, fanotify and the rlimit ones, ``LEDGERED``) are
also a budget all sandboxes of the user share, across processes: a ledger in the state directory
(``LEDGER``), rewritten under ``flock`` on each create and close, records what each live sandbox
was given and the host process that owns it. A sandbox gets 1/``SANDBOX_SHARE`` of the caller's
limit (of an rlimit, the share ``RLIMIT_COUNTERS`` names), or what is left of 1/``USER_SHARE`` of
it, possibly nothing (its ``inotify_init()`` then fails: the jail degrades, the host keeps the
rest), so no sandbox's counts starve another's. Entries of a process that died go at the next update. The
ledger is the host's own (a 0700 directory nothing in a jail reaches) but may be half-written by a
crash: it is replaced atomically, read bounded, and if it does not parse it is started afresh with
what this process holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path

from .. import hostids, state
from ..errors import ConfigError
from .enforcement import Enforcement, Verdict, held

BUDGET_ENV = "JAILBOX_PIDS_BUDGET"
BUDGET_DEFAULT = "50%"
ROOT_SHARE = 2  # root's sandboxes (a service's, as `jailbox serve`) hold 1/2 of the budget; the accounts the rest
PASSWD = Path("/etc/passwd")  # module-level so tests can point them at copies
SHELLS = Path("/etc/shells")
ACCOUNTS_MAX = 4 << 20  # bytes read of /etc/passwd and /etc/shells: tens of thousands of accounts
USER_SYSCTLS = Path("/proc/sys/user")
COUNTER_SHARE = 8  # each sandbox may take 1/COUNTER_SHARE of the caller's limit of each namespace kind
NAMESPACES_MAX = 128  # nested namespaces of one kind in one sandbox (the host's limits are in the tens of thousands)
# Held as long as a jail likes, so shared through the ledger. With the default limits (128 inotify
# instances and fanotify groups; about 190000 watches and marks) 1/32 is 4 instances and some 6000
# watches per sandbox (a file watcher or `tail -f` takes one instance), and 16 sandboxes get them;
# the other half stays the host user's own (its processes here held none; each systemd user service
# or editor that watches files takes one or a few).
# Pending signals (the caller's limit is in the tens of thousands: some hundreds each, so 128
# sandboxes get a share, and a jail with none still gets kill()'s standard signals), POSIX message-
# queue bytes (819200 by default: 1/8 holds one queue of the kernel's default size, 10 messages of
# 8 KiB) and SysV shm locked in memory (8 MiB by default: 256 KiB each, also each process's mlock()
# cap) are rlimits; name -> (the rlimit, the share of the caller's soft limit one sandbox gets, what
# an unlimited caller counts as).
RLIMIT_COUNTERS = {
    "RLIMIT_SIGPENDING": (resource.RLIMIT_SIGPENDING, 256, 1 << 16),
    "RLIMIT_MSGQUEUE": (resource.RLIMIT_MSGQUEUE, 8, 819200),
    "RLIMIT_MEMLOCK": (resource.RLIMIT_MEMLOCK, 32, 8 << 20),
}
LEDGERED = (
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
    *RLIMIT_COUNTERS,
)
SANDBOX_SHARE = 32
USER_SHARE = 2
LEDGER = "counters"  # in the state directory; LEDGER + ".lock" is what is locked
LEDGER_MAX = 64 << 10  # bytes: over a thousand entries; a sandbox given nothing has none
log = logging.getLogger("jailbox")
COUNTERS = (
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
    "max_user_namespaces",
    "max_mnt_namespaces",
    "max_pid_namespaces",
    "max_net_namespaces",
    "max_ipc_namespaces",
    "max_uts_namespaces",
    "max_cgroup_namespaces",
    "max_time_namespaces",
)


def pid_max() -> int:
    """The host's limit on processes and threads: the lower of ``kernel.pid_max`` and
    ``kernel.threads-max``. A fork past either fails, root's too; systemd raises pid_max to 4194304,
    while threads-max is memory over 128 KiB (65536 with 8 GiB), so the budget is a share of the lower."""
    found = []
    for name in ("pid_max", "threads-max"):
        try:
            found.append(int(Path(f"/proc/sys/kernel/{name}").read_text()))
        except (OSError, ValueError):
            continue
    return min(found, default=32768)  # the kernel's default pid_max, where /proc does not say


def pids_budget() -> int:
    """Processes and threads all sandboxes of this host may hold at once (``$JAILBOX_PIDS_BUDGET``)."""
    text = os.environ.get(BUDGET_ENV, "").strip() or BUDGET_DEFAULT
    total = pid_max()
    try:
        value = int(float(text[:-1]) * total / 100) if text.endswith("%") else int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= total:
        raise ConfigError(
            f"{BUDGET_ENV}={text!r}: a count of processes up to {total} (the lower of kernel.pid_max and "
            f"kernel.threads-max) or a share of it; e.g. {BUDGET_ENV}=8000 or {BUDGET_ENV}=25%"
        )
    return value


def caller() -> int:
    """The host uid whose part this process's sandboxes take: its own, but as root of a user
    namespace another user made (``unshare -r``), the id its root is outside, whose count the kernel
    charges."""
    uid = os.getuid()
    if uid != 0:
        return uid
    try:
        with open("/proc/self/uid_map") as f:
            lines = f.read(hostids.MAX_SUBID_FILE).splitlines()
    except OSError:
        return uid
    return next((int(f[1]) for f in (line.split() for line in lines) if len(f) == 3 and f[0] == "0"), uid)


def pids_share(total: int, uid: int) -> int:
    """The part of the host's budget ``total`` all sandboxes of ``uid`` hold together: root's
    1/``ROOT_SHARE``, each other account an equal part of the rest (``sharers``), at least one."""
    if uid == 0:
        return max(1, total // ROOT_SHARE)
    return max(1, (total - total // ROOT_SHARE) // sharers(uid))


def sharers(uid: int) -> int:
    """How many accounts besides root split their part of the budget: those ``accounts()`` names,
    and ``uid`` whatever it has (root aside)."""
    return max(1, len((accounts() | {str(uid)}) - {"0"}))


def accounts() -> frozenset[str]:
    """The accounts besides root that may run sandboxes, as uids (or names /etc/passwd does not
    hold): a login shell listed in /etc/shells, or a range in /etc/subuid (by name or uid; jailbox's
    own entries aside). Local files every user reads alike, read bounded; read again only once one
    of them changed (each jail asks)."""
    files = (PASSWD, SHELLS, Path(hostids.SUBUID))
    return _accounts(files, tuple(_signature(path) for path in files))


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=4)
def _accounts(files: tuple[Path, Path, Path], _signatures: tuple[tuple[int, int, int] | None, ...]) -> frozenset[str]:
    """``accounts()`` of ``files`` (passwd, shells, subuid) as they are now (``_signatures``)."""
    passwd, shells_file, subuid = files
    shells = {line.strip() for line in _text(shells_file).splitlines() if line.strip() and not line.startswith("#")}
    uids: dict[str, str] = {}
    found = set()
    for line in _text(passwd).splitlines():
        fields = line.split(":")
        if len(fields) != 7 or not fields[2].isdigit():
            continue
        uids[fields[0]] = fields[2]
        if fields[6].strip() in shells:
            found.add(fields[2])
    for name, _, _ in hostids.entries(subuid):
        if name not in (hostids.ROOT_ENTRY, hostids.POOL_ENTRY):
            found.add(uids.get(name, name))
    return frozenset(found - {"0"})


def _text(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            return file.read(ACCOUNTS_MAX).decode(errors="replace")
    except OSError:
        return ""


def describe_share(total: int, uid: int) -> str:
    """How ``Sandbox.enforcement`` and ``jailbox doctor`` state the part ``uid`` holds."""
    whose = "root's" if uid == 0 else "this user's"
    return (
        f"{pids_share(total, uid)} is {whose} part of the {total} processes all sandboxes on this host share, of every "
        f"user ({BUDGET_ENV}): root's sandboxes hold 1/{ROOT_SHARE} of it, each of the {sharers(uid)} accounts besides "
        "root that may run them (a login shell in /etc/shells or a range in /etc/subuid) an equal part of the rest"
    )


def _own_limits() -> dict[str, int]:
    """name -> this process's limit, for each counter the kernel has."""
    limits: dict[str, int] = {}
    for name in COUNTERS:
        try:
            limits[name] = int((USER_SYSCTLS / name).read_text())
        except (OSError, ValueError):
            continue  # an older kernel without this counter
    for name, (which, _, unlimited) in RLIMIT_COUNTERS.items():
        soft = resource.getrlimit(which)[0]
        limits[name] = unlimited if soft == resource.RLIM_INFINITY else soft
    return limits


def counter_limits(own_limits: dict[str, int] | None = None) -> dict[str, int]:
    """name -> the most one jail's user namespace gets: a share of what this process may use."""
    limits: dict[str, int] = {}
    for name, own in (_own_limits() if own_limits is None else own_limits).items():
        if name in RLIMIT_COUNTERS:
            limits[name] = own // RLIMIT_COUNTERS[name][1]
        elif name in LEDGERED:
            limits[name] = own // SANDBOX_SHARE
        else:
            limits[name] = min(max(1, own // COUNTER_SHARE), NAMESPACES_MAX)
    return limits


def rlimit_budget() -> dict[str, int]:
    """RLIMIT_* name -> the soft limit A's user namespace is created with: what all of this user's
    jails together may hold of each rlimit counter (the host user keeps the rest)."""
    own = _own_limits()
    return {name: own[name] // USER_SHARE for name in RLIMIT_COUNTERS}


class _Entry:
    __slots__ = ("grants", "pid", "start")

    def __init__(self, pid: int, start: int, grants: tuple[int, ...]) -> None:
        self.pid, self.start, self.grants = pid, start, grants

    def line(self, sandbox_id: str) -> str:
        return f"{sandbox_id} {self.pid} {self.start} {' '.join(map(str, self.grants))}\n"


# what this process holds in each ledger: written again on every update, so a ledger that was
# started afresh regains them; the pid keeps a forked child from claiming its parent's sandboxes
_HELD: dict[str, tuple[int, Path, tuple[int, ...]]] = {}
_HELD_LOCK = threading.Lock()


def claim_counters(base: Path, sandbox_id: str) -> dict[str, int]:
    """The counter limits for a new jail; the ledgered ones are recorded in ``base``'s ledger until
    ``release_counters``."""
    own = _own_limits()
    limits = counter_limits(own)
    wanted = tuple(limits.get(name, 0) for name in LEDGERED)
    budget = tuple(own.get(name, 0) // USER_SHARE for name in LEDGERED)

    def claim(entries: dict[str, _Entry]) -> None:
        used = [sum(e.grants[i] for e in entries.values()) for i in range(len(LEDGERED))]
        grants = tuple(max(0, min(w, b - u)) for w, b, u in zip(wanted, budget, used, strict=True))
        if any(grants):
            with _HELD_LOCK:
                _HELD[sandbox_id] = (os.getpid(), base / LEDGER, grants)
            entries[sandbox_id] = _Entry(os.getpid(), state.own_start() or 0, grants)
        for name, grant in zip(LEDGERED, grants, strict=True):
            if name in limits:
                limits[name] = grant

    try:
        _update(base, wanted, claim)
    except BaseException:
        with _HELD_LOCK:  # not written, so not held: later updates must not restate it
            _HELD.pop(sandbox_id, None)
        raise
    return limits


def release_counters(base: Path, sandbox_id: str) -> None:
    """Give back what ``claim_counters`` recorded for ``sandbox_id``, once its jail is gone."""
    with _HELD_LOCK:
        held = _HELD.get(sandbox_id)
    if held is None or held[0] != os.getpid():
        return  # it was given nothing, so the ledger has no line for it

    def release(entries: dict[str, _Entry]) -> None:
        with _HELD_LOCK:
            _HELD.pop(sandbox_id, None)
        entries.pop(sandbox_id, None)

    _update(base, tuple(counter_limits().get(name, 0) for name in LEDGERED), release)


def _update(base: Path, most: tuple[int, ...], change: Callable[[dict[str, _Entry]], None]) -> None:
    """One locked read-modify-write of the ledger: drop the dead, restate our own, apply ``change``.
    ``most``: what one sandbox may be given of each ledgered counter (a larger entry is corrupt)."""
    path = base / LEDGER
    lock = os.open(base / (LEDGER + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = _read(path, most)
        pid = os.getpid()
        alive: dict[tuple[int, int], bool] = {}  # one look in /proc per owner, however many sandboxes it has
        kept: dict[str, _Entry] = {}
        for sandbox_id, entry in entries.items():
            if entry.pid == pid:
                continue  # restated from _HELD below
            owner = (entry.pid, entry.start)
            if owner not in alive:
                alive[owner] = state.started_as(entry.pid, entry.start)
            if alive[owner]:
                kept[sandbox_id] = entry
        start = state.own_start() or 0
        with _HELD_LOCK:
            own = [(i, g) for i, (p, where, g) in _HELD.items() if p == pid and where == path]
        kept.update((sandbox_id, _Entry(pid, start, grants)) for sandbox_id, grants in own)
        change(kept)
        tmp = base / (LEDGER + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # what a crash left between the write and the rename
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write("".join(entry.line(sandbox_id) for sandbox_id, entry in kept.items()))
        os.replace(tmp, path)
    finally:
        os.close(lock)  # and with it the lock


def _read(path: Path, most: tuple[int, ...]) -> dict[str, _Entry]:
    """The ledger's entries; none, with a warning, when it is not one this module wrote."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            data = file.read(LEDGER_MAX + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a symlink in its place, say: the rename replaces it, not what it names
        log.warning("kernel counters ledger %s unreadable (%s): started afresh", path, exc.strerror)
        return {}
    try:
        if len(data) > LEDGER_MAX:
            raise ValueError(f"over {LEDGER_MAX} bytes")
        return dict(_parse(line, most) for line in data.decode("ascii").splitlines())
    except ValueError as exc:
        log.warning(
            "kernel counters ledger %s is corrupt (%s): started afresh with this process's sandboxes", path, exc
        )
        return {}


def _parse(line: str, most: tuple[int, ...]) -> tuple[str, _Entry]:
    """One entry; each grant at most what one sandbox is given (``most``)."""
    fields = line.split(" ")
    if len(fields) != 3 + len(LEDGERED):
        raise ValueError(f"a line of {len(fields)} fields")
    sandbox_id, pid, start, *grants = fields
    if not (0 < len(sandbox_id) <= 32 and sandbox_id.isalnum()):
        raise ValueError("a bad sandbox id")
    values = tuple(int(g) for g in grants)
    when = int(start)
    if int(pid) <= 0 or when < 0:
        raise ValueError("a bad owner")
    if not all(0 <= value <= limit for value, limit in zip(values, most, strict=True)):
        raise ValueError("a grant beyond one sandbox's share")
    return sandbox_id, _Entry(int(pid), when, values)


def plan_counters(limits: dict[str, int], userns: bool) -> Enforcement:
    """How the per-user kernel counters are held for a jail granted ``limits`` (``claim_counters``)."""
    if not userns:
        return Enforcement(
            "kernel_counters", Verdict.NOT_BOUNDED, "userns=False, the jail's processes count as host root's"
        )
    inotify = f"{limits.get('max_inotify_instances', '-')}/{limits.get('max_inotify_watches', '-')}"
    fanotify = f"{limits.get('max_fanotify_groups', '-')}/{limits.get('max_fanotify_marks', '-')}"
    queued = (
        f"{limits.get('RLIMIT_SIGPENDING', '-')} pending signals, {limits.get('RLIMIT_MSGQUEUE', '-')} bytes of "
        f"POSIX message queues, {limits.get('RLIMIT_MEMLOCK', '-')} bytes of SysV shm locked"
    )
    return held(
        "kernel_counters",
        f"limits of the user namespace the jail's is nested in, for all its uids together: inotify {inotify} "
        f"instances/watches, fanotify {fanotify} groups/marks (at most 1/{SANDBOX_SHARE} of the caller's limit "
        f"each, out of 1/{USER_SHARE} that all sandboxes of this user share, across processes), namespaces "
        f"<= {NAMESPACES_MAX} each (1/{COUNTER_SHARE} of the caller's); the soft rlimits the jail's namespace was "
        f"created with: {queued} (a share of the caller's, out of 1/{USER_SHARE} that all sandboxes of this user "
        "share, across processes); nothing in the jail can change them",
    )
