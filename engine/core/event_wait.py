"""Waiting for an asyncio.Event with a timeout, without losing a cancel.

`asyncio.wait_for(event.wait(), t)` in Python 3.11 returns normally when the task is cancelled in
the same loop step that sets the event (and turns a cancel during its timeout's clean-up into
TimeoutError): a loop that waits this way and is then cancelled at shutdown runs on, and whoever
awaits it waits forever. `asyncio.timeout` keeps the cancel.
"""

from __future__ import annotations

import asyncio


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `event`; True when it is set. A cancel always propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
