"""A closed jail's directory removed after ``close()`` returns (runs in the host process).

Removing a directory costs what the disk makes it cost: on ext4 with online discard (this project's
VMs) each ``rmdir`` waits about 6 ms for the device, so a closed jail's writable layer, a dozen
entries, took about 30 ms of a 100 ms create + exec + close. ``close()`` now renames the directory
into the state directory's ``trash/`` (one rename on the same filesystem: gone from ``sandboxes/`` at
once) and one thread per host process removes it.

Bounded and backed up: past ``BACKLOG`` trees waiting, ``close()`` removes its own itself, so a caller
that closes faster than the disk removes cannot pile up disk; the host's exit waits for the queue (at
most ``EXIT_WAIT``); the launcher removes the trash of a host that died (``child/zygote.py``), and
``jailbox cleanup`` any whose owner is gone (``state.cleanup``).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from pathlib import Path

from . import state
from .floor.idmap import IdMap

BACKLOG = 16  # trees waiting for the remover before close() removes its own
EXIT_WAIT = 30.0  # seconds the host's exit waits for the trees still queued
RETRY_AFTER = 1.0  # seconds before a failed removal is tried again, once

log = logging.getLogger("jailbox")


class _Remover:
    """The queue and its one thread; started at the first tree, again in a forked child."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: collections.deque[tuple[Path, IdMap | None]] = collections.deque()
        self.busy = 0  # trees taken off the queue and not yet removed
        self.thread: threading.Thread | None = None

    def pending(self) -> int:
        with self.cond:
            return len(self.queue) + self.busy

    def put(self, path: Path, id_map: IdMap | None) -> None:
        with self.cond:
            self.queue.append((path, id_map))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="jailbox-remover", daemon=True)
                self.thread.start()
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                path, id_map = self.queue.popleft()
                self.busy += 1
            try:
                _remove(path, id_map)
            except Exception as exc:  # left in trash/: the launcher at exit, or `jailbox cleanup`, tries again
                log.warning("could not remove the closed sandbox's directory %s: %s", path, exc)
            finally:
                with self.cond:
                    self.busy -= 1
                    self.cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until every tree queued so far is removed (or tried); False if ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.queue or self.busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        return True


def _remove(path: Path, id_map: IdMap | None) -> None:
    """Remove ``path``; once more after ``RETRY_AFTER`` if that failed (what the kernel was still
    tearing down of the jail may have held a part of it)."""
    try:
        state.remove_sandbox_dir(path, id_map)
    except Exception:
        time.sleep(RETRY_AFTER)
        state.remove_sandbox_dir(path, id_map)


_REMOVER = _Remover()


def _after_fork() -> None:
    global _REMOVER
    _REMOVER = _Remover()  # the parent's thread is not in the child, nor are its trees the child's


os.register_at_fork(after_in_child=_after_fork)
atexit.register(lambda: _REMOVER.wait(EXIT_WAIT))


def retire(sandbox_dir: Path, id_map: IdMap | None) -> None:
    """Take a closed jail's directory out of ``sandboxes/`` now and remove it in the background (or
    now, past the backlog or where it cannot be moved). Its jail's processes are gone by now."""
    if _REMOVER.pending() >= BACKLOG:
        state.remove_sandbox_dir(sandbox_dir, id_map)
        return
    target = state.trash_dir(sandbox_dir.parent.parent) / sandbox_dir.name
    try:
        os.rename(sandbox_dir, target)
    except FileNotFoundError:
        return
    except OSError:  # e.g. a directory of that name already in trash/: no reason to wait for it
        state.remove_sandbox_dir(sandbox_dir, id_map)
        return
    _REMOVER.put(target, id_map)


def wait(timeout: float | None = None) -> bool:
    """Until every directory this process's closed jails left is removed; False on ``timeout``."""
    return _REMOVER.wait(timeout)
