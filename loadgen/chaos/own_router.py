"""A router of a scenario's own, beside the fleet's, and what the request-limit scenarios send it."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time

import aiohttp

from kvroute.loadgen.chaos.fleet import get_json, instances
from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.scenario_base import Context


async def spawn_router(ctx: Context, name: str, args: list[str], engines: list[Proc] | None = None) -> Proc:
    """A router of the scenario's own over `engines` (the fleet's by default), routing to all of them."""
    engines = engines or ctx.fleet.engines
    proc = ctx.fleet.spawn(name, ["router", *[a for e in engines for a in ("--engine", e.url)], *args,
                                  "--log-level", "WARNING"])
    deadline = time.monotonic() + ctx.config.wait_s
    while time.monotonic() < deadline and proc.alive:
        health = await get_json(ctx.session, proc.url + "/health")  # open, keys or not
        if health is not None and health.get("routable") == len(engines):
            return proc
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{name} did not come up; see {proc.log_path}")


def tenant_file(ctx: Context, name: str, tenants: dict) -> str:
    path = os.path.join(ctx.fleet.log_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"tenants": tenants}, f)
    return path


async def ask(ctx: Context, url: str, body: dict | bytes, key: str | None = None, headers: dict | None = None,
               path: str = "/v1/completions") -> tuple[int, dict]:
    """(status, JSON answer); status 0 when no answer came."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        async with ctx.session.post(url + path, data=data, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=60)) as r:
            return r.status, await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return 0, {}


async def charged(ctx: Context, url: str) -> int:
    """In-flight requests and queued prefill tokens the router still charges its instances with."""
    rows = await instances(ctx.session, url) or {}
    return sum(r["inflight"] + r["queued_prefill_tokens"] for r in rows.values())


def text(i: int, chars: int) -> str:
    return (f"{i} " + "the quick brown fox jumps over the lazy dog " * (chars // 44 + 1))[:chars]


def row(name: str, traffic: str, statuses: list[int], ok: int, **detail) -> Row:
    counts = collections.Counter(str(s) for s in statuses)
    return Row(scenario=name, traffic=traffic, sent=len(statuses), ok=ok, statuses=dict(counts),
               five_xx=sum(v for k, v in counts.items() if k[:1] == "5"), detail=detail)
