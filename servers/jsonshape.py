"""The shape of JSON a client sent, sized up before it is parsed: how deep it nests and how many elements it
holds. Parsing builds an object per element (16 MiB of ``[[],[],...`` built 400 MB), and Python's parser
recurses per level; a message big for its data (one long string) has few elements.

Runs in the serving host process (``jailbox serve``'s Connect RPC and code interpreter, ``jailbox
openenv``), on bytes its transport already bounded. Each caller says what its messages may hold and how
it refuses.
"""

from __future__ import annotations

import re
from typing import Literal

_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')
"""A JSON element as counted here: a string (skipped whole, escapes included), a bracket, a comma, a colon.
A scalar needs a comma to follow another, so it is counted by its comma."""


def excess(data: bytes | bytearray, max_depth: int, max_elements: int) -> Literal["elements", "depth"] | None:
    """What of ``data`` is over its bound, by a scan that builds nothing: ``"elements"`` past ``max_elements``,
    ``"depth"`` past ``max_depth`` levels of brackets; None when neither is."""
    depth = 0
    for count, match in enumerate(_TOKEN.finditer(data)):
        if count == max_elements:
            return "elements"
        token = data[match.start()]
        if token in b"[{":
            depth += 1
            if depth > max_depth:
                return "depth"
        elif token in b"]}":
            depth -= 1
    return None
