"""What ``SandboxConfig.rootfs`` names: ``"host"``, a directory path, or a stored root filesystem.

A path is anything starting with ``/``, ``.`` or ``~``; other strings are looked up in the store
first (``default``, ``docker.io/library/python:3.11-slim``, or its short form ``python:3.11-slim``),
then as a relative directory. A stored tree is used as the jail's lower layer directly (no copy),
and its image config supplies the environment (under the sandbox's own ``env``), the working
directory and the user commands run as (unless the sandbox sets them). A tree stored without
subordinate ids has only root, so its image's User is not used there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..config import SandboxConfig, jail_path
from ..errors import RootfsNotFound
from ..floor.idmap import IdMap

if TYPE_CHECKING:  # the store and the unpacker load only for a stored rootfs: "host" (the CLI's default) skips them
    from .store import Entry

RESERVED_WORKDIRS = ("/", "/proc", "/dev", "/sys", "/tmp")
ROOT_USERS = ("root", "0", "root:root", "0:0")


def is_path(value: str) -> bool:
    return value.startswith(("/", ".", "~"))


def stored(value: str) -> Entry | None:
    if value == "host" or is_path(value):
        return None
    from .store import Store

    store = Store()
    entry = store.resolve(value)
    return None if entry is None else store.adopt(entry)


def lower_dir(value: str, entry: Entry | None) -> Path:
    """The directory a jail mounts as its lower layer for ``rootfs=value`` (not ``host``), given
    what ``stored(value)`` found."""
    if entry is not None:
        return entry.tree
    root = Path(value).expanduser().absolute()
    if root.is_dir():
        return root
    if is_path(value):
        raise RootfsNotFound(
            f"root filesystem {root} does not exist or is not a directory; "
            "use \"host\" (this machine's own system), a stored root filesystem's name, or an unpacked one's path"
        )
    from .store import Store, not_found_message

    store = Store()
    raise RootfsNotFound(not_found_message(value, [e.name for e in store.list()]))


def apply_stored_rootfs(config: SandboxConfig) -> tuple[SandboxConfig, Path | None]:
    """One lookup per jail: ``config`` with the stored image's settings applied, and the lower
    layer (None for ``host``), so the tree and the image config come from the same entry."""
    if config.rootfs == "host":
        return config, None
    entry = stored(config.rootfs)
    return apply_image(config, entry), lower_dir(config.rootfs, entry)


def apply_image(config: SandboxConfig, entry: Entry | None) -> SandboxConfig:
    """``config`` with the stored image's Env and WorkingDir filled in under what it sets itself."""
    if entry is None:
        return config
    update: dict = {}
    image = entry.config
    if image.env:
        update["env"] = {**image.env, **config.env}
    workdir = image.workdir
    if "workdir" not in config.model_fields_set and workdir:
        try:
            workdir = jail_path(workdir)
        except ValueError:
            workdir = None
        if workdir and workdir not in RESERVED_WORKDIRS:
            update["workdir"] = workdir
    if "user" not in config.model_fields_set and image.user and image.user not in ROOT_USERS:
        if entry.idmap and IdMap.from_wire(entry.idmap).max_id() > 0:  # a flattened tree (no subordinate ids): all root
            update["user"] = image.user
    return config.model_copy(update=update) if update else config
