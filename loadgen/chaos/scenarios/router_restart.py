"""A router restart under load: SIGTERM (a rolling restart: it stops accepting, finishes
what it has), then the same command again on the same port. The load client fails over
to the other router meanwhile, as a load balancer would, and counts it.

eject   SIGTERM -> the load balancer's first refused connection (the router stopped accepting)
resync  the router answers again -> every engine routable on it and its index (the shared
        one in Redis) finding the hot prefix at once, without waiting for new events
"""

from __future__ import annotations

import asyncio

from kvroute.loadgen.chaos.scenario_base import Context, Outcome


class RouterRestart:
    name = "router-restart"
    summary = "SIGTERM one of two routers sharing the Redis index under load, start it again on the same port"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        victim = ctx.fleet.routers[0]
        tally = ctx.load.tally
        ctx.say(f"{self.name}: SIGTERM {victim.name} (pid {victim.pid}); the load fails over to the others")
        t0 = ctx.now()
        code = await asyncio.to_thread(victim.terminate, ctx.config.wait_s)
        out.notes.update(drain_s=round(ctx.now() - t0, 3), exit_code=code)
        out.require(code == 0, "clean-shutdown", self.name, f"{victim.name} exited with code {code} on SIGTERM")
        await ctx.wait(lambda: _true(tally.first_failover_at is not None))
        if tally.first_failover_at is not None:
            out.eject_s = round(max(0.0, tally.first_failover_at - t0), 3)
        out.require(out.eject_s is not None, "ejected", self.name, "no request failed over to another router")
        ctx.say(f"{self.name}: {victim.name} drained and exited in {out.notes['drain_s']}s (code {code}); "
                f"held down {ctx.config.hold_s:g}s")
        await asyncio.sleep(ctx.config.hold_s)
        victim.start()
        await ctx.fleet.wait_http(ctx.session, victim, "/health", ctx.config.wait_s)
        hot = ctx.prompts.hot_prompt()

        async def serving() -> bool:
            rows_ok = await ctx.views.every_router(lambda rows: all(r["routable"] for r in rows.values()))
            return rows_ok and await ctx.views.cached_tokens(victim, hot) > 0

        out.resync_s = await ctx.wait(serving)
        out.require(out.resync_s is not None, "resynced", self.name,
                    f"{victim.name} did not route with the shared index {ctx.config.wait_s:g}s after its restart")
        ctx.say(f"{self.name}: {victim.name} back, every engine routable and index hits after {out.resync_s}s")
        return out


async def _true(value: bool) -> bool:
    return value
