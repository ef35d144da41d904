"""Paused sandboxes kept across a stop of ``jailbox serve``: one record per sandbox, on the server's disk.

Runs in the serving host process, when the server stops (``keep``) and when it starts (``load``). A
sandbox paused when the server stops is kept as a durable snapshot of its filesystem (its processes
end with the server) and a record of what the E2B API knows of it: id, key, access token, template,
metadata, variables, lifecycle and the lifetime it had left. The next server with the same key file
starts a jail from the snapshot, pauses it, and serves it as the same paused sandbox, resumed by
``connect`` with fresh processes.

The records are secrets (an access token, the variables): they live in a directory beside the key
file, ``<key file>.paused/``, which must be the server user's own, mode 0700, not a link; each record
is mode 0600, written whole to a temporary name and renamed into place, and read back with
``O_NOFOLLOW``, at most ``MAX_RECORD`` bytes, every field checked, a malformed one left where it is.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from ...sandbox.errors import ServerError

MAX_RECORD = 4 << 20
"""Bytes of one record read back: its variables and metadata are bounded (registry.py) far below."""
MAX_RECORDS = 4096
"""Directory entries looked at by one load (the server holds far fewer sandboxes)."""
SANDBOX_ID = re.compile(r"jb[0-9a-f]{20}")
OWNER = re.compile(r"[0-9a-f]{32}")
SNAPSHOT = re.compile(r"snap-[0-9a-f]{12}")


class DormantError(ServerError):
    """The directory of records cannot be used (not the server user's, open to others, a link)."""


@dataclass(frozen=True)
class Record:
    id: str
    owner: str
    access_token: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    auto_pause: bool
    auto_resume: bool
    left: float  # seconds of its lifetime left
    started: str  # ISO 8601, as first created
    snapshot: str  # the jailbox snapshot of its filesystem
    auto_pause_memory: bool = True
    network: dict[str, object] | None = None  # its caller's network ask, asked again when it is served again


def directory(key_file: Path) -> Path:
    """``<key file>.paused``, made 0700 if missing; ``DormantError`` if it is not safe to keep secrets in."""
    path = key_file.with_name(key_file.name + ".paused")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise DormantError(
            f"{path} must be a directory of yours, mode 0700, not a link (it keeps paused sandboxes' tokens)"
        )
    return path


def keep(path: Path, record: Record) -> None:
    """Write ``record`` whole, replacing the sandbox's earlier one."""
    tmp = path / f".{record.id}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(record), f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path / f"{record.id}.json")


def forget(path: Path, sandbox_id: str) -> None:
    try:
        os.unlink(path / f"{sandbox_id}.json")
    except FileNotFoundError:
        pass


def load(path: Path) -> list[Record]:
    """Every well-formed record, oldest first."""
    found = []
    with os.scandir(path) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_RECORDS:
                break
            if entry.name.endswith(".json") and SANDBOX_ID.fullmatch(entry.name[:-5]):
                record = _read(path / entry.name)
                if record is not None and record.id == entry.name[:-5]:
                    found.append(record)
    return sorted(found, key=lambda r: (r.started, r.id))


def _read(file: Path) -> Record | None:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = f.read(MAX_RECORD + 1)
    if len(raw) > MAX_RECORD:
        return None
    try:
        d = json.loads(raw)
        record = Record(**d)
    except (ValueError, TypeError, RecursionError):
        return None
    texts = (record.access_token, record.template, record.started)
    maps = (record.metadata, record.envs)
    if not (
        SANDBOX_ID.fullmatch(record.id)
        and OWNER.fullmatch(record.owner)
        and SNAPSHOT.fullmatch(record.snapshot)
        and all(isinstance(t, str) and 0 < len(t) <= 256 for t in texts)
        and all(
            isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()) for m in maps
        )
        and isinstance(record.auto_pause, bool)
        and isinstance(record.auto_resume, bool)
        and isinstance(record.auto_pause_memory, bool)
        and (record.network is None or isinstance(record.network, dict))
        and isinstance(record.left, (int, float))
        and 0 <= record.left < 10**9
    ):
        return None
    return record
