"""Which host ids a jail's user namespace maps, decided on the host before forking.

Rootless: the caller's uid becomes 0 inside. With ``/etc/subuid`` + ``/etc/subgid`` entries and
the setuid ``newuidmap``/``newgidmap`` helpers, ids 1..N map to the subordinate range too, so
programs that switch ids (apt's ``_apt``, pip building as ``nobody``) work.

As root: never host root. Jails map ``0 R 65536`` (``single``: ``0 R 1``), where R..R+65535 is the
subordinate range named ``jailbox`` in ``/etc/subuid`` and ``/etc/subgid`` (as Docker's
``dockremap`` and rootful Podman's ``containers``), so a file a jail makes on a read-write bind
belongs to R.. on the host, never to uid 0. The first use as root allocates the range if it is
missing (``root_range``); ``JAILBOX_ROOT_RANGE=START:COUNT`` names one managed elsewhere.
"""

from __future__ import annotations

import fcntl
import functools
import getpass
import logging
import os
import pwd
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from .errors import ConfigError
from .floor.idmap import IdMap

ROOT_RANGE = 65536
ROOT_ENTRY = "jailbox"  # the name of root's range in /etc/subuid and /etc/subgid (no such user needed)
FIRST_ID = 100000  # below this, ids belong to the host's own users
MAX_ID = (1 << 32) - 1  # the kernel's 32-bit ids; (uid_t)-1 is never valid
SUBUID = Path("/etc/subuid")  # module-level so tests can point them at copies
SUBGID = Path("/etc/subgid")
RANGE_ENV = "JAILBOX_ROOT_RANGE"
MAX_SUBID_FILE = 1 << 20

log = logging.getLogger("jailbox")


def subordinate_range(path: str | os.PathLike[str], uid: int, user: str | None = None) -> tuple[int, int] | None:
    """(first id, count) of ``uid``'s range in ``path`` (``/etc/subuid`` or ``/etc/subgid``), whose
    lines name the user (``user``, default the name of ``uid``) or the uid."""
    if user is None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = getpass.getuser()
    for name, start, count in _entries(path):
        if name in (user, str(uid)):
            return start, count
    return None


def _entries(path: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
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
    taken = [entry for path in paths for entry in _entries(path)]
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
    found = _find(subuid, subgid)
    if found is not None:
        return found
    try:  # the lock is the file itself: no lock file of ours is left in /etc
        fd = os.open(subuid, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _refusal(subuid, subgid, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        found = _find(subuid, subgid)  # another process may have allocated it meanwhile
        if found is not None:
            return found
        start = free_range(ROOT_RANGE, (subuid, subgid), align=ROOT_RANGE)
        line = f"{ROOT_ENTRY}:{start}:{ROOT_RANGE}\n".encode()
        for path in (subuid, subgid):
            if _range_in(path) is None:
                try:
                    _append(path, line)
                except OSError as exc:
                    raise _refusal(subuid, subgid, exc) from None
        log.warning(
            "jailbox: allocated ids %d-%d for root's jails (%r in %s and %s)",
            start,
            start + ROOT_RANGE - 1,
            ROOT_ENTRY,
            subuid,
            subgid,
        )
    finally:
        os.close(fd)
    found = _find(subuid, subgid)
    if found is None:
        raise ConfigError(f"{subuid} and {subgid} do not hold the {ROOT_ENTRY!r} entry just written")
    return found


def _range_in(path: str) -> int | None:
    for name, start, count in _entries(path):
        if name == ROOT_ENTRY:
            if count < ROOT_RANGE or start < 1:
                raise ConfigError(
                    f"{path}: the {ROOT_ENTRY!r} entry has {count} ids from {start}; root's jails need "
                    f"{ROOT_RANGE} from above 0: fix that line, or set {RANGE_ENV}=START:COUNT"
                )
            return start
    return None


def _find(subuid: str, subgid: str) -> tuple[int, int] | None:
    uid, gid = _range_in(subuid), _range_in(subgid)
    return None if uid is None or gid is None else (uid, gid)


def _append(path: str, line: bytes) -> None:
    """One complete line, appended in one write (the file keeps its owner and mode; a missing
    file is made 0644 root:root, as shadow's tools make it). A file that does not end in a
    newline gets one first, so the entry is a line of its own."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line
        if os.write(fd, line) != len(line):
            raise OSError(0, f"short write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


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
