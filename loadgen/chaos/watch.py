"""What a scenario waits for, read from outside as an operator would: every router's
/router/instances, its index breaker gauge, its /router/explain, each engine's snapshot.

Times are measured by polling every `POLL_S`, so they are accurate to about that."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson

from kvroute.loadgen.chaos.fleet import Fleet, get_json, instances, metric
from kvroute.loadgen.chaos.procs import Proc

POLL_S = 0.05
BREAKER = "kvroute_index_breaker_open"


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float) -> float | None:
    """Seconds until `check()` holds, or None if it did not within `timeout_s`."""
    t0 = time.monotonic()
    while True:
        if await check():
            return round(time.monotonic() - t0, 3)
        if time.monotonic() - t0 > timeout_s:
            return None
        await asyncio.sleep(POLL_S)


class Views:
    def __init__(self, session: aiohttp.ClientSession, fleet: Fleet) -> None:
        self.session, self.fleet = session, fleet

    def live_routers(self) -> list[Proc]:
        return [r for r in self.fleet.routers if r.alive]

    async def every_router(self, pred: Callable[[dict], bool]) -> bool:
        """`pred(rows)` holds on every running router (one that does not answer: it does not)."""
        for router in self.live_routers():
            rows = await instances(self.session, router.url)
            if rows is None or not pred(rows):
                return False
        return True

    async def inflight(self) -> dict[str, int]:
        """Requests the routers have in flight now, per instance."""
        total: dict[str, int] = {}
        for router in self.live_routers():
            for inst, row in (await instances(self.session, router.url) or {}).items():
                total[inst] = total.get(inst, 0) + int(row.get("inflight") or 0)
        return total

    async def counters(self) -> dict[str, dict[str, float]]:
        """Each running router's retry and ejection counters."""
        out = {}
        for router in self.live_routers():
            out[router.name] = {name: await metric(self.session, router.url, f"kvroute_router_{name}_total") or 0.0
                                for name in ("retries", "ejections")}
        return out

    async def ejected(self, instance: str) -> bool:
        return await self.every_router(lambda rows: not rows[instance]["routable"])

    async def engine_position(self, engine: Proc) -> tuple[int, int] | None:
        snap = await get_json(self.session, engine.url + "/kv/snapshot")
        return None if snap is None else (int(snap["epoch"]), int(snap["seq"]))

    async def caught_up(self, instance: str, position: tuple[int, int]) -> bool:
        """Routable on every router, its index at or past the engine's (epoch, seq) `position`."""
        return await self.every_router(lambda rows: rows[instance]["routable"] and rows[instance]["epoch"] is not None
                                       and (rows[instance]["epoch"], rows[instance]["seq"]) >= position)

    async def breaker_open(self, router: Proc) -> bool:
        return bool(await metric(self.session, router.url, BREAKER))

    async def every_breaker(self, is_open: bool) -> bool:
        for router in self.live_routers():
            if await self.breaker_open(router) != is_open:
                return False
        return True

    async def cached_tokens(self, router: Proc, prompt: list[int]) -> int:
        """The most of `prompt` the router's index says any instance holds (POST /router/explain)."""
        try:
            async with self.session.post(router.url + "/router/explain", data=orjson.dumps({"prompt": prompt}),
                                         timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                if r.status != 200:
                    return 0
                rows = (await r.json(content_type=None)).get("instances") or []
                return max((int(row.get("cached_tokens") or 0) for row in rows), default=0)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return 0

    async def index_serving(self, prompt: list[int]) -> bool:
        """Every router's breaker closed, every instance routable, and its index finds `prompt`'s prefix."""
        if not await self.every_breaker(False):
            return False
        if not await self.every_router(lambda rows: all(r["routable"] for r in rows.values())):
            return False
        for router in self.live_routers():
            if await self.cached_tokens(router, prompt) <= 0:
                return False
        return True
