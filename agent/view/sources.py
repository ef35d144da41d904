"""What ``jailbox view`` reads: output directories of ``jailbox run``, ``bench`` and ``replay --json``, held open.

Runs in the viewer's process (``jailbox view``), which serves what a model or a jail chose: the names, the
contents, the links. Each PATH the user names is opened once, as given (the user's choice, as ``hostfs``
treats a destination), and held by descriptor; everything below it is opened from that descriptor by the
kernel with ``RESOLVE_BENEATH`` and no symlink followed (``hostfs.open_beneath``), so neither ``..`` nor a
link (planted before or while the viewer runs) reaches outside. Every read is bounded: a record by
``MAX_RECORD``, a file shown by ``MAX_SHOWN``, a listing by ``MAX_ENTRIES`` and ``MAX_DEPTH``, the runs of a
directory by ``MAX_RUNS``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...sandbox import hostfs
from ...sandbox.errors import AgentError

MAX_RECORD = 64 << 20
"""Bytes of a trajectory, a results file or a replay's JSON read (the largest of the paper's runs is ~2 MB)."""
MAX_SHOWN = 256 << 10
"""Bytes of a produced file shown as text in the page (the rest is downloaded)."""
MAX_ENTRIES = 2000
"""Files listed for one run (what the model made past that is left out, and the page says so)."""
MAX_DEPTH = 16
"""Directory levels listed below a run."""
MAX_RUNS = 1000
"""Runs listed in one directory of runs (``jailbox run --output-dir DIR`` makes one per run)."""

TRAJECTORY = "trajectory.json"
RESULTS = "results.jsonl"
TASKS = "tasks"

Kind = Literal["run", "batch", "runs", "replay"]
EntryKind = Literal["file", "dir", "link", "other"]


class Unreadable(AgentError, ValueError):
    """A record the viewer will not read (missing, a link, too large, not the expected JSON); says why in a line."""


@dataclass(frozen=True)
class Entry:
    rel: bytes  # below the run's directory, names joined by "/"
    size: int
    kind: EntryKind


class Source:
    """One PATH given to ``jailbox view``: its directory held by descriptor, and what it holds (``kind``).

    A file names its directory and the record in it: ``trajectory.json`` a run, ``results.jsonl`` a batch,
    any other ``.json`` a run if it holds an object (the reference package's ``trajectory_*.json``; ``record``
    names it), else a replay (``jailbox replay --json``'s list of steps)."""

    def __init__(self, path: str) -> None:
        self.path = path
        target = Path(path)
        record: str | None = None
        try:
            if target.is_dir():
                self.fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                record = target.name
                self.fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror}; name a directory jailbox run, bench or replay wrote") from None
        self.record = record
        self.kind: Kind = self._kind(record)

    def _kind(self, record: str | None) -> Kind:
        if record is None:
            if self._present(RESULTS) or self._present(TASKS):
                return "batch"
            return "run" if self._present(TRAJECTORY) else "runs"
        if record == TRAJECTORY:
            self.record = None
            return "run"
        if record == RESULTS:
            self.record = None
            return "batch"
        if record.endswith(".json"):  # a run recorded elsewhere (the paper's trajectory_*.json), or a replay
            try:
                return "run" if isinstance(self.json(record), dict) else "replay"
            except Unreadable:
                self.close()
                raise
        self.close()
        raise Unreadable(f"{self.path}: name a run's directory, a batch's, trajectory.json, or a replay's JSON")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _present(self, name: str) -> bool:
        """Whether the top holds ``name``, whatever it is (a link there is a record refused when read)."""
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def _stat(self, rel: str | bytes) -> os.stat_result | None:
        try:
            fd = hostfs.open_beneath(self.fd, rel)
        except OSError:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def is_file(self, rel: str | bytes) -> bool:
        st = self._stat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def open_file(self, rel: str | bytes) -> tuple[int, int]:
        """A descriptor of the regular file ``rel`` and its size; ``Unreadable`` for a link anywhere on the way,
        ``..``, a directory, FIFO or device."""
        try:
            fd = hostfs.open_beneath(self.fd, rel)
        except OSError as exc:
            why = "a symlink, which is not followed" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            raise Unreadable(f"{os.fsdecode(rel)}: {why}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise Unreadable(f"{os.fsdecode(rel)}: not a regular file")
        os.set_blocking(fd, True)
        return fd, st.st_size

    def read(self, rel: str | bytes, limit: int = MAX_RECORD, whole: bool = False) -> tuple[bytes, int]:
        """At most ``limit`` bytes of the file ``rel``, and its whole size; with ``whole``, ``Unreadable``
        before anything is read when the file is larger (a record is parsed whole or not at all)."""
        fd, size = self.open_file(rel)
        if whole and size > limit:
            os.close(fd)
            raise Unreadable(f"{os.fsdecode(rel)}: {size} bytes, past the viewer's {limit} (MAX_RECORD)")
        try:
            chunks, left = [], limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks), size
        finally:
            os.close(fd)

    def json(self, rel: str | bytes) -> Any:
        data, _ = self.read(rel, whole=True)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise Unreadable(f"{os.fsdecode(rel)}: not JSON ({str(exc)[:80]})") from None

    def stamp(self, rel: str | bytes) -> tuple[int, int]:
        """Size and modification time of ``rel`` (0, 0 if gone): what a live page polls."""
        st = self._stat(rel)
        return (0, 0) if st is None else (st.st_size, st.st_mtime_ns)

    def listdir(self, rel: str | bytes, limit: int = MAX_ENTRIES) -> list[tuple[bytes, EntryKind]]:
        """Up to ``limit`` names in the directory ``rel`` (b"" for the top) with their kind, sorted."""
        try:  # a description of its own: scandir's offset is not shared with another thread's listing
            fd = (
                os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
                if not rel
                else hostfs.open_beneath(self.fd, rel, directory=True)
            )
        except OSError:
            return []
        try:
            names: list[tuple[bytes, EntryKind]] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if len(names) >= limit:
                        break
                    kind: EntryKind
                    if entry.is_symlink():
                        kind = "link"
                    elif entry.is_dir(follow_symlinks=False):
                        kind = "dir"
                    elif entry.is_file(follow_symlinks=False):
                        kind = "file"
                    else:
                        kind = "other"
                    names.append((os.fsencode(entry.name), kind))
            return sorted(names)
        finally:
            os.close(fd)

    def walk(self, rel: bytes, limit: int = MAX_ENTRIES) -> tuple[list[Entry], bool]:
        """The files below ``rel`` (links as links, never followed), breadth first; True if cut at ``limit``."""
        found: list[Entry] = []
        queue: list[tuple[bytes, int]] = [(rel, 0)]
        while queue:
            top, depth = queue.pop(0)
            for name, kind in self.listdir(top):
                sub = name if not top else top + b"/" + name
                if kind == "dir":
                    if depth + 1 < MAX_DEPTH:
                        queue.append((sub, depth + 1))
                    continue
                if len(found) >= limit:
                    return found, True
                st = self._stat(sub) if kind == "file" else None
                found.append(Entry(sub, st.st_size if st else 0, kind))
        return found, False

    def runs(self) -> Iterator[bytes]:
        """The runs of a ``runs`` source: its subdirectories holding a ``trajectory.json``, newest name last."""
        for name, kind in self.listdir(b"", MAX_RUNS):
            if kind == "dir" and self.is_file(name + b"/" + TRAJECTORY.encode()):
                yield name
