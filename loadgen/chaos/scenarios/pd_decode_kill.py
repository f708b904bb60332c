"""A decode engine killed under disaggregated whole requests: every one answered.

pd-decode-kill    a prefill engine and two decode engines of the scenario's own behind a router of its
                  own; 12 whole (non-streamed) requests, and the decode engine holding the most of them
                  killed (-9) mid-decode: 12 of 12 answered 200 (retried on the other decode engine)
"""

from __future__ import annotations

import asyncio
import random
import time

from kvroute.loadgen.chaos.fleet import instances
from kvroute.loadgen.chaos.own_router import ask, row, spawn_router
from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.scenario_base import Context, Outcome

SIM = ("--backend", "sim", "--time-scale", "0.1", "--num-threads", "1", "--log-level", "WARNING")
REQUESTS = 12


class PdDecodeKill:
    name = "pd-decode-kill"
    summary = "a decode engine killed under 12 disaggregated whole requests: 12 of 12 answered"

    async def run(self, ctx: Context) -> Outcome:
        out, rng = Outcome(), random.Random(ctx.config.seed)
        engines = [ctx.fleet.spawn(name, ["engine", "--instance-id", name, "--role", role, *SIM])
                   for name, role in (("e-pd-p", "prefill"), ("e-pd-d0", "decode"), ("e-pd-d1", "decode"))]
        router = None
        try:
            for proc in engines:
                await ctx.fleet.wait_http(ctx.session, proc, "/health", ctx.config.wait_s)
            router = await spawn_router(ctx, "router-pd", ["--pd-min-uncached", "16", "--request-timeout-s", "30"],
                                        engines)
            bodies = [{"prompt": [rng.randrange(5, 8000) for _ in range(64)], "max_tokens": 1024, "ignore_eos": True}
                      for _ in range(REQUESTS)]
            tasks = [asyncio.ensure_future(ask(ctx, router.url, body)) for body in bodies]
            victim, held = await _busiest_decode(ctx, router.url, engines[1:])
            ctx.say(f"{self.name}: kill -9 {victim.name} holding {held} whole requests")
            await asyncio.to_thread(victim.kill)
            statuses = [s for s, _ in await asyncio.gather(*tasks)]
        finally:
            for proc in [*engines, *([router] if router else [])]:
                proc.terminate(grace_s=5.0)
        out.require(statuses.count(200) == REQUESTS, "pd-whole-survives-decode-kill", self.name,
                    f"{statuses.count(200)} of {REQUESTS} answered 200: {statuses}")
        out.rows.append(row(self.name, f"{REQUESTS} whole, disaggregated, {victim.name} killed", statuses,
                            statuses.count(200), victim=victim.name, held_at_kill=held))
        return out


async def _busiest_decode(ctx: Context, url: str, decodes: list[Proc], wait_s: float = 10.0) -> tuple[Proc, int]:
    """The decode engine the router has the most requests on, once one has 2 (or after `wait_s`)."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        rows = await instances(ctx.session, url) or {}
        counts = {p.name: rows.get(p.name, {}).get("inflight", 0) for p in decodes}
        if max(counts.values()) >= 2:
            break
        await asyncio.sleep(0.05)
    victim = max(decodes, key=lambda p: counts.get(p.name, 0))
    return victim, counts.get(victim.name, 0)
