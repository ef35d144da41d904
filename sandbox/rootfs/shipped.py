"""Which root filesystem recipes ship with jailbox, and where they are.

They are the checkout's top-level ``rootfs/`` folder, installed as the package data of
``jailbox.sandbox.rootfs.recipes`` (found by name: that folder is not beside this module in a
checkout). ``rootfs build`` loads them, and the store's not-found message offers ``rootfs build
NAME`` only for these names. Runs in the host process.
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable

PACKAGE = f"{__package__}.recipes"


def directory() -> Traversable:
    """The shipped recipes' folder."""
    return resources.files(PACKAGE)


def names() -> list[str]:
    """Names of the shipped recipes: ``default``, ``slim``, ..."""
    return sorted(p.name[: -len(".yaml")] for p in directory().iterdir() if p.name.endswith(".yaml"))
