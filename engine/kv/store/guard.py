"""`GuardedStore`: a store that can be down or slow without failing a request.

Every call is bounded (reads by the engine's short `--kv-store-timeout-s`, plus
what the caller expects the bytes to take; writes by a longer limit); any failure or timeout raises
`StoreUnavailable`, which the engine turns into "recompute" (reads) or "drop" (writes). `trip_after`
consecutive failures make an outage (one slow call on a busy machine is not one):
it logs one warning, later failures stay quiet, and for `retry_s` after each
failure calls fail at once instead of waiting out the timeout again, so requests
do not queue behind a dead store; the first success after an outage logs that the
store is back. `on_error(op)` is told about every failed call, `on_state(up)` about
every change between up and down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from kvroute.engine.kv.store.base import KVStore, StoreUnavailable

log = logging.getLogger(__name__)


class GuardedStore:
    def __init__(self, store: KVStore, read_timeout_s: float, write_timeout_s: float = 5.0, retry_s: float = 1.0,
                 trip_after: int = 2, on_error: Callable[[str], None] | None = None,
                 on_state: Callable[[bool], None] | None = None) -> None:
        self.store = store
        self.store_id = store.store_id
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.retry_s = retry_s
        self.trip_after = trip_after
        self.failures = 0  # consecutive
        self.on_error = on_error or (lambda op: None)
        self.on_state = on_state or (lambda up: None)
        self.down_since: float | None = None
        self.skip_until = 0.0

    @property
    def up(self) -> bool:
        return self.down_since is None

    async def _call(self, op: str, call, timeout_s: float):
        now = time.monotonic()
        if self.down_since is not None and now < self.skip_until:
            self.on_error(op)
            raise StoreUnavailable(f"store {self.store_id} is down (since {now - self.down_since:.1f}s)")
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: in Python 3.11 it can turn a cancel into a timeout
                result = await call()
        except Exception as e:  # transport errors of any backend, and timeouts
            self.on_error(op)
            self.failures += 1
            if self.down_since is None and self.failures >= self.trip_after:
                self.down_since = now
                self.on_state(False)
                log.warning("kv store %s unavailable (%s: %s): recomputing instead of loading and dropping "
                            "writes until it answers again", self.store_id, type(e).__name__, e or "timed out")
            if self.down_since is not None:
                self.skip_until = time.monotonic() + self.retry_s
            raise StoreUnavailable(f"store {self.store_id}: {type(e).__name__}: {e}") from None
        self.failures = 0
        if self.down_since is not None:
            log.warning("kv store %s is back after %.1fs", self.store_id, time.monotonic() - self.down_since)
            self.down_since = None
            self.on_state(True)
        return result

    async def get_many(self, hashes: Sequence[int], transfer_s: float = 0.0) -> list[bytes | None]:
        """`transfer_s`: the read's expected transfer time, allowed on top of the read timeout."""
        return await self._call("read", lambda: self.store.get_many(hashes), self.read_timeout_s + transfer_s)

    async def contains_many(self, hashes: Sequence[int]) -> list[bool]:
        return await self._call("lookup", lambda: self.store.contains_many(hashes), self.read_timeout_s)

    async def put_many(self, items: Sequence[tuple[int, bytes]]) -> None:
        await self._call("write", lambda: self.store.put_many(items), self.write_timeout_s)

    async def close(self) -> None:
        await self.store.close()
