"""Which host ids a jail's user namespace maps, decided on the host before forking.

Runs in the host process. What it decides is an ``IdMap`` (``floor/idmap.py``: the map itself, its
wire form, writing it, what it holds), which the launcher and the unpack worker load under
``python -I -S``; this module stays apart, host-side, because it reads and allocates subordinate
ranges under shadow's locks, holds slot locks and registers a fork hook, none of which belongs in
those processes.

Rootless: the caller's uid becomes 0 inside. With ``/etc/subuid`` + ``/etc/subgid`` entries and
the setuid ``newuidmap``/``newgidmap`` helpers, ids 1..N map to the subordinate range too, so
programs that switch ids (apt's ``_apt``, pip building as ``nobody``) work.

As root: never host root. Jails map ``0 R 65536`` (``single``: ``0 R 1``), where R..R+65535 is the
subordinate range named ``jailbox`` in ``/etc/subuid`` and ``/etc/subgid`` (as Docker's
``dockremap`` and rootful Podman's ``containers``), so a file a jail makes on a read-write bind
belongs to R.. on the host, never to uid 0. The first use as root allocates the range if it is
missing (``root_range``), under shadow's own locks and written as shadow writes the files, so a
useradd or usermod at the same moment neither loses our line nor gives a user ids in it; each
jail first checks the files still give its range to jailbox alone (``check_given``).
``JAILBOX_ROOT_RANGE=START:COUNT`` names one managed elsewhere.

As root, each jail also gets host ids of its own where it can (``claim_own_ids``): a slot of the
``jailbox-jails`` pool (4,096 ranges of 65,536), held by a lock for the jail's life, so what the
kernel counts per host uid (epoll watches, descriptors in flight, pipe buffers) is counted per
jail. Its stored tree and binds keep R.. on disk and are mounted idmapped: R+k shown as J+k.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import getpass
import logging
import os
import pwd
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import ConfigError
from .floor import linux as L
from .floor.idmap import IdMap

ROOT_RANGE = 65536
ROOT_ENTRY = "jailbox"  # the name of root's range in /etc/subuid and /etc/subgid (no such user needed)
FIRST_ID = 100000  # below this, ids belong to the host's own users
MAX_ID = (1 << 32) - 1  # the kernel's 32-bit ids; (uid_t)-1 is never valid
SUBUID = Path("/etc/subuid")  # module-level so tests can point them at copies
SUBGID = Path("/etc/subgid")
RANGE_ENV = "JAILBOX_ROOT_RANGE"
MAX_SUBID_FILE = 1 << 20
LOCK_WAIT = 15.0  # seconds to wait for shadow's locks: as long as its tools wait for each other
LOCK_POLL = 0.01
_ALLOCATING = threading.Lock()  # lckpwdf's lock is the process's: one thread of ours at a time takes it
POOL_ENTRY = "jailbox-jails"  # root's per-jail ranges in /etc/subuid and /etc/subgid
POOL_SLOTS = 4096  # jails of their own ids at once; past them, jails share root's range
SLOTS = Path("/run/jailbox/ids")  # one lock file a slot: held (flock) while a jail has its ids
# filesystems whose mounts the kernel lets be idmapped (FS_ALLOW_IDMAP), by statfs magic
IDMAP_FILESYSTEMS = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs", 0xF2F52010: "f2fs"}
IDMAP_KERNEL = (6, 3)  # tmpfs since 6.3; overlayfs over idmapped layers since 5.19
EPOLL_KERNEL = (5, 14)  # SECCOMP_ADDFD_FLAG_SEND: the jail's epoll instances can be made by another id
MAKER_SLOTS = 4096  # jails sharing a map whose epoll makers have ids of their own at once
MAKER_DIR = "epoll-ids"  # in the state directory: a lock file a slot, held (flock) while a jail lives

log = logging.getLogger("jailbox")


def subordinate_range(path: str | os.PathLike[str], uid: int, user: str | None = None) -> tuple[int, int] | None:
    """(first id, count) of ``uid``'s range in ``path`` (``/etc/subuid`` or ``/etc/subgid``), whose
    lines name the user (``user``, default the name of ``uid``) or the uid."""
    if user is None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = getpass.getuser()
    for name, start, count in entries(path):
        if name in (user, str(uid)):
            return start, count
    return None


def entries(path: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """The well-formed ``name:start:count`` lines of a subordinate-id file (none if unreadable)."""
    try:
        with open(path) as f:
            text = f.read(MAX_SUBID_FILE)
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


SUBID_FILES = ("/etc/subuid", "/etc/subgid")


def free_range(count: int, paths: Sequence[str | os.PathLike[str]] = SUBID_FILES, align: int = 1) -> int:
    """The lowest first id, at or above ``FIRST_ID`` and a multiple of ``align``, of ``count`` ids that no
    range in any of ``paths`` (subuid/subgid files) overlaps; unreadable files and malformed lines take
    nothing."""
    taken = [entry for path in paths for entry in entries(path)]
    start = -(-FIRST_ID // align) * align
    while start + count <= MAX_ID:
        end = start + count
        clash = [s + c for _, s, c in taken if s < end and start < s + c]
        if not clash:
            return start
        start = -(-max(clash) // align) * align
    raise ConfigError(f"no free range of {count} ids left in {' and '.join(map(str, paths))}; set {RANGE_ENV}")


def subuid_fix(user: str, paths: Sequence[str | os.PathLike[str]] = SUBID_FILES) -> str:
    """The command that gives ``user`` ``ROOT_RANGE`` subordinate ids in a range no one in ``paths`` holds
    (the ``uidmap`` package has the helpers)."""
    first = free_range(ROOT_RANGE, paths)
    ids = f"{first}-{first + ROOT_RANGE - 1}"
    return f"sudo usermod --add-subuids {ids} --add-subgids {ids} {user}"


def full_range_available() -> bool:
    uid = os.getuid()
    return uid == 0 or (
        shutil.which("newuidmap", path="/usr/bin:/bin") is not None
        and shutil.which("newgidmap", path="/usr/bin:/bin") is not None
        and subordinate_range("/etc/subuid", uid) is not None
        and subordinate_range("/etc/subgid", uid) is not None
    )


def root_range() -> tuple[int, int]:
    """(first uid, first gid) of root's jails: ``JAILBOX_ROOT_RANGE``, else the ``jailbox``
    entries of /etc/subuid and /etc/subgid, allocated on first use. Raises ConfigError."""
    env = os.environ.get(RANGE_ENV)
    if env is not None:
        return _parse_override(env)
    return _file_range(str(SUBUID), str(SUBGID))


def namespace_creator() -> int | None:
    """The host uid a jail's outer user namespace is created as, when it is not the caller's own:
    the kernel caps the processes of a namespace by its creator's RLIMIT_NPROC unless the creator is
    root of the host's own user namespace, so host root creates it as the first uid of its range,
    one for all root's jails. None elsewhere (root of a namespace a user made is capped already)."""
    if os.getuid() != 0 or not _in_host_userns():
        return None
    return root_range()[0]


def _parse_override(value: str) -> tuple[int, int]:
    example = f"{RANGE_ENV}=200000:65536"
    parts = value.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"{RANGE_ENV}={value!r} is not START:COUNT; e.g. {example}")
    start, count = int(parts[0]), int(parts[1])
    if count < ROOT_RANGE or start < 1 or start + ROOT_RANGE > MAX_ID:
        raise ConfigError(
            f"{RANGE_ENV}={value!r}: needs COUNT >= {ROOT_RANGE} and a START above 0 (never host root); e.g. {example}"
        )
    return start, start


@functools.lru_cache(maxsize=4)
def _file_range(subuid: str, subgid: str) -> tuple[int, int]:
    """The ``jailbox`` entries, allocated (under a lock) where missing; cached once found."""
    return _allocated(subuid, subgid, ROOT_ENTRY, ROOT_RANGE)


def _allocated(subuid: str, subgid: str, entry: str, count: int) -> tuple[int, int]:
    """(first uid, first gid) of ``entry``'s ranges of ``count`` ids, allocated where missing, under
    the locks shadow's own tools take (``_shadow_locked``): useradd and usermod never write the files
    between our read and our write, and we never pick ids they are giving a user."""
    found = _find(subuid, subgid, entry, count)
    if found is not None:
        return found
    try:
        with _shadow_locked((subuid, subgid)):
            found = _find(subuid, subgid, entry, count)  # read again under the lock: another may have added it
            if found is not None:
                return found
            start = free_range(count, (subuid, subgid), align=ROOT_RANGE)
            for path in (subuid, subgid):
                if _range_in(path, entry, count) is None:
                    _rewrite(path, f"{entry}:{start}:{count}\n".encode())
    except OSError as exc:
        raise _refusal(subuid, subgid, exc) from None
    log.warning("jailbox: allocated ids %d-%d for root's jails (%r in %s and %s)",
                start, start + count - 1, entry, subuid, subgid)  # fmt: skip
    found = _find(subuid, subgid, entry, count)
    if found is None:
        raise ConfigError(f"{subuid} and {subgid} do not hold the {entry!r} entry just written")
    return found


def _range_in(path: str, entry: str, count: int) -> int | None:
    for name, start, have in entries(path):
        if name == entry:
            if have < count or start < 1:
                raise ConfigError(
                    f"{path}: the {entry!r} entry has {have} ids from {start}; root's jails need "
                    f"{count} from above 0: fix that line, or set {RANGE_ENV}=START:COUNT"
                )
            return start
    return None


def _find(subuid: str, subgid: str, entry: str, count: int) -> tuple[int, int] | None:
    uid, gid = _range_in(subuid, entry, count), _range_in(subgid, entry, count)
    return None if uid is None or gid is None else (uid, gid)


def check_given(subuid: str, subgid: str, entry: str, count: int, first: tuple[int, int]) -> None:
    """Refuse (ConfigError) to run jails in ``count`` ids from ``first`` (uid, gid) unless the files
    still give them to ``entry`` and to no one else: a line lost to a tool that rewrote the file
    without our lock, or a user given ids in it since, would make the jails' files that user's."""
    for path, start in ((subuid, first[0]), (subgid, first[1])):
        found = entries(path)
        ours = [s for name, s, _ in found if name == entry]
        clash = [f"{n}:{s}:{c}" for n, s, c in found if n != entry and s < start + count and start < s + c]
        if ours == [start] and not clash:
            continue
        why = f"{clash[0]} overlaps them" if clash else f"its {entry!r} line is {'gone' if not ours else 'changed'}"
        raise ConfigError(
            f"root's jails run in ids {start}-{start + count - 1}, which {path} no longer gives {entry!r} alone "
            f"({why}); fix: restore the line '{entry}:{start}:{count}' to {path} and give any other entry "
            f"there other ids (usermod --del-subuids/--add-subuids), or set {RANGE_ENV}=START:COUNT"
        )


@contextlib.contextmanager
def _shadow_locked(paths: Sequence[str]) -> Iterator[None]:
    """Hold ``paths`` (subuid, subgid) the way shadow's tools hold them to change them: glibc's
    ``lckpwdf`` (a write lock on ``.pwd.lock`` beside them: ``/etc/.pwd.lock`` for the host's own
    files, which useradd and usermod wait on for 15 s), then each file's ``NAME.lock`` made as
    shadow's commonio makes it (``_link_lock``). A tool working with ``--prefix`` takes only the
    latter, retrying for 15 s; so do we, for as long."""
    deadline = time.monotonic() + LOCK_WAIT
    with _ALLOCATING, contextlib.ExitStack() as held:
        pwd = os.open(Path(paths[0]).parent / ".pwd.lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)  # fmt: skip
        held.callback(os.close, pwd)  # closing it drops the lock
        _retry(functools.partial(_try_lockf, pwd), deadline, f"{Path(paths[0]).parent / '.pwd.lock'} (lckpwdf)")
        for path in paths:
            _retry(functools.partial(_link_lock, path), deadline, f"{path}.lock")
            held.callback(_unlink_quietly, f"{path}.lock")
        yield


def _retry(attempt: Callable[[], bool], deadline: float, what: str) -> None:
    while not attempt():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{what} stayed locked for {LOCK_WAIT:g} s (a useradd, usermod or vipw at work, or a lock file "
                f"left behind); fix: let it finish and try again, or remove {what.split()[0]} if nothing holds it"
            )
        time.sleep(LOCK_POLL)


def _try_lockf(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _link_lock(path: str) -> bool:
    """One try at shadow's lock of ``path``: our pid written to ``PATH.PID``, hard-linked as
    ``PATH.lock`` (link() fails if it exists, atomically, on every filesystem); a lock whose process
    is gone is stale, removed and taken. False: a live process (or a lock file without a pid) holds it."""
    lock, mine = f"{path}.lock", f"{path}.{os.getpid()}"
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(f"{os.getpid()}\0".encode())  # as shadow writes it: the digits and their NUL
            f.flush()
            os.fdatasync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(mine, lock)
            return os.stat(mine).st_nlink == 2
        holder = _lock_holder(lock)
        if holder is None or _alive(holder):
            return False
        _unlink_quietly(lock)  # its process is gone
        with contextlib.suppress(FileExistsError):
            os.link(mine, lock)
            return os.stat(mine).st_nlink == 2
        return False
    finally:
        _unlink_quietly(mine)


def _lock_holder(lock: str) -> int | None:
    """The pid a shadow lock file names; None if it names none (then it is never taken over) or is
    gone meanwhile (then the next try links it: removing it now could remove a newer holder's)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        text = f.read(32).split(b"\0")[0].strip()
    return int(text) if text.isdigit() and 0 <= int(text) < 1 << 31 else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _rewrite(path: str, line: bytes) -> None:
    """``path`` with ``line`` added, written as shadow's tools write it (under ``_shadow_locked``): a
    temporary file beside it with its owner and mode (a missing file is made 0644 root:root, as
    shadow makes it), synced, renamed over it. A file that does not end in a newline gets one
    first, so the entry is a line of its own; one past ``MAX_SUBID_FILE`` is refused, not cut."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            old = f.read(MAX_SUBID_FILE + 1)
        uid, gid, mode = st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o664
    except FileNotFoundError:
        old, uid, gid, mode = b"", 0, 0, 0o644
    if len(old) > MAX_SUBID_FILE:
        raise OSError(errno.EFBIG, f"{path} is over {MAX_SUBID_FILE} bytes")
    if old and not old.endswith(b"\n"):
        old += b"\n"
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".cio", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchown(f.fileno(), uid, gid)
            os.fchmod(f.fileno(), mode)
            f.write(old + line)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _refusal(subuid: str, subgid: str, exc: OSError) -> ConfigError:
    return ConfigError(
        f"root's jails need a range of ids of their own and {subuid} has no {ROOT_ENTRY!r} entry, "
        f"which could not be added ({exc.strerror or exc}); fix: add the line "
        f"'{ROOT_ENTRY}:1000000:{ROOT_RANGE}' to {subuid} and {subgid} (any free range), "
        f"or set {RANGE_ENV}=1000000:{ROOT_RANGE}"
    )


def plan(mode: str) -> IdMap:
    """The map the launcher writes for a jail of ``mode`` ("auto", "full" or "single")."""
    if os.getuid() == 0 and not _root_is_parents_root():
        # root of a user namespace an unprivileged user made (``unshare --map-root-user``): our uid 0 is
        # that user outside, so the jail's root may be ours, as a rootless jail's root is its caller
        return IdMap(uid_map="0 0 1\n", gid_map="0 0 1\n", helper=False, deny_setgroups=True)
    if os.getuid() == 0:
        first = root_range()
        if RANGE_ENV not in os.environ:
            check_given(str(SUBUID), str(SUBGID), ROOT_ENTRY, ROOT_RANGE, first)
        _check_mapped(first)
        return _root_plan(first, mode)
    return _plan(os.getuid(), mode)


def _root_is_parents_root() -> bool:
    """Does our namespace's uid 0 stand for uid 0 of the namespace above (the host's, at the top)? A
    namespace that maps 0 onto another id was made by someone else than root: its root is that id."""
    try:
        with open("/proc/self/uid_map") as f:
            lines = f.read(MAX_SUBID_FILE).splitlines()
    except OSError:
        return True  # no /proc: assume the worst
    for fields in (line.split() for line in lines):
        if len(fields) == 3 and fields[0] == "0":
            return fields[1] == "0"
    return True


def _check_mapped(first: tuple[int, int]) -> None:
    """Root of a user namespace (``unshare --map-root-user``) has only the ids its map names."""
    for key, start in (("uid_map", first[0]), ("gid_map", first[1])):
        have = _entries_of_map(f"/proc/self/{key}")
        if not any(inside <= start and start + ROOT_RANGE <= inside + count for inside, count in have):
            raise ConfigError(
                f"root's jails use ids {start}-{start + ROOT_RANGE - 1}, which this user namespace does "
                f"not map (/proc/self/{key}); fix: map them into it (unshare --map-users={start},{start},"
                f"{ROOT_RANGE} --map-groups=...), or set {RANGE_ENV}=START:COUNT to ids it has"
            )


def _entries_of_map(path: str) -> list[tuple[int, int]]:
    """(first id inside, count) of each line of a /proc/PID/uid_map or gid_map."""
    try:
        with open(path) as f:
            lines = f.read(MAX_SUBID_FILE).splitlines()
    except OSError:
        return [(0, MAX_ID)]  # no /proc: nothing to tell, the kernel will
    return [(int(f[0]), int(f[2])) for f in (line.split() for line in lines) if len(f) == 3]


@functools.lru_cache(maxsize=8)
def _root_plan(first: tuple[int, int], mode: str) -> IdMap:
    count = ROOT_RANGE if mode != "single" else 1
    return IdMap(
        uid_map=f"0 {first[0]} {count}\n", gid_map=f"0 {first[1]} {count}\n", helper=False, deny_setgroups=False
    )


@functools.lru_cache(maxsize=8)
def _plan(uid: int, mode: str) -> IdMap:  # an IdMap is frozen: the cached one is shared safely
    gid = os.getgid()
    full = mode == "full" or (mode == "auto" and full_range_available())
    if not full:
        return IdMap(uid_map=f"0 {uid} 1\n", gid_map=f"0 {gid} 1\n", helper=False, deny_setgroups=True)
    sub_u = subordinate_range("/etc/subuid", uid)
    sub_g = subordinate_range("/etc/subgid", uid)
    if not (sub_u and sub_g) or not full_range_available():
        raise ConfigError(
            "idmap='full' needs newuidmap/newgidmap and entries for this user in /etc/subuid and "
            f"/etc/subgid; fix: sudo apt-get install uidmap && {subuid_fix(getpass.getuser())}"
        )
    return IdMap(
        uid_map=f"0 {uid} 1 1 {sub_u[0]} {sub_u[1]}",
        gid_map=f"0 {gid} 1 1 {sub_g[0]} {sub_g[1]}",
        helper=True,
        deny_setgroups=False,
    )


def give_tree(top: Path, uid: int, gid: int) -> None:
    """``chown -R`` of a bind's source to the jail's root, beneath ``top`` only: every entry is
    reached from its directory's descriptor, symlinks are changed themselves (never followed), and
    directories on another filesystem (a mount under it) are neither changed nor entered. chown
    clears set-id bits, which is kept so: a jail may not leave one there."""
    st = os.lstat(top)
    os.chown(top, uid, gid, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return
    for _, dirs, files, fd in os.fwalk(top, follow_symlinks=False):
        for name in files:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
        for name in list(dirs):
            if os.stat(name, dir_fd=fd, follow_symlinks=False).st_dev != st.st_dev:
                dirs.remove(name)  # another filesystem mounted here: not ours to change
                continue
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)


def writable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether host ``uid``/``gid`` (no capabilities over the file: it is not in their namespace's
    range unless owned by it) may write ``path`` by its mode bits."""
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


@dataclasses.dataclass(frozen=True)
class OwnIds:
    """Host ids one jail holds alone, as long as ``lock`` (a slot's lock file) is open."""

    idmap: IdMap  # the jail's map: its ids onto the slot's range
    shown_as: IdMap  # root's range (the ids on disk) onto the slot's: the idmapped mounts' map
    lock: int  # the slot's lock file, held (flock) until ``release_slot``


def claim_own_ids(mode: str, paths: Sequence[str]) -> OwnIds | None:
    """As host root, a range of host ids for one jail alone (``release_slot(lock)`` once the jail is gone);
    None where jails share root's range: not root of the host's own user namespace, a range named
    by ``JAILBOX_ROOT_RANGE``, a kernel before 6.3, one of ``paths`` (the lower and the binds'
    sources) on a filesystem whose mounts cannot be idmapped, no ``SLOTS`` directory to be had,
    or every slot taken. Raises ConfigError where the files no longer give the pool to jailbox alone."""
    if own_ids_refused(paths) is not None:
        return None
    try:
        pool = _pool_range(str(SUBUID), str(SUBGID))
    except ConfigError:
        return None
    check_given(str(SUBUID), str(SUBGID), POOL_ENTRY, POOL_SLOTS * ROOT_RANGE, pool)
    try:
        found = _lock_slot(SLOTS, POOL_SLOTS)
    except OSError:  # no /run to hold the locks in (a container without one, a read-only /run)
        return None
    if found is None:
        return None
    slot, lock = found
    shared = root_range()
    count = ROOT_RANGE if mode != "single" else 1
    uid, gid = pool[0] + slot * ROOT_RANGE, pool[1] + slot * ROOT_RANGE
    return OwnIds(
        idmap=IdMap(uid_map=f"0 {uid} {count}\n", gid_map=f"0 {gid} {count}\n", helper=False, deny_setgroups=False),
        shown_as=IdMap(
            uid_map=_view_map(shared[0], uid, count),
            gid_map=_view_map(shared[1], gid, count),
            helper=False,
            deny_setgroups=False,
        ),
        lock=lock,
    )


def _view_map(disk: int, own: int, count: int) -> str:
    """The idmapped mounts' map: ``count`` ids from ``disk`` (root's range, on disk) shown as the
    jail's own from ``own``, and every other id as itself, as a mount without an idmap shows it
    (a file of host root stays host root's: the jail's namespace does not map it, and it can be
    deleted from the overlay; an id an idmap leaves out would make that EOVERFLOW). The ids of the
    jail's own range on disk are left out: they are no file's on a tree or bind of root's."""
    taken = sorted([(disk, disk + count), (own, own + count)])
    lines = [f"{disk} {own} {count}"]
    start = 0
    for low, high in taken:
        if start < low:
            lines.append(f"{start} {start} {low - start}")
        start = max(start, high)
    if start < MAX_ID:
        lines.append(f"{start} {start} {MAX_ID - start}")
    return "".join(f"{line}\n" for line in lines)


def own_ids_refused(paths: Sequence[str]) -> str | None:
    """Why root's jails over ``paths`` cannot have host ids of their own here (None: they can)."""
    if os.getuid() != 0 or not _in_host_userns():
        return "not root of the host's own user namespace"
    if RANGE_ENV in os.environ:
        return f"{RANGE_ENV} names the one range jails use"
    if not kernel_at_least(IDMAP_KERNEL):
        return f"Linux {os.uname().release} is older than {'.'.join(map(str, IDMAP_KERNEL))} (idmapped mounts)"
    mounts = _mounts()
    for path in paths:
        if not _idmappable(path, mounts):
            have = ", ".join(IDMAP_FILESYSTEMS.values())
            return f"{path} is on a filesystem without idmapped mounts (these have them: {have})"
    return None


def _in_host_userns() -> bool:
    """Whether this process's user namespace is the host's (every id onto itself)."""
    return _entries_of_map("/proc/self/uid_map") == [(0, MAX_ID)]


def kernel_at_least(version: tuple[int, int]) -> bool:
    release = os.uname().release.split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= version
    except (IndexError, ValueError):
        return False


@dataclasses.dataclass(frozen=True)
class Maker:
    """The id a jail's epoll instances are made as (``child/epoll.py``)."""

    id: int  # in the jail: its uid and gid
    host: int  # the host uid it is
    own: bool  # no other live jail's maker has it (its ids are its own, or a slot of MAKER_SLOTS)
    lock: int | None  # the slot's lock while the jail lives (``release_slot``); None: no slot held


def claim_maker(plan: IdMap, own_ids: bool, base: Path) -> Maker | None:
    """The id a jail's epoll maker runs as, on a kernel that hands a descriptor over as a call's
    result; None where the map is root alone (rootless without a subordinate range, ``single``).

    Jails of host ids of their own (``own_ids``) use their highest. Others (rootless, and root's
    jails in the shared range) share their map, so each takes a slot of ``MAKER_SLOTS`` lock files
    in the state directory ``base`` and the id the slot names, counting down from the highest: no
    other jail's instances are made as it (theirs go to their own makers, whatever ids their
    processes run as), so no jail of the same user can take another's watches. With every slot
    held, or no directory for them, the highest, shared with every such jail."""
    if not kernel_at_least(EPOLL_KERNEL):
        return None
    uids, gids = plan.triples()
    last = min(max(inside + count - 1 for inside, _, count in ids) for ids in (uids, gids))
    if last <= 0:
        return None
    found = None
    if not own_ids:
        with contextlib.suppress(OSError):  # no state directory to hold the locks in: shared
            found = _lock_slot(base / MAKER_DIR, min(MAKER_SLOTS, last))
    jail_id = last if found is None else last - found[0]
    host = next(outside + jail_id - inside for inside, outside, count in uids if inside <= jail_id < inside + count)
    return Maker(jail_id, host, own=own_ids or found is not None, lock=None if found is None else found[1])


def _idmappable(path: str, mounts: list[tuple[str, str]] | None) -> bool:
    """Whether ``path``'s filesystem, and that of every mount under it (a bind takes them along;
    ``mounts``: ``_mounts()``), lets its mounts be idmapped."""
    try:
        if mounts is None or L.fs_type(path) not in IDMAP_FILESYSTEMS:
            return False
        top = os.path.realpath(path).rstrip("/") + "/"
    except OSError:
        return False
    names = set(IDMAP_FILESYSTEMS.values())
    return all(kind in names for point, kind in mounts if point.startswith(top))


def _mounts() -> list[tuple[str, str]] | None:
    """(mount point, filesystem type) of each mount this process sees; None if unreadable."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read(MAX_SUBID_FILE * 16).decode(errors="replace").splitlines()
    except OSError:
        return None
    mounts = []
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # mountinfo's escapes
        mounts.append((point, line.split(" - ", 1)[1].split()[0]))
    return mounts


def _lock_slot(directory: Path, count: int) -> tuple[int, int] | None:
    """(slot, its lock file) for the lowest of ``count`` slots in ``directory`` no live jail holds;
    None if all are held."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in range(count):
        fd = os.open(directory / str(slot), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD.add(fd)
        return slot, fd
    return None


# The slot locks this process holds. A flock belongs to the open file, which a fork shares: a child
# forked without exec (a multiprocessing worker) would hold its parent's slots until it ends, past
# the jails' close. Each child closes its copies at the fork.
_HELD: set[int] = set()


def release_slot(lock: int) -> None:
    """Give a slot back: close its lock (a no-op in a child forked since, which closed its copy)."""
    if lock in _HELD:
        _HELD.discard(lock)
        os.close(lock)


def _forget_slots() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_slots)


@functools.lru_cache(maxsize=4)
def _pool_range(subuid: str, subgid: str) -> tuple[int, int]:
    """(first uid, first gid) of the ``jailbox-jails`` entries, allocated (under a lock) where missing."""
    return _allocated(subuid, subgid, POOL_ENTRY, POOL_SLOTS * ROOT_RANGE)
