"""The routes of the route-only API (router/service/route_api.py) not finished yet, by id: each one's
charges stay the router's until its data plane reports the finish, or --request-timeout-s has passed."""

from __future__ import annotations

import asyncio
import secrets

from kvroute.router.contract.errors import NotFound
from kvroute.router.service.picker import Picked


class OpenRoutes:
    """The routes a data plane has not finished yet, by id; each finished by the router after `timeout_s`."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._open: dict[str, tuple[Picked, asyncio.TimerHandle]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, picked: Picked) -> str:
        route_id = secrets.token_hex(8)
        timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire, route_id)
        self._open[route_id] = (picked, timer)
        return route_id

    def get(self, route_id: str) -> Picked:
        entry = self._open.get(route_id)
        if entry is None:
            raise NotFound(f"no open route {route_id[:40]!r}: finished, timed out after "
                           f"{self.timeout_s:g}s (--request-timeout-s), or never made")
        return entry[0]

    def pop(self, route_id: str) -> Picked:
        picked = self.get(route_id)
        self._open.pop(route_id)[1].cancel()
        return picked

    def _expire(self, route_id: str) -> None:
        entry = self._open.pop(route_id, None)
        if entry is not None:
            entry[0].finish("timeout")

    def close(self) -> None:
        for picked, timer in self._open.values():
            timer.cancel()
            picked.finish("cancelled")
        self._open.clear()
