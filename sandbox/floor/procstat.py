"""``/proc/PID/stat``, read one way for every process role (the host, the launcher, a jail's init);
``after_name`` also parses a thread's (``/proc/PID/task/TID/stat``, read by ``pause.py``).

Stdlib only. The command name in the line is the process's own choice (it may hold spaces and
``)``), so the fields are taken after the last ``)``; a line is read to at most ``STAT_MAX`` bytes.
"""

from __future__ import annotations

from . import small

STAT_MAX = 4096  # a stat line is about 300 bytes: 52 fields, the name at most 64


def after_name(line: bytes) -> list[bytes]:
    """A stat line's fields from the state on (field 3); none when the line has no name's end."""
    end = line.rfind(b")")
    return [] if end < 0 else line[end + 2 :].split()


def fields(pid: int) -> list[bytes] | None:
    """The fields of ``pid``'s stat line from its state on (field 3, so ``fields(pid)[1]`` is the
    parent); None when no such process is visible or the line cannot be read."""
    return after_name(small.read(f"/proc/{pid}/stat", STAT_MAX)) or None


def parent(pid: int) -> int:
    """``pid``'s parent; 0 when not known (gone, or no such process)."""
    found = fields(pid)
    try:
        return int(found[1]) if found else 0
    except (IndexError, ValueError):
        return 0


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22); None when no such process is
    visible, or when it has ended and only waits for its parent to reap it (state Z or X)."""
    found = fields(pid)
    try:
        return None if not found or found[0] in (b"Z", b"X") else int(found[19])
    except (IndexError, ValueError):
        return None
