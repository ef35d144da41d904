"""Which ids ``SandboxConfig.user`` (or an image's ``User``) means in a root filesystem.

``NAME``, ``UID``, ``NAME:GROUP`` or ``UID:GID``, as Docker reads an image config's User: names
come from the tree's own ``/etc/passwd`` and ``/etc/group`` (opened inside the tree, so a symlink
in the image cannot point the host elsewhere), supplementary groups from ``/etc/group``.
The ids must exist in the jail's map: rootless without subordinate ids there is only root.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..floor import linux as L
from ..hostids import subuid_fix

MAX_DB = 4 << 20


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def _read(root: str, path: str, generated: dict[str, str]) -> list[list[str]]:
    if path in generated:
        text = generated[path]
    else:
        try:
            root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = L.open_in_root(root_fd, path, os.O_RDONLY)
            finally:
                os.close(root_fd)
            with os.fdopen(fd, "rb") as f:
                text = f.read(MAX_DB).decode(errors="replace")
        except OSError:
            return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def lookup(spec: str, root: str, generated: dict[str, str], max_id: int) -> User:
    """The ids of ``spec`` in the tree at ``root`` (``generated`` files override the tree's)."""
    name, _, group = spec.partition(":")
    passwd = _read(root, "etc/passwd", generated)
    groups_db = _read(root, "etc/group", generated)
    home = "/"
    entry = next((p for p in passwd if len(p) >= 6 and (p[0] == name or p[2] == name)), None)
    if name.isdigit():
        uid = int(name)
        gid = int(entry[3]) if entry and entry[3].isdigit() else uid
    elif entry is not None and entry[2].isdigit() and entry[3].isdigit():
        uid, gid = int(entry[2]), int(entry[3])
    else:
        raise ConfigError(f"user {name!r} is not in the root filesystem's /etc/passwd")
    if entry is not None:
        home = entry[5] or "/"
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = next((g for g in groups_db if len(g) >= 3 and g[0] == group and g[2].isdigit()), None)
            if found is None:
                raise ConfigError(f"group {group!r} is not in the root filesystem's /etc/group")
            gid = int(found[2])
    login = entry[0] if entry else None
    extra = sorted(
        {int(g[2]) for g in groups_db if len(g) >= 4 and g[2].isdigit() and login and login in g[3].split(",")} | {gid}
    )
    for value in (uid, gid, *extra):
        if value > max_id:
            raise ConfigError(
                f"user {spec!r} needs id {value}, which this jail's id map lacks (it maps 0..{max_id}); "
                "rootless, give yourself subordinate ids: "
                f"sudo apt-get install uidmap && {subuid_fix(getpass.getuser())}"
            )
    return User(uid, gid, tuple(extra), home)
