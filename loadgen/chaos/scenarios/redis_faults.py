"""Redis faults under load: a crash (kill -9, restarted empty on the same port) and a
freeze (SIGSTOP: connections hang instead of failing). Routing must go on on load alone.

eject   fault -> the index breaker is open on every router (no request waits on Redis)
resync  Redis answers again -> every breaker closed, every instance routable, and each
        router's index finds the prefix the load keeps hot (reloaded from the engines'
        snapshots after a crash, which loses everything)
"""

from __future__ import annotations

import asyncio

from loadgen.chaos.scenario_base import Context, Outcome


async def redis_fault(ctx: Context, name: str, what: str, fault, recover) -> Outcome:
    out = Outcome()
    redis = ctx.fleet.redis
    ctx.say(f"{name}: {what} redis-server (pid {redis.pid})")
    await asyncio.to_thread(fault)
    out.eject_s = await ctx.wait(lambda: ctx.views.every_breaker(True))
    out.require(out.eject_s is not None, "ejected", name,
                f"the index breaker was not open on every router {ctx.config.wait_s:g}s after the fault")
    ctx.say(f"{name}: index breaker open on every router after {out.eject_s}s; fault held {ctx.config.hold_s:g}s")
    await asyncio.sleep(ctx.config.hold_s)
    await recover()
    hot = ctx.prompts.hot_prompt()
    out.resync_s = await ctx.wait(lambda: ctx.views.index_serving(hot))
    out.require(out.resync_s is not None, "resynced", name,
                f"the routers' index did not serve hits again {ctx.config.wait_s:g}s after Redis came back")
    ctx.say(f"{name}: index serving hits on every router after {out.resync_s}s")
    return out


class RedisKill:
    name = "redis-kill"
    summary = "kill -9 the Redis holding the shared index and event stream, restart it empty"

    async def run(self, ctx: Context) -> Outcome:
        redis = ctx.fleet.redis

        async def restart() -> None:
            redis.start()
            await ctx.fleet.wait_redis(ctx.config.wait_s)

        return await redis_fault(ctx, self.name, "kill -9", redis.kill, restart)


class RedisFreeze:
    name = "redis-freeze"
    summary = "SIGSTOP the Redis (every call hangs until its timeout), then SIGCONT"

    async def run(self, ctx: Context) -> Outcome:
        redis = ctx.fleet.redis

        async def resume() -> None:
            redis.thaw()
            await ctx.fleet.wait_redis(ctx.config.wait_s)

        return await redis_fault(ctx, self.name, "SIGSTOP", redis.freeze, resume)
