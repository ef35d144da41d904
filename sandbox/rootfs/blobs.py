"""The content-addressed blob cache: ``blobs/sha256/<hex>`` holds only bytes that hashed to their
name; a download in progress lives in ``blobs/partial/<hex>`` and resumes from its length.

A blob shared by two images is downloaded once. Concurrent downloads of one blob (two pulls at
once) take turns on ``blobs/locks/<hex>.lock``; the second finds it done. A download cut off (by
the network or Ctrl-C) keeps its partial file, and the next attempt asks for the rest with a
``Range`` request (the hash is recomputed over what is on disk first, so nothing is trusted
unverified). Reading stops at the promised size (the descriptor's, which ``pull`` has held to
``IMAGE_BLOB_MAX``): bytes beyond it, or a final hash that differs, discard the partial file and
raise ``DigestMismatch``, so a registry that streams forever costs at most that size on disk.

A partial file nobody resumes is removed by ``remove_stale`` (``jailbox cleanup``): one whose lock no
live download holds and which has not grown for ``PARTIAL_STALE`` seconds. Runs in the caller's process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DigestMismatch, DownloadInterrupted, RegistryError

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
Progress = Callable[[str, int, int | None], None]  # digest, bytes so far, total
# opener(offset) -> (chunks, offset the server honoured: offset for a 206, 0 for a full 200)
Opener = Callable[[int], tuple[Iterator[bytes], int]]
PARTIAL_STALE = 24 * 3600.0  # a day: long enough to come back and resume an interrupted pull


def hex_of(digest: str) -> str:
    m = _DIGEST.match(digest)
    if not m:
        raise RegistryError(f"unsupported digest {digest!r} (only sha256 is accepted)")
    return m.group(1)


class BlobCache:
    def __init__(self, root: Path) -> None:
        self.root = root  # inside the store, which is made private first (Store.ensure)
        root.mkdir(exist_ok=True, mode=0o700)
        for sub in ("sha256", "partial", "locks"):
            (root / sub).mkdir(exist_ok=True, mode=0o700)

    def path(self, digest: str) -> Path:
        return self.root / "sha256" / hex_of(digest)

    @contextlib.contextmanager
    def _lock(self, digest: str) -> Iterator[None]:
        fd = os.open(self.root / "locks" / (hex_of(digest) + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def fetch(self, digest: str, size: int, opener: Opener, progress: Progress | None = None) -> Path:
        """The verified blob of ``size`` bytes, downloaded (or resumed) with ``opener`` unless cached."""
        final = self.path(digest)
        if final.is_file():
            return final
        with self._lock(digest):
            if final.is_file():
                return final
            partial = self.root / "partial" / hex_of(digest)
            hasher, have = _hash_prefix(partial)
            if have > size:
                partial.unlink()
                hasher, have = hashlib.sha256(), 0
            chunks, start = opener(have)
            if start != have:  # the server ignored our Range: start over
                hasher, have = hashlib.sha256(), 0
            try:
                with open(partial, "r+b" if start else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in chunks if have < size else ():
                        if have + len(chunk) > size:
                            out.close()
                            partial.unlink()
                            raise DigestMismatch(f"{digest}: the registry sent more than the {size} bytes promised")
                        have += len(chunk)
                        hasher.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(digest, have, size)
                        if have == size:  # what was promised is here: judge it, whatever else is coming
                            break
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # a generator's: closes the response now, not when collected
            if have < size:
                raise DownloadInterrupted(f"{digest}: the download ended after {have} of {size} bytes; run again")
            got = "sha256:" + hasher.hexdigest()
            if got != digest:
                partial.unlink()
                raise DigestMismatch(f"{digest}: the downloaded bytes hash to {got}; the blob was discarded")
            os.replace(partial, final)
            return final


def _hash_prefix(path: Path) -> tuple[hashlib._Hash, int]:
    hasher = hashlib.sha256()
    have = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
                have += len(chunk)
    except FileNotFoundError:
        pass
    return hasher, have


def remove_stale(root: Path, force: bool = False) -> list[Path]:
    """Partial downloads under the blob cache ``root`` that no live download holds (its lock is free)
    and that have not grown for ``PARTIAL_STALE`` seconds (any age with ``force``); removed, listed."""
    removed: list[Path] = []
    partials = root / "partial"
    if not partials.is_dir():
        return removed
    for path in sorted(partials.iterdir()):
        if not _DIGEST.match("sha256:" + path.name):
            continue
        fd = os.open(root / "locks" / (path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a pull is writing it
            try:
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if force or age > PARTIAL_STALE:
                path.unlink()
                removed.append(path)
        finally:
            os.close(fd)
    return removed
