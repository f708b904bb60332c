"""Waiting for a condition that a loopback server or background loop makes true."""

import asyncio


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()
