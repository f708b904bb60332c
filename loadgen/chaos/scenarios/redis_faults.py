"""Redis faults under load: a crash (kill -9, restarted empty on the same port) and a
freeze (SIGSTOP: connections hang instead of failing). Routing must go on on load alone.

eject   fault -> the index breaker is open on every router (no request waits on Redis)
resync  Redis answers again -> every breaker closed, every instance routable, and each
        router's index finds the prefix the load keeps hot (reloaded from the engines'
        snapshots after a crash, which loses everything)
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.scenario_base import Context, Outcome


@dataclasses.dataclass(frozen=True)
class RedisFault:
    name: str
    summary: str
    what: str
    fault: Callable[[Proc], object]  # done to the redis-server (in a thread: kill -9 waits to reap it)
    resume: Callable[[Proc], object]  # then, after hold_s: start it again (empty), or continue it

    async def run(self, ctx: Context) -> Outcome:
        out, redis = Outcome(), ctx.fleet.redis
        ctx.say(f"{self.name}: {self.what} redis-server (pid {redis.pid})")
        await asyncio.to_thread(self.fault, redis)
        out.eject_s = await ctx.wait(lambda: ctx.views.every_breaker(True))
        out.require(out.eject_s is not None, "ejected", self.name,
                    f"the index breaker was not open on every router {ctx.config.wait_s:g}s after the fault")
        ctx.say(f"{self.name}: index breaker open on every router after {out.eject_s}s; "
                f"fault held {ctx.config.hold_s:g}s")
        await asyncio.sleep(ctx.config.hold_s)
        self.resume(redis)
        await ctx.fleet.wait_redis(ctx.config.wait_s)
        hot = ctx.prompts.hot_prompt()
        out.resync_s = await ctx.wait(lambda: ctx.views.index_serving(hot))
        out.require(out.resync_s is not None, "resynced", self.name,
                    f"the routers' index did not serve hits again {ctx.config.wait_s:g}s after Redis came back")
        ctx.say(f"{self.name}: index serving hits on every router after {out.resync_s}s")
        return out


REDIS_KILL = RedisFault("redis-kill", "kill -9 the Redis holding the shared index and event stream, restart it "
                        "empty", "kill -9", Proc.kill, Proc.start)
REDIS_FREEZE = RedisFault("redis-freeze", "SIGSTOP the Redis (every call hangs until its timeout), then SIGCONT",
                          "SIGSTOP", Proc.freeze, Proc.thaw)
