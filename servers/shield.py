"""Work that must end even when its caller is cancelled: the servers' one way to hold it.

Runs in a server's host process, on its event loop. A sandbox being made or closed on a thread, or a
server closing every sandbox it holds, must not be abandoned half way when the request or the server is
cancelled (a dropped connection, a second signal): the work goes on under ``asyncio.shield`` and the
cancellation reaches the caller once it has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> tuple[asyncio.Future[T], bool]:
    """``work`` run to its end even when the caller is cancelled meanwhile, and whether the caller was:
    the caller passes the cancellation on afterwards, and reads ``work``'s result or error from the
    future."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # the task's own: read by the caller from it
            break
    return task, cancelled
