"""The one way a test waits for something another process does (in the test process).

``wait_until`` asks a check until it returns something truthy and returns that; when the limit runs out
it fails the test, naming what it waited for and for how long. The limits are hang guards, never
measures: each call site keeps the limit it had, and a check that holds at once is asked once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL = 0.05  # seconds between asks: short beside every limit here, long beside what one ask costs


def wait_until(check: Callable[[], T], what: str | Callable[[], str], limit: float, every: float = POLL) -> T:
    """``check()``'s first truthy value, asked every ``every`` seconds until ``limit`` seconds have passed
    (the last ask comes at or after the limit). ``what`` names the awaited thing in the failure; a function
    instead of a string is called only then, to report what the other side left (a log, its output)."""
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            break
        time.sleep(every)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {limit:g} s waiting for {said}")
