"""Two faults every health check misses, against real processes: an engine that answers everything
but its requests, and records replayed from an engine's earlier life.

engine-stuck-step   an engine whose step loop is stuck in one step (STUCK_STEP_S) while its /load and
                    /kv/events answer, beside a fleet engine, behind a round_robin router with
                    --first-byte-timeout-s 3 (issue 36, finding 8): 6 whole requests each answered
                    200 within 3 + 1 s; the engine, never out while idle, is out of routing while it
                    holds work without moving and back once its step ends
registry-replay     an engine restarted at the same URL, and an attacker with write access to the
                    registry's Redis but not the secret (finding 10): its first life's leave and join
                    replayed, its key rewritten with the old record, a signed record dated an hour
                    ahead; the engine keeps its place and index (all 96 requests for the prefix it
                    holds reach it), the future-dated one gets nothing
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import orjson

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.cost_model import DEFAULT_COST_MODEL, get_cost_model
from kvroute.loadgen.chaos.fleet import get_json, instances, metric
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.loadgen.chaos.scenarios.boundaries import post_completion, until_up
from kvroute.router.contract.registry_record import CHANNEL, IDS, EngineRecord, announcement, engine_key

PATIENCE_S = 3.0  # --first-byte-timeout-s of engine-stuck-step's router, as in the finding
STUCK_STEP_S = 6.0  # how long the stuck engine's step of one request's prefill takes
PROMPT_TOKENS = 64
WHOLE_REQUESTS = 6


def stuck_time_scale() -> float:
    """The sim engine's --time-scale at which one step prefilling a PROMPT_TOKENS prompt takes
    STUCK_STEP_S (its step time is the cost model's, engine/runners/cost_model.py, times the scale)."""
    work = SeqWork(seq_id=0, token_ids=tuple(range(PROMPT_TOKENS)), start_pos=0, block_table=(), sample=True,
                   sampling=SamplingParams())
    return STUCK_STEP_S / get_cost_model(DEFAULT_COST_MODEL).step_time([work])


async def _row(ctx: Context, router_url: str, instance: str) -> dict:
    return ((await instances(ctx.session, router_url)) or {}).get(instance, {})


class EngineStuckStep:
    name = "engine-stuck-step"
    summary = ("an engine stuck in a step while /load answers: whole requests failed over within the "
               "first-byte timeout + 1 s, the engine out until it moves")

    async def run(self, ctx: Context) -> Outcome:
        out, good = Outcome(), ctx.fleet.engines[0]
        stuck = ctx.fleet.spawn("e-stuck", ["engine", "--instance-id", "e-stuck", "--backend", "sim", "--time-scale",
                                            f"{stuck_time_scale():.1f}", "--log-level", "WARNING"])
        router = ctx.fleet.spawn("router-stuck", ["router", "--engine", good.url, "--engine", stuck.url, "--policy",
                                                  "round_robin", "--first-byte-timeout-s", str(PATIENCE_S),
                                                  "--health-interval-s", "0.5", "--ejection-s", "2",
                                                  "--log-level", "WARNING"])
        try:
            await until_up(ctx, router, routable=2)
            await asyncio.sleep(PATIENCE_S + 1.0)  # idle for longer than the patience: never stalled
            idle = await _row(ctx, router.url, "e-stuck")
            out.require(bool(idle.get("routable")) and not idle.get("stalled"), "idle-never-stalled", self.name,
                        f"e-stuck, idle, was taken out: {idle}")
            results = await self._ask(ctx, router.url)
            out.eject_s = await ctx.wait(lambda: self._stalled(ctx, router.url))
            load = await get_json(ctx.session, stuck.url + "/load") or {}  # it still reports, holding its requests
            out.resync_s = await ctx.wait(lambda: self._back(ctx, router.url))
            notes = {"stuck_load_while_out": {k: load.get(k) for k in ("running", "waiting", "progress")},
                     **{name: await metric(ctx.session, router.url, f"kvroute_router_{name}_total")
                        for name in ("retries", "stalls")}}
        finally:
            router.terminate(grace_s=5.0)
            stuck.terminate(grace_s=5.0)
        self._judge(ctx, out, results, notes)
        return out

    def _judge(self, ctx: Context, out: Outcome, results: list[tuple[int, str, float]], notes: dict) -> None:
        bound = PATIENCE_S + 1.0
        in_time = [took for status, _, took in results if status == 200 and took <= bound]
        out.require(len(in_time) == len(results), "whole-answered-within-patience", self.name,
                    f"{len(results) - len(in_time)} of {len(results)} not answered 200 within {bound:g}s: {results}")
        out.require(out.eject_s is not None, "stuck-engine-out", self.name,
                    f"e-stuck still routable {ctx.config.wait_s:g}s after it took requests and stopped moving")
        out.require(out.resync_s is not None, "stuck-engine-back", self.name,
                    f"e-stuck not routable again {ctx.config.wait_s:g}s after it was out (its step ends after "
                    f"{STUCK_STEP_S:g}s)")
        ms = sorted(1000 * took for _, _, took in results)
        out.rows.append(Row(scenario=self.name, traffic=f"{len(results)} non-streamed -> router-stuck, e-stuck stuck",
                            sent=len(results), ok=len(in_time),
                            statuses={str(s): sum(1 for x, _, _ in results if x == s) for s, _, _ in results},
                            p50_ms=ms[len(ms) // 2], p99_ms=ms[-1], eject_s=out.eject_s, resync_s=out.resync_s,
                            detail={"by_instance": {w: sum(1 for _, x, _ in results if x == w) for _, w, _ in results},
                                    **notes}))

    async def _ask(self, ctx: Context, url: str) -> list[tuple[int, str, float]]:
        rng = random.Random(ctx.config.seed)
        prompts = [[rng.randrange(5, 8000) for _ in range(PROMPT_TOKENS)] for _ in range(WHOLE_REQUESTS)]

        async def ask(prompt) -> tuple[int, str, float]:
            t = time.monotonic()
            try:
                status, headers, _ = await post_completion(ctx, url, {"prompt": prompt, "max_tokens": 4})
            except (TimeoutError, aiohttp.ClientError) as e:
                return 0, type(e).__name__, time.monotonic() - t
            return status, headers.get("x-kvroute-instance", ""), time.monotonic() - t

        return await asyncio.gather(*(ask(p) for p in prompts))

    @staticmethod
    async def _stalled(ctx: Context, url: str) -> bool:
        row = await _row(ctx, url, "e-stuck")
        return bool(row.get("stalled")) and not row.get("routable")

    @staticmethod
    async def _back(ctx: Context, url: str) -> bool:
        row = await _row(ctx, url, "e-stuck")
        return bool(row.get("routable")) and not row.get("stalled")


PREFIX = "You are the fleet's long-lived assistant. Answer from the shared handbook below. " * 6
REPLAY_REQUESTS = 96
REWRITE_S = 2.0  # how long the attacker keeps rewriting the engine's key with its old record


class RegistryReplay:
    name = "registry-replay"
    summary = ("an engine's old leave, join and record replayed after it restarted, and a record dated an hour "
               "ahead: the engine keeps its place and index, the future one gets nothing")

    async def run(self, ctx: Context) -> Outcome:
        import redis.asyncio as aioredis

        out, redis_url = Outcome(), ctx.fleet.redis_url
        sim = ["--backend", "sim", "--time-scale", "0.1", "--log-level", "WARNING"]
        victim = ctx.fleet.spawn("e-replayed", ["engine", "--instance-id", "e-replayed", "--registry", redis_url, *sim])
        peer = ctx.fleet.spawn("e-replay-peer", ["engine", "--instance-id", "e-replay-peer", "--registry", redis_url,
                                                 *sim])
        ahead = ctx.fleet.spawn("e-ahead", ["engine", "--instance-id", "e-ahead", *sim])
        router = ctx.fleet.spawn("router-replay", ["router", "--registry", redis_url, "--health-interval-s", "0.5",
                                                   "--log-level", "WARNING"])
        client = aioredis.Redis.from_url(redis_url)
        try:
            old_record, old_leave = await self._restart(ctx, client, victim, router)
            await until_up(ctx, ahead)
            await self._warm(ctx, victim, router)
            served, statuses, present = await self._attack(ctx, client, router, old_record, old_leave, ahead)
            refused = {reason: await metric(ctx.session, router.url,
                                            f'kvroute_router_registry_refused_total{{reason="{reason}"}}')
                       for reason in ("stale", "future", "replayed")}
        finally:
            await client.delete(engine_key("e-ahead"))
            await client.srem(IDS, "e-ahead")
            await client.aclose()
            for proc in (router, ahead, peer, victim):
                proc.terminate(grace_s=5.0)
        kept = served.get("e-replayed", 0)
        out.require(kept == REPLAY_REQUESTS and present["e-replayed"] == present["samples"], "replay-changes-nothing",
                    self.name, f"{kept} of {REPLAY_REQUESTS} prefix requests reached the engine holding the prefix; "
                               f"it was listed in {present['e-replayed']} of {present['samples']} looks: {served}")
        out.require(not served.get("e-ahead") and not present["e-ahead"], "future-record-refused", self.name,
                    f"the engine of a record dated an hour ahead was listed {present['e-ahead']} times, "
                    f"served {served.get('e-ahead', 0)}")
        out.rows.append(Row(scenario=self.name, traffic=f"{REPLAY_REQUESTS} prefix requests -> router-replay",
                            sent=REPLAY_REQUESTS, ok=kept, statuses=statuses,
                            detail={"by_instance": served, "refused_records": refused, "listed": present}))
        return out

    async def _restart(self, ctx: Context, client, victim, router) -> tuple[bytes, bytes]:
        """The victim's first life as an attacker records it (its live record, its leave), then its
        restart at the same URL, routable again with a new epoch."""
        pubsub = client.pubsub()
        await pubsub.subscribe(CHANNEL)
        await until_up(ctx, router, routable=2)
        old_record = await client.get(engine_key("e-replayed"))
        await asyncio.to_thread(victim.terminate, 10.0)  # a clean stop: it announces its leave
        old_leave = await _leave_of(pubsub, "e-replayed", ctx.config.wait_s)
        await pubsub.aclose()
        victim.start()
        await until_up(ctx, victim)
        epoch = orjson.loads(old_record)["epoch"]
        back = await ctx.wait(lambda: self._listed(ctx, router.url, "e-replayed", epoch))
        if back is None:
            raise RuntimeError(f"e-replayed did not rejoin router-replay after its restart; see {victim.log_path}")
        return old_record, old_leave

    @staticmethod
    async def _listed(ctx: Context, url: str, instance: str, old_epoch: int) -> bool:
        row = await _row(ctx, url, instance)
        return bool(row.get("routable")) and row.get("epoch") not in (None, old_epoch)

    async def _warm(self, ctx: Context, victim, router) -> None:
        """The victim alone computes the prefix; the router's index learns it from its events."""
        for i in range(3):
            await post_completion(ctx, victim.url, {"prompt": PREFIX + f"warm-up {i}", "max_tokens": 2})

        async def indexed() -> bool:
            return (await _row(ctx, router.url, "e-replayed")).get("blocks_indexed", 0) > 0
        if await ctx.wait(indexed) is None:
            raise RuntimeError("router-replay never indexed e-replayed's prefix")

    async def _attack(self, ctx: Context, client, router, old_record: bytes, old_leave: bytes, ahead):
        """Replay and forge while prefix requests flow; (who served them, their statuses, how often each
        engine was listed in the router's instances)."""
        await client.publish(CHANNEL, old_leave)
        await client.publish(CHANNEL, announcement("join", EngineRecord.from_json(old_record)))
        future = EngineRecord(instance_id="e-ahead", url=ahead.url, ts=time.time() + 3600).signed(ctx.fleet.secret)
        await client.set(engine_key("e-ahead"), future.to_json(), px=3_600_000)
        await client.sadd(IDS, "e-ahead")
        await client.publish(CHANNEL, announcement("join", future))
        rewrite = asyncio.ensure_future(_rewrite(client, engine_key("e-replayed"), old_record, REWRITE_S))
        served: dict[str, int] = {}
        statuses: dict[str, int] = {}
        present = {"samples": 0, "e-replayed": 0, "e-ahead": 0}
        try:
            for i in range(REPLAY_REQUESTS):
                status, headers, _ = await post_completion(ctx, router.url, {"prompt": PREFIX + f"question {i}",
                                                                             "max_tokens": 2})
                who = headers.get("x-kvroute-instance", "-")
                served[who] = served.get(who, 0) + 1
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                rows = await instances(ctx.session, router.url) or {}
                present["samples"] += 1
                present["e-replayed"] += "e-replayed" in rows
                present["e-ahead"] += "e-ahead" in rows
                await asyncio.sleep(0.1)
        finally:
            rewrite.cancel()
        return served, statuses, present


async def _rewrite(client, key: str, raw: bytes, seconds: float) -> None:
    """Keep `key` holding `raw`, faster than its engine refreshes it, for `seconds`."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        await client.set(key, raw, px=60_000)
        await asyncio.sleep(0.02)


async def _leave_of(pubsub, instance_id: str, timeout_s: float) -> bytes:
    """The next "leave" announcement of `instance_id`, as it went over the channel."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None:
            body = orjson.loads(message["data"])
            if body.get("type") == "leave" and body.get("record", {}).get("instance_id") == instance_id:
                return message["data"]
    raise RuntimeError(f"{instance_id} announced no leave within {timeout_s:g}s")
