"""Filesystem requests of a served sandbox: stat, list to a depth, make a directory, move, remove, watch.

Runs in the serving host process. Every operation runs inside the jail, as a command with an argv
(no shell) of GNU find/coreutils, so paths resolve in the jail's own view with the jail's rights and
the host never walks a tree the jail made. What comes back is untrusted: the listing is parsed from
NUL-separated fields, bounded by the sandbox's output limit (a listing cut short is an error, not a
partial answer), and every number is range-checked. Watchers poll: a snapshot of the tree is diffed
against the previous one when the client asks, so a watcher holds one bounded snapshot and no thread.
"""

from __future__ import annotations

import posixpath
import secrets
import threading
from dataclasses import dataclass

from ...sandbox import Sandbox
from ...sandbox.errors import SandboxError, ServerError
from ...sandbox.serving import jail_path

FIELDS = ("%y", "%Y", "%s", "%m", "%T@", "%u", "%g", "%l", "%p")
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
    mode: int  # permission bits
    mtime: float
    owner: str
    group: str
    target: str | None  # a symlink's target

    @property
    def permissions(self) -> str:
        kind = {"dir": "d", "symlink": "L"}.get(self.kind, "-")
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
        y, _, size, mode, mtime, owner, group, target, path = (
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
            )
        )
    return entries


def _find(sb: Sandbox, args: list[str]) -> list[Entry]:
    try:
        r = sb.exec(["find", *args, "-printf", PRINTF], timeout=OP_TIMEOUT)
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
    return _parse(r.stdout_bytes)


def stat(sb: Sandbox, path: str) -> Entry:
    found = _find(sb, [path, "-maxdepth", "0"])
    if len(found) != 1:
        raise FsError("internal", "the jail's listing is malformed")
    return found[0]


def list_dir(sb: Sandbox, path: str, depth: int) -> list[Entry]:
    if not 1 <= depth <= MAX_DEPTH:
        raise FsError("invalid_argument", f"depth must be 1..{MAX_DEPTH}, e.g. 1")
    top = stat_following(sb, path)
    if top.kind != "dir":
        raise FsError("invalid_argument", f"path {path} is not a directory")
    return _find(sb, ["-H", path, "-mindepth", "1", "-maxdepth", str(depth)])


def stat_following(sb: Sandbox, path: str) -> Entry:
    """``stat`` of what ``path`` names, through a symlink at its end."""
    found = _find(sb, ["-H", path, "-maxdepth", "0"])
    if len(found) != 1:
        raise FsError("internal", "the jail's listing is malformed")
    return found[0]


def _run(sb: Sandbox, argv: list[str], what: str) -> None:
    try:
        r = sb.exec(argv, timeout=OP_TIMEOUT)
    except SandboxError as exc:
        raise FsError("unavailable", f"the sandbox could not {what}: {exc}") from None
    if r.exit_code != 0:
        err = r.stderr_bytes.decode(errors="replace")[-300:].strip()
        code = "permission_denied" if "Permission denied" in err else "failed_precondition"
        raise FsError(code, f"cannot {what}: {err or r.exit_code}")


def make_dir(sb: Sandbox, path: str) -> Entry:
    try:
        stat(sb, path)
    except FsError as exc:
        if exc.code != "not_found":
            raise
    else:
        raise FsError("already_exists", f"{path} already exists")
    _run(sb, ["mkdir", "-p", "--", path], f"make directory {path}")
    return stat(sb, path)


def move(sb: Sandbox, source: str, destination: str) -> Entry:
    stat(sb, source)
    _run(sb, ["mv", "-T", "--", source, destination], f"move {source} to {destination}")
    return stat(sb, destination)


def remove(sb: Sandbox, path: str) -> None:
    stat(sb, path)
    _run(sb, ["rm", "-rf", "--", path], f"remove {path}")


@dataclass(frozen=True)
class Change:
    name: str  # relative to the watched directory
    kind: str  # "create", "write", "remove", "chmod"
    entry: Entry | None


def snapshot(sb: Sandbox, path: str, recursive: bool) -> dict[str, Entry]:
    return {e.path: e for e in list_dir(sb, path, MAX_DEPTH if recursive else 1)}


def diff(root: str, old: dict[str, Entry], new: dict[str, Entry]) -> list[Change]:
    changes = []
    for p, e in new.items():
        before = old.get(p)
        rel = posixpath.relpath(p, root)
        if before is None:
            changes.append(Change(rel, "create", e))
        elif (before.size, before.mtime) != (e.size, e.mtime) and e.kind != "dir":
            changes.append(Change(rel, "write", e))
        elif before.mode != e.mode:
            changes.append(Change(rel, "chmod", e))
    changes.extend(Change(posixpath.relpath(p, root), "remove", None) for p in old if p not in new)
    return changes


class Watchers:
    """A sandbox's directory watchers, by the id the client polls them with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watching: dict[str, tuple[str, bool, dict[str, Entry]]] = {}

    def create(self, sb: Sandbox, path: str, recursive: bool) -> str:
        with self.lock:
            if len(self.watching) >= MAX_WATCHERS:
                raise FsError("resource_exhausted", f"{MAX_WATCHERS} watchers already watch this sandbox")
        first = snapshot(sb, path, recursive)
        wid = secrets.token_hex(8)
        with self.lock:
            self.watching[wid] = (path, recursive, first)
        return wid

    def poll(self, sb: Sandbox, wid: str) -> list[Change]:
        with self.lock:
            found = self.watching.get(wid)
        if found is None:
            raise FsError("not_found", f"watcher {wid} not found")
        path, recursive, old = found
        new = snapshot(sb, path, recursive)
        with self.lock:
            if wid in self.watching:
                self.watching[wid] = (path, recursive, new)
        return diff(path, old, new)

    def remove(self, wid: str) -> None:
        with self.lock:
            if self.watching.pop(wid, None) is None:
                raise FsError("not_found", f"watcher {wid} not found")
