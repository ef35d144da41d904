"""The id map of a user namespace, and writing it for a process that just unshared one.

Runs in the launcher (for each jail's child A) and on the host (for the unpack worker; and
``max_id``, which ids a jail's user and a stored tree's owners may have). The map itself is
planned on the host (``sandbox/hostids.py``); this module carries it, applies it and answers what
it holds. Stdlib only.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass

from . import wire

HELPERS = (("newuidmap", "uid_map"), ("newgidmap", "gid_map"))


@dataclass(frozen=True)
class IdMap:
    """Which host ids a user namespace maps; planned by ``sandbox/hostids.py`` on the host."""

    uid_map: str  # "inside outside count" triples, as /proc/PID/uid_map takes them
    gid_map: str  # the same for groups
    helper: bool  # subordinate ranges: only the setuid newuidmap/newgidmap may write this map
    deny_setgroups: bool  # a single-id rootless map: the kernel wants setgroups denied first

    def host_root(self) -> tuple[int, int]:
        """The host uid and gid that the namespace's root is."""
        return int(self.uid_map.split()[1]), int(self.gid_map.split()[1])

    def triples(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """The (inside, outside, count) triples of the uid map and of the gid map (on one line or several)."""
        return _triples(self.uid_map), _triples(self.gid_map)

    def max_id(self) -> int:
        """The highest id inside the namespace that maps to a host id, for users and groups both
        (0: a single-id map): the top of what an archive's owners or a jail's user may be."""
        if os.getuid() == 0:
            return int(self.uid_map.split()[2]) - 1
        counts = []
        for text in (self.uid_map, self.gid_map):
            fields = [int(x) for x in text.split()]
            counts.append(max(fields[i] + fields[i + 2] for i in range(0, len(fields), 3)) - 1)
        return min(counts)

    def to_wire(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: object) -> IdMap:
        f = wire.fields_of(cls, obj)
        return cls(
            uid_map=wire.typed(f, "uid_map", str),
            gid_map=wire.typed(f, "gid_map", str),
            helper=wire.typed(f, "helper", bool),
            deny_setgroups=wire.typed(f, "deny_setgroups", bool),
        )


def _triples(text: str) -> list[tuple[int, int, int]]:
    words = [int(word) for word in text.split()]
    return [(words[i], words[i + 1], words[i + 2]) for i in range(0, len(words) - 2, 3)]


def write_maps(pid: int, idmap: IdMap) -> None:
    """Write the maps of ``pid``'s user namespace (from its parent namespace). Raises OSError."""
    if idmap.helper:
        for tool, key in HELPERS:
            args = [tool, str(pid), *getattr(idmap, key).split()]
            res = subprocess.run(args, capture_output=True, text=True, check=False)
            if res.returncode:
                raise OSError(1, f"{tool} failed: {res.stderr.strip()}")
        return
    if idmap.deny_setgroups:
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    for key, text in (("uid_map", idmap.uid_map), ("gid_map", idmap.gid_map)):
        with open(f"/proc/{pid}/{key}", "w") as f:
            f.write(text)
