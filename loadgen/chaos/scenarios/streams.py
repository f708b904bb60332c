"""1,000 concurrent streams through one router, beside the background load: every one must
end with [DONE] and no error event, and the router's memory stay bounded. The routers'
own count of requests in flight on the engines, sampled during the burst, shows how many
it held at once."""

from __future__ import annotations

import asyncio

import orjson

from kvroute.loadgen.chaos.load import Tally
from kvroute.loadgen.chaos.scenario_base import Context, Outcome

MAX_TOKENS = 64  # with ~333 streams per engine a step is slow, so they overlap for seconds
PROMPT_TOKENS = 32  # short: this is about open streams, not prefill
SAMPLE_S = 0.1


class ManyStreams:
    name = "streams"
    summary = "1,000 concurrent streamed completions through one router"

    async def run(self, ctx: Context) -> Outcome:
        n, router = ctx.config.streams, ctx.fleet.routers[0]
        tally = Tally(self.name, f"{n:,} streams -> {router.name}")
        ctx.say(f"{self.name}: opening {n:,} streams of {MAX_TOKENS} tokens at once through {router.name}")
        bodies = [orjson.dumps({"prompt": [100 + (i + j) % 7000 for j in range(PROMPT_TOKENS)], "stream": True,
                                "max_tokens": MAX_TOKENS, "ignore_eos": True}) for i in range(n)]
        peak = [0]
        sampler = asyncio.ensure_future(self._sample(ctx, peak))
        t0 = ctx.now()
        try:
            await asyncio.gather(*(ctx.load.send(tally, "/v1/completions", body, True, [router.url])
                                   for body in bodies))
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        took = ctx.now() - t0
        ctx.say(f"{self.name}: {tally.ok:,} of {n:,} complete in {took:.1f}s; at the peak the routers had {peak[0]:,} "
                f"requests in flight on the engines and {tally.peak_streaming:,} streams were sending tokens")
        out = Outcome(notes={"seconds": round(took, 2), "router_peak_inflight": peak[0],
                             "peak_streaming": tally.peak_streaming})
        row = tally.to_row()
        row.detail.update(seconds=round(took, 2), router_peak_inflight=peak[0])
        out.rows.append(row)
        out.require(tally.ok == n, "streams-complete", self.name,
                    f"{n - tally.ok} of {n} streams did not complete: {tally.examples[:3]}")
        return out

    async def _sample(self, ctx: Context, peak: list[int]) -> None:
        while True:
            peak[0] = max(peak[0], sum((await ctx.views.inflight()).values()))
            await asyncio.sleep(SAMPLE_S)
