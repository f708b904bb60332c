"""Honour a cancellation that Python 3.11 swallowed.

In Python 3.11, `asyncio.wait_for` returns normally when the task is cancelled just as
the awaited operation finishes (python/cpython#86296; 3.12 rebuilt `wait_for` on
`asyncio.timeout`). redis-py wraps every command it sends in `wait_for` when a socket
timeout is set, so a task cancelled during a Redis call can carry on as if nothing had
happened: `kvroute chaos` found a router's event follower surviving about one cancel in
four, and a router given SIGTERM never finishing its shutdown. Code that awaits Redis in
a loop calls `raise_if_cancelled()` after each call.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelled() -> None:
    """Raise CancelledError if the current task was cancelled and the cancel got lost."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
