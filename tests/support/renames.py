"""A jail renaming a file in a loop (runs in the test process; the loop in the jail): each rename
moves the kernel's one rename sequence, which every lookup held under a root checks at a ``..``."""

from __future__ import annotations

from jailbox.sandbox import Sandbox

# renames in a loop, as long as the jail lives
RENAMES = """
import os
open("/tmp/r0", "w").close()
while True:
    os.rename("/tmp/r0", "/tmp/r1")
    os.rename("/tmp/r1", "/tmp/r0")
"""


def renaming(sb: Sandbox) -> None:
    """Start the rename loop in ``sb`` and return once it runs."""
    sb.exec(["sh", "-c", f"python3 -c '{RENAMES}' >/dev/null 2>&1 &"])
    started = sb.exec("for i in $(seq 100); do [ -e /tmp/r1 ] && exit 0; sleep 0.05; done; exit 1")
    assert started.exit_code == 0, "the rename loop did not start"
