"""Filesystem requests of a served sandbox: stat, list to a depth, make a directory, move, remove, watch.

Runs in the serving host process. Every operation runs inside the jail, as a command with an argv
(no shell) of GNU find/coreutils, so paths resolve in the jail's own view with the jail's rights and
the host never walks a tree the jail made. What comes back is untrusted: the listing is parsed from
NUL-separated fields, bounded by the sandbox's output limit (a listing cut short is an error, not a
partial answer), and every number is range-checked. Watchers use inotify in the jail
(``inotify.py``); where the jail cannot run that, they poll: a snapshot of the tree is diffed
against the previous one when the client asks, so such a watcher holds one bounded snapshot.
Symlink targets and resolved link modes come from ``readlink -e``/``stat -L`` in the jail, too.
"""

from __future__ import annotations

import posixpath
import secrets
import threading
import time
from dataclasses import dataclass, replace

from ...sandbox import Sandbox
from ...sandbox.errors import SandboxError, ServerError
from ...sandbox.serving import jail_path
from . import inotify
from .inotify import InotifyWatch

FIELDS = ("%y", "%Y", "%s", "%m", "%T@", "%u", "%g", "%l", "%p")
RESOLVE_BATCH = 256
"""Symlinks resolved by one command in the jail: its argv stays far below the kernel's limit."""
RESOLVE = (
    # per link: the absolute path it resolves to (or the link's own, as envd gives a dangling one)
    # and that target's permission bits in octal, NUL after each; the "." keeps a trailing newline
    'for p; do if t=$(readlink -e -- "$p" && echo .); then printf "%s\\0" "${t%??}"; '
    'stat -L -c "%a" -- "$p" | tr -d "\\n"; else printf "%s\\0" "$p"; fi; printf "\\0"; done'
)
PRINTF = "\\0".join(FIELDS) + "\\0"
OP_TIMEOUT = 60.0
MAX_DEPTH = 64
MAX_WATCHERS = 16
MAX_PATH = 4096


class FsError(ServerError):
    """A filesystem request that cannot be met; ``code`` is a Connect error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Entry:
    path: str
    name: str
    kind: str  # "file", "dir", "symlink" (what the entry itself is) or "other"
    size: int
    mode: int  # permission bits (of what a symlink resolves to, as envd gives them)
    mtime: float
    owner: str
    group: str
    target: str | None  # a symlink's target: the absolute path it resolves to, or its own path if it does not
    points_to: str = "other"  # a symlink's target's kind, as ``kind``; for others, ``kind``

    @property
    def permissions(self) -> str:
        if self.kind == "symlink":  # the link's own bits, which Linux keeps at rwxrwxrwx
            return "Lrwxrwxrwx"
        kind = "d" if self.kind == "dir" else "-"
        bits = "".join(c if self.mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
        return kind + bits


def check_path(path: str, workdir: str) -> str:
    """An absolute, normalised jail path for what the client named (relative to the workdir)."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise FsError("invalid_argument", f"path must be 1..{MAX_PATH} characters, e.g. /tmp/notes.txt")
    try:
        return jail_path(path if path.startswith("/") else posixpath.join(workdir, path))
    except ValueError as exc:
        raise FsError("invalid_argument", f"path: {exc} (e.g. /tmp/notes.txt)") from None


_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


def _parse(out: bytes) -> list[Entry]:
    parts = out.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    if len(parts) % len(FIELDS):
        raise FsError("internal", "the jail's listing is malformed")
    entries = []
    for i in range(0, len(parts), len(FIELDS)):
        y, y_target, size, mode, mtime, owner, group, target, path = (
            p.decode(errors="surrogateescape") for p in parts[i : i + 9]
        )
        try:
            n_size, n_mode, n_mtime = int(size), int(mode, 8), float(mtime)
        except ValueError:
            raise FsError("internal", "the jail's listing is malformed") from None
        if n_size < 0 or not 0 <= n_mode <= 0o7777 or not path.startswith("/"):
            raise FsError("internal", "the jail's listing is malformed")
        path = posixpath.normpath(path)
        entries.append(
            Entry(
                path=path,
                name=posixpath.basename(path) or "/",
                kind=_KINDS.get(y, "other"),
                size=n_size,
                mode=n_mode,
                mtime=n_mtime,
                owner=owner,
                group=group,
                target=target if y == "l" else None,
                points_to=_KINDS.get(y_target, "other") if y == "l" else _KINDS.get(y, "other"),
            )
        )
    return entries


def _resolve_links(sb: Sandbox, entries: list[Entry], user: str | None = None) -> list[Entry]:
    """Each symlink's target as envd gives it: the absolute path the link resolves to in the jail
    (``readlink -e``, every link on the way followed there), with that target's permission bits; a
    link that does not resolve keeps its own path. What the jail answers is checked as the listing is."""
    links = [i for i, e in enumerate(entries) if e.kind == "symlink"]
    for start in range(0, len(links), RESOLVE_BATCH):
        batch = links[start : start + RESOLVE_BATCH]
        out = _jail_output(
            sb, ["/bin/sh", "-c", RESOLVE, "sh", *(entries[i].path for i in batch)], "resolve links", user=user
        )
        parts = out.split(b"\0")
        if len(parts) != 2 * len(batch) + 1 or parts[-1] != b"":
            raise FsError("internal", "the jail's link resolution is malformed")
        for n, i in enumerate(batch):
            target = parts[2 * n].decode(errors="surrogateescape")
            mode = parts[2 * n + 1].decode(errors="replace")
            if not target.startswith("/") or len(target) > MAX_PATH:
                raise FsError("internal", "the jail's link resolution is malformed")
            e = entries[i]
            try:
                bits = int(mode, 8) if mode else e.mode
            except ValueError:
                raise FsError("internal", "the jail's link resolution is malformed") from None
            if not 0 <= bits <= 0o7777:
                raise FsError("internal", "the jail's link resolution is malformed")
            entries[i] = replace(e, target=posixpath.normpath(target), mode=bits)
    return entries


def _jail_output(sb: Sandbox, argv: list[str], what: str, user: str | None = None) -> bytes:
    try:
        r = sb.exec(argv, timeout=OP_TIMEOUT, user=user)
    except SandboxError as exc:
        raise FsError("unavailable", f"the sandbox could not {what}: {exc}") from None
    if r.stdout_dropped:
        raise FsError("resource_exhausted", f"the answer is over the sandbox's output limit ({r.output_limit} bytes)")
    return r.stdout_bytes


def _find(sb: Sandbox, args: list[str], user: str | None = None) -> list[Entry]:
    try:
        r = sb.exec(["find", *args, "-printf", PRINTF], timeout=OP_TIMEOUT, user=user)
    except SandboxError as exc:
        raise FsError("unavailable", f"the sandbox could not list: {exc}") from None
    if r.stdout_dropped:
        raise FsError("resource_exhausted", f"the listing is over the sandbox's output limit ({r.output_limit} bytes)")
    if r.exit_code != 0:
        err = r.stderr_bytes.decode(errors="replace")[-300:].strip()
        if "No such file or directory" in err and not r.stdout_bytes:  # not an entry gone mid-walk
            raise FsError("not_found", f"{err.splitlines()[-1] if err else 'path not found'}")
        if "Permission denied" in err and not r.stdout_bytes:
            raise FsError("permission_denied", err)
        if not r.stdout_bytes:
            raise FsError("internal", f"find failed in the sandbox: {err or r.exit_code}")
    return _resolve_links(sb, _parse(r.stdout_bytes), user=user)


def stat(sb: Sandbox, path: str, user: str | None = None) -> Entry:
    found = _find(sb, [path, "-maxdepth", "0"], user=user)
    if len(found) != 1:
        raise FsError("internal", "the jail's listing is malformed")
    return found[0]


def list_dir(sb: Sandbox, path: str, depth: int, user: str | None = None) -> list[Entry]:
    if not 1 <= depth <= MAX_DEPTH:
        raise FsError("invalid_argument", f"depth must be 1..{MAX_DEPTH}, e.g. 1")
    top = stat_following(sb, path, user=user)
    if top.kind != "dir":
        raise FsError("invalid_argument", f"path {path} is not a directory")
    found = _find(sb, ["-H", path, "-mindepth", "1", "-maxdepth", str(depth)], user=user)
    return sorted(found, key=lambda e: e.path)  # envd walks in lexical order


def stat_following(sb: Sandbox, path: str, user: str | None = None) -> Entry:
    """``stat`` of what ``path`` names, through a symlink at its end."""
    found = _find(sb, ["-H", path, "-maxdepth", "0"], user=user)
    if len(found) != 1:
        raise FsError("internal", "the jail's listing is malformed")
    return found[0]


def _run(sb: Sandbox, argv: list[str], what: str, user: str | None = None) -> None:
    try:
        r = sb.exec(argv, timeout=OP_TIMEOUT, user=user)
    except SandboxError as exc:
        raise FsError("unavailable", f"the sandbox could not {what}: {exc}") from None
    if r.exit_code != 0:
        err = r.stderr_bytes.decode(errors="replace")[-300:].strip()
        code = "permission_denied" if "Permission denied" in err else "failed_precondition"
        raise FsError(code, f"cannot {what}: {err or r.exit_code}")


def make_dir(sb: Sandbox, path: str, user: str | None = None) -> Entry:
    try:
        stat(sb, path, user=user)
    except FsError as exc:
        if exc.code != "not_found":
            raise
    else:
        raise FsError("already_exists", f"{path} already exists")
    _run(sb, ["mkdir", "-p", "--", path], f"make directory {path}", user=user)
    return stat(sb, path, user=user)


def move(sb: Sandbox, source: str, destination: str, user: str | None = None) -> Entry:
    stat(sb, source, user=user)
    _run(sb, ["mv", "-T", "--", source, destination], f"move {source} to {destination}", user=user)
    return stat(sb, destination, user=user)


def remove(sb: Sandbox, path: str, user: str | None = None) -> None:
    """Remove ``path`` and all beneath it; a path that is not there is no error (envd's RemoveAll)."""
    _run(sb, ["rm", "-rf", "--", path], f"remove {path}", user=user)


@dataclass(frozen=True)
class Change:
    name: str  # relative to the watched directory
    kind: str  # "create", "write", "remove", "rename", "chmod"
    entry: Entry | None
    path: str = ""  # absolute, in the jail


def snapshot(sb: Sandbox, path: str, recursive: bool, user: str | None = None) -> dict[str, Entry]:
    return {e.path: e for e in list_dir(sb, path, MAX_DEPTH if recursive else 1, user=user)}


def diff(root: str, old: dict[str, Entry], new: dict[str, Entry]) -> list[Change]:
    changes = []
    for p, e in new.items():
        before = old.get(p)
        rel = posixpath.relpath(p, root)
        if before is None:
            changes.append(Change(rel, "create", e, p))
        elif (before.size, before.mtime) != (e.size, e.mtime) and e.kind != "dir":
            changes.append(Change(rel, "write", e, p))
        elif before.mode != e.mode:
            changes.append(Change(rel, "chmod", e, p))
    changes.extend(Change(posixpath.relpath(p, root), "remove", None, p) for p in old if p not in new)
    return changes


CARRIES_ENTRY = ("create", "write", "chmod")
"""Events whose path still names their entry (envd's opCarriesEntry): a remove's or rename's may name
a replacement made since, so those carry none."""


def with_entries(sb: Sandbox, changes: list[Change], user: str | None = None) -> list[Change]:
    """``changes`` with each one's entry as it is now where it carries one (one listing in the jail per
    ``RESOLVE_BATCH`` paths); an entry gone meanwhile is left out, as envd leaves it."""
    wanted = sorted({c.path for c in changes if c.kind in CARRIES_ENTRY and c.entry is None and c.path})
    found: dict[str, Entry] = {}
    for start in range(0, len(wanted), RESOLVE_BATCH):
        batch = wanted[start : start + RESOLVE_BATCH]
        argv = ["find", *batch, "-maxdepth", "0", "-printf", PRINTF]
        out = _jail_output(sb, argv, "describe changed entries", user=user)
        found.update((e.path, e) for e in _resolve_links(sb, _parse(out), user=user))
    return [replace(c, entry=found.get(c.path)) if c.entry is None else c for c in changes]


Watch = tuple[str, bool, dict[str, Entry]] | InotifyWatch
"""A polled watch (its directory, whether recursive, its last snapshot) or an inotify one."""


class Watchers:
    """A sandbox's directory watchers, by the id the client polls them with: inotify in the jail where
    the jail has ``python3`` to run it and an inotify instance to spare, else a snapshot diffed on
    each poll."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watching: dict[str, Watch] = {}
        self.with_entry: set[str] = set()  # watchers whose events carry their entries
        self.users: dict[str, str | None] = {}  # whom each watcher's commands in the jail run as

    def create(
        self, sb: Sandbox, path: str, recursive: bool, include_entry: bool = False, user: str | None = None
    ) -> str:
        with self.lock:
            if len(self.watching) >= MAX_WATCHERS:
                raise FsError("resource_exhausted", f"{MAX_WATCHERS} watchers already watch this sandbox")
        if stat_following(sb, path, user=user).kind != "dir":
            raise FsError("invalid_argument", f"path {path} is not a directory")
        try:
            watch: Watch | None = inotify.start(sb, path, recursive, user)
        except inotify.WatchFailed as exc:
            raise FsError("internal", str(exc)) from None
        if watch is None:
            watch = (path, recursive, snapshot(sb, path, recursive, user=user))
        wid = secrets.token_hex(8)
        with self.lock:
            self.watching[wid] = watch
            self.users[wid] = user
            if include_entry:
                self.with_entry.add(wid)
        return wid

    def poll(self, sb: Sandbox, wid: str, wait: float = 0.0) -> list[Change]:
        """What changed since the last poll; ``wait``: seconds to wait for a change first."""
        with self.lock:
            found = self.watching.get(wid)
            user = self.users.get(wid)
        if found is None:
            raise FsError("not_found", f"watcher {wid} not found")
        if isinstance(found, InotifyWatch):
            try:
                changes = [Change(e.name, e.kind, None, e.path) for e in found.take(wait)]
            except inotify.WatchFailed as exc:
                raise FsError("aborted", str(exc)) from None
            return with_entries(sb, changes, user=user) if wid in self.with_entry else changes
        if wait:
            time.sleep(wait)
        path, recursive, old = found
        new = snapshot(sb, path, recursive, user=user)
        with self.lock:
            if wid in self.watching:
                self.watching[wid] = (path, recursive, new)
        changes = diff(path, old, new)
        return changes if wid in self.with_entry else [replace(c, entry=None) for c in changes]

    def remove(self, wid: str) -> None:
        with self.lock:
            found = self.watching.pop(wid, None)
            self.with_entry.discard(wid)
            self.users.pop(wid, None)
        if found is None:
            raise FsError("not_found", f"watcher {wid} not found")
        if isinstance(found, InotifyWatch):
            found.stop()

    def close(self) -> None:
        """Stop every watch (the sandbox is closing)."""
        with self.lock:
            everyone, self.watching, self.with_entry, self.users = list(self.watching.values()), {}, set(), {}
        for watch in everyone:
            if isinstance(watch, InotifyWatch):
                watch.stop()
