"""Which host ids a jail's user namespace maps, decided on the host before forking.

Rootless: the caller's uid becomes 0 inside. With ``/etc/subuid`` + ``/etc/subgid`` entries and
the setuid ``newuidmap``/``newgidmap`` helpers, ids 1..N map to the subordinate range too, so
programs that switch ids (apt's ``_apt``, pip building as ``nobody``) work.
As root: an identity map of the first 65536 ids, so trees built by root stay writable.
"""

from __future__ import annotations

import functools
import getpass
import os
import pwd
import shutil
from collections.abc import Sequence

from .errors import ConfigError
from .floor.idmap import IdMap

ROOT_RANGE = 65536


def subordinate_range(path: str | os.PathLike[str], uid: int, user: str | None = None) -> tuple[int, int] | None:
    """(first id, count) of ``uid``'s range in ``path`` (``/etc/subuid`` or ``/etc/subgid``), whose
    lines name the user (``user``, default the name of ``uid``) or the uid."""
    if user is None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = getpass.getuser()
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[1].isdigit() and parts[2].isdigit():
                    return int(parts[1]), int(parts[2])
    except OSError:
        return None
    return None


SUBID_FILES = ("/etc/subuid", "/etc/subgid")
FIRST_SUBID = 100000  # useradd's SUB_UID_MIN: below it are the system's and people's own ids


def free_range(count: int, paths: Sequence[str | os.PathLike[str]] = SUBID_FILES) -> int:
    """The lowest first id, at or above ``FIRST_SUBID``, of ``count`` ids that no range in any of ``paths``
    (subuid/subgid files) overlaps; unreadable files and malformed lines take nothing."""
    taken: list[tuple[int, int]] = []
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    parts = line.strip().split(":")
                    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                        taken.append((int(parts[1]), int(parts[1]) + int(parts[2])))
        except OSError:
            continue
    start = FIRST_SUBID
    for first, end in sorted(taken):
        if first >= start + count:
            break
        start = max(start, end)
    return start


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


def plan(mode: str) -> IdMap:
    """The map the launcher writes for a jail of ``mode`` ("auto", "full" or "single")."""
    return _plan(os.getuid(), mode)


@functools.lru_cache(maxsize=8)
def _plan(uid: int, mode: str) -> IdMap:  # an IdMap is frozen: the cached one is shared safely
    gid = os.getgid()
    if uid == 0:
        count = ROOT_RANGE if mode != "single" else 1
        line = f"0 0 {count}\n"
        return IdMap(uid_map=line, gid_map=line, helper=False, deny_setgroups=False)
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
