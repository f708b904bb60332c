"""Engine faults under load: a crash (kill -9, then a restart on the same port, a new
epoch) and a hang (SIGSTOP with connections still accepted by the kernel, then SIGCONT).

eject   fault -> no router routes to the engine (every router's /router/instances)
resync  the engine answers again -> routable on every router, the index at or past the
        engine's own (epoch, seq): reloaded from its snapshot, or caught up on its events
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.loadgen.chaos.watch import wait_for

MIN_INFLIGHT = 2  # the fault waits (up to BUSY_WAIT_S) until one engine has this many requests in flight
BUSY_WAIT_S = 5.0


async def busiest(ctx: Context) -> tuple[Proc, int]:
    """The engine with the most requests in flight, once one has MIN_INFLIGHT (or after BUSY_WAIT_S):
    the fault then always hits requests in the middle of being served."""
    counts: dict[str, int] = {}

    async def busy() -> bool:
        counts.update(await ctx.views.inflight())
        return max(counts.values(), default=0) >= MIN_INFLIGHT

    await wait_for(busy, BUSY_WAIT_S)
    victim = max(ctx.fleet.engines, key=lambda e: counts.get(e.name, 0))
    return victim, counts.get(victim.name, 0)


async def fault_and_recover(ctx: Context, name: str, what: str, fault, recover) -> Outcome:
    out = Outcome()
    victim, out.notes["inflight_at_fault"] = await busiest(ctx)
    out.notes["victim"] = victim.name
    ctx.say(f"{name}: {what} {victim.name} (pid {victim.pid}, {out.notes['inflight_at_fault']} requests in flight)")
    await asyncio.to_thread(fault, victim)
    out.eject_s = await ctx.wait(lambda: ctx.views.ejected(victim.name))
    out.require(out.eject_s is not None, "ejected", name,
                f"{victim.name} still routable {ctx.config.wait_s:g}s after the fault")
    ctx.say(f"{name}: {victim.name} out of routing after {out.eject_s}s; fault held {ctx.config.hold_s:g}s")
    await asyncio.sleep(ctx.config.hold_s)
    t0 = ctx.now()
    await recover(victim)
    out.notes["restart_s"] = round(ctx.now() - t0, 3)
    position = await ctx.views.engine_position(victim) or (0, 0)
    out.resync_s = await ctx.wait(lambda: ctx.views.caught_up(victim.name, position))
    out.require(out.resync_s is not None, "resynced", name,
                f"{victim.name} not routable with its index at {position} {ctx.config.wait_s:g}s after it came back")
    ctx.say(f"{name}: {victim.name} routable again, index at {position}, after {out.resync_s}s")
    out.notes["position"] = position
    return out


@dataclasses.dataclass(frozen=True)
class EngineFault:
    name: str
    summary: str
    what: str
    fault: Callable[[Proc], object]  # done to the victim (in a thread: kill -9 waits to reap it)
    resume: Callable[[Proc], object]  # then, after hold_s: start it again, or continue it

    async def run(self, ctx: Context) -> Outcome:
        async def recover(victim: Proc) -> None:
            self.resume(victim)
            await ctx.fleet.wait_http(ctx.session, victim, "/health", ctx.config.wait_s)

        return await fault_and_recover(ctx, self.name, self.what, self.fault, recover)


ENGINE_KILL = EngineFault("engine-kill", "kill -9 an engine under load, restart it on the same port (new epoch)",
                          "kill -9", Proc.kill, Proc.start)
ENGINE_HANG = EngineFault("engine-hang", "SIGSTOP an engine under load (a hung engine: connects, never answers), "
                          "then SIGCONT", "SIGSTOP", Proc.freeze, Proc.thaw)
