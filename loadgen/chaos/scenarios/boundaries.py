"""Every channel is a trust boundary: slow clients, introspection, the registry, a hung engine's
non-streamed answers and replayed transfer handles, each checked against real processes.

slow-clients        300 connections trickling header lines and 300 silent ones at router0: every one
                    closed within the header timeout (+1 s), the background load answering meanwhile
introspection-auth  a router with only --api-key: /router/*, /workers are 401 without it, 200 with it
rogue-registry      a fake engine's unsigned record in a signed fleet's registry gets no request
engine-hang-whole   non-streamed requests while an engine is SIGSTOPped: each answered within
                    --first-byte-timeout-s plus one request time
handle-replay       a signed handle for prompt P used with a prompt that shares P's full blocks: the
                    decode engine computes it and pulls nothing
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp

from kvroute.loadgen.chaos.fleet import get_json, instances, metric
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.router.contract.connections import ConnectionLimits
from kvroute.router.contract.kv_auth import make_grant
from kvroute.router.contract.registry_record import IDS, EngineRecord, engine_key

HEADER_TIMEOUT_S = ConnectionLimits().header_timeout_s  # the fleet's routers run with the default
HANG_FIRST_BYTE_S = 2.0  # --first-byte-timeout-s of engine-hang-whole's own router


async def until_up(ctx: Context, proc, path: str = "/health", routable: int = 0) -> None:
    """Until `proc` answers `path` (a router: until it has `routable` routable instances, if given)."""
    deadline = time.monotonic() + ctx.config.wait_s
    while time.monotonic() < deadline and proc.alive:
        rows = await instances(ctx.session, proc.url) if routable else None
        if (rows is not None and sum(r["routable"] for r in rows.values()) >= routable) or \
                (not routable and await get_json(ctx.session, proc.url + path)):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not come up; see {proc.log_path}")


async def post_completion(ctx: Context, url: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one non-streamed completion at `url`."""
    async with ctx.session.post(url + "/v1/completions", json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


class SlowClients:
    name = "slow-clients"
    summary = "300 slow-header and 300 silent connections at a router: all closed at the header timeout"

    async def run(self, ctx: Context) -> Outcome:
        out, port = Outcome(), ctx.fleet.routers[0].port
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(600)]
        for _, writer in conns[:300]:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()

        async def closed(reader, writer, slow: bool) -> float | None:
            while time.monotonic() - t0 < HEADER_TIMEOUT_S + 5:
                try:
                    if await asyncio.wait_for(reader.read(1 << 16), 2.0) == b"":
                        return time.monotonic() - t0
                except TimeoutError:
                    if slow and not writer.is_closing():
                        writer.write(b"X-Slow: 1\r\n")  # one more header line every 2 s
                except ConnectionError:
                    return time.monotonic() - t0
            return None

        times = await asyncio.gather(*(closed(r, w, i < 300) for i, (r, w) in enumerate(conns)))
        for _, writer in conns:
            writer.close()
        done = [t for t in times if t is not None and t <= HEADER_TIMEOUT_S + 1]
        out.require(len(done) == len(conns), "slow-clients-closed", self.name,
                    f"{len(conns) - len(done)} of {len(conns)} connections open past the header timeout + 1 s")
        out.eject_s = round(max(done), 2) if done else None
        out.rows.append(Row(scenario=self.name, traffic="300 slow + 300 silent -> router0",
                            sent=len(conns), ok=len(done),
                            eject_s=out.eject_s, detail={"header_timeout_s": HEADER_TIMEOUT_S}))
        return out


class IntrospectionAuth:
    name = "introspection-auth"
    summary = "a router with only --api-key refuses /router/* and /workers without the key"

    async def run(self, ctx: Context) -> Outcome:
        out, key = Outcome(), "chaos-api-key"
        engines = [a for e in ctx.fleet.engines for a in ("--engine", e.url)]
        proc = ctx.fleet.spawn("router-apikey", ["router", *engines, "--api-key", key, "--log-level", "WARNING"])
        checks = ok = 0
        try:
            await until_up(ctx, proc)
            paths = [("POST", "/router/explain", {"prompt": "hello"}), ("GET", "/router/instances", None),
                     ("GET", "/router/stats", None), ("GET", "/router/engines", None), ("GET", "/workers", None)]
            for method, path, body in paths:
                for headers, want in ((None, {401}), ({"Authorization": f"Bearer {key}"}, {200, 403})):
                    async with ctx.session.request(method, proc.url + path, json=body, headers=headers) as r:
                        checks += 1
                        ok += r.status in want
                        out.require(r.status in want, "introspection-behind-key", self.name,
                                    f"{method} {path} {'with' if headers else 'without'} the key: {r.status}")
        finally:
            proc.terminate(grace_s=5.0)
        out.rows.append(Row(scenario=self.name, traffic="introspection -> router-apikey", sent=checks, ok=ok))
        return out


class RogueRegistry:
    name = "rogue-registry"
    summary = "an unsigned registry record for a fake engine gets no request in a signed fleet"

    async def run(self, ctx: Context) -> Outcome:
        import redis.asyncio as aioredis

        out, redis_url = Outcome(), ctx.fleet.redis_url
        honest = ctx.fleet.spawn("e-registered", ["engine", "--instance-id", "e-registered", "--backend", "sim",
                                                  "--time-scale", "0.1", "--registry", redis_url,
                                                  "--log-level", "WARNING"])
        rogue = ctx.fleet.spawn("e-rogue", ["engine", "--instance-id", "e-rogue", "--backend", "sim",
                                            "--log-level", "WARNING"])
        router = ctx.fleet.spawn("router-registry", ["router", "--registry", redis_url, "--log-level", "WARNING"])
        client = aioredis.Redis.from_url(redis_url)
        served: dict[str, int] = {}
        try:
            await until_up(ctx, rogue)
            record = EngineRecord(instance_id="e-rogue", url=rogue.url)  # unsigned: no secret to sign it with
            await client.set(engine_key("e-rogue"), record.to_json(), px=120_000)
            await client.sadd(IDS, "e-rogue")
            await until_up(ctx, router, routable=1)
            for i in range(30):
                body = {"prompt": f"tenant prompt {i}", "max_tokens": 2}
                status, headers, _ = await post_completion(ctx, router.url, body)
                who = headers.get("x-kvroute-instance", str(status))
                served[who] = served.get(who, 0) + 1
            refused = await metric(ctx.session, router.url, "kvroute_router_registry_refused_total")
        finally:
            await client.delete(engine_key("e-rogue"))
            await client.srem(IDS, "e-rogue")
            await client.aclose()
            for proc in (router, rogue, honest):
                proc.terminate(grace_s=5.0)
        out.require(not served.get("e-rogue"), "rogue-gets-nothing", self.name, f"served by {served}")
        out.rows.append(Row(scenario=self.name, traffic="30 requests -> router-registry",
                            sent=30, ok=served.get("e-registered", 0),
                            statuses={k: v for k, v in served.items()}, detail={"refused_records": refused}))
        return out


class EngineHangWhole:
    name = "engine-hang-whole"
    summary = "non-streamed requests while an engine is SIGSTOPped: each answered within the first-byte timeout"

    async def run(self, ctx: Context) -> Outcome:
        out, victim = Outcome(), ctx.fleet.engines[0]
        rng = random.Random(ctx.config.seed)
        engines = [a for e in ctx.fleet.engines for a in ("--engine", e.url)]
        router = ctx.fleet.spawn("router-hang", ["router", *engines, "--policy", "round_robin",
                                                 "--first-byte-timeout-s", str(HANG_FIRST_BYTE_S),
                                                 "--log-level", "WARNING"])
        await until_up(ctx, router, routable=len(ctx.fleet.engines))
        victim.freeze()
        t0 = time.monotonic()

        async def ask(i: int) -> tuple[int, float]:
            t = time.monotonic()
            prompt = [rng.randrange(5, 8000) for _ in range(64)]
            try:
                status, _, _ = await post_completion(ctx, router.url, {"prompt": prompt, "max_tokens": 4})
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            return status, time.monotonic() - t

        try:
            results = await asyncio.gather(*(ask(i) for i in range(12)))
        finally:
            victim.thaw()
            router.terminate(grace_s=5.0)
        bound = HANG_FIRST_BYTE_S + 3.0
        ok = [t for s, t in results if s == 200 and t <= bound]
        out.require(len(ok) == len(results), "whole-answers-bounded", self.name,
                    f"{len(results) - len(ok)} of {len(results)} not answered 200 within {bound:g}s")
        ms = sorted(1000 * t for _, t in results)
        out.rows.append(Row(scenario=self.name, traffic="12 non-streamed -> router-hang, e0 stopped",
                            sent=len(results), ok=len(ok),
                            statuses={str(s): sum(1 for x, _ in results if x == s) for s, _ in results},
                            p50_ms=ms[len(ms) // 2], p99_ms=ms[-1], detail={"held_s": round(time.monotonic() - t0, 2)}))
        return out


class HandleReplay:
    name = "handle-replay"
    summary = "a signed transfer handle replayed with another prompt tail is computed locally, never written"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        sim = ["--backend", "sim", "--time-scale", "0.1", "--log-level", "WARNING"]
        prefill = ctx.fleet.spawn("e-prefill", ["engine", "--instance-id", "e-prefill", "--role", "prefill", *sim])
        decode = ctx.fleet.spawn("e-decode", ["engine", "--instance-id", "e-decode", "--role", "decode", *sim])
        rng = random.Random(ctx.config.seed)
        full = [rng.randrange(5, 8000) for _ in range(96)]
        try:
            await until_up(ctx, prefill)
            await until_up(ctx, decode)
            grant = make_grant(ctx.fleet.secret, "e-prefill", prefill.url)
            status, _, pre = await post_completion(ctx, prefill.url, {"prompt": full + [11] * 9, "max_tokens": 1,
                                                            "kv_transfer_params": grant})
            out.require(status == 200, "handle-issued", self.name, f"prefill answered {status}")
            handle = pre.get("kv_transfer_params")
            status, _, _ = await post_completion(ctx, decode.url, {"prompt": full + [12] * 9, "max_tokens": 4,
                                                         "kv_transfer_params": handle})
            mismatches = await metric(ctx.session, decode.url, "kvroute_engine_kv_pull_failures_total") or 0
            pulled = await metric(ctx.session, decode.url, "kvroute_engine_kv_pull_blocks_total") or 0
        finally:
            prefill.terminate(grace_s=5.0)
            decode.terminate(grace_s=5.0)
        out.require(status == 200 and mismatches >= 1 and pulled == 0, "handle-bound", self.name,
                    f"status {status}, handle mismatches {mismatches}, blocks pulled {pulled}")
        out.rows.append(Row(scenario=self.name, traffic="replayed handle -> e-decode",
                            sent=1, ok=int(status == 200 and not pulled),
                            detail={"handle_mismatches": mismatches, "blocks_pulled": pulled}))
        return out
