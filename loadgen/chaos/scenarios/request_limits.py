"""Limits no request can escape, each against a router of its own over the fleet's engines, beside the
background load (loadgen/chaos/own_router.py); the decode-engine kill is in pd_decode_kill.py.

poisoned-bodies   1,000 bodies nested too deep to forward at a router with --max-inflight 8: each a
                  400, nothing left charged on any instance, and normal requests served after them
slo-header        a tenant whose SLO admission refuses asks for x-kvroute-slo-ttft-s: 3600: still refused
tenant-limits     40 concurrent 5,000-character prompts of a tenant with max_concurrency 2, then of one
                  with rate 0.1 and burst 2: at most 2 admitted (plus the rate's refill)
key-bound-tenant  --tenant-header beside keys is refused at start-up; a key's tenant cannot be changed by
                  a header; behind a trusted gateway unknown names are one bucket; explain names the key's
tokenizer-flood   one tenant's flood of 30,000-character prompts: another tenant's 6,000-character
                  requests are refused at most 5% of the time
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import time

from kvroute.loadgen.chaos.own_router import ask, charged, row, spawn_router, tenant_file, text
from kvroute.loadgen.chaos.scenario_base import Context, Outcome

FLOODERS = 128  # the flood's requests in flight: twice what the tokenizer pool may queue
QUIET = 40

class PoisonedBodies:
    name = "poisoned-bodies"
    summary = "1,000 bodies nested too deep to forward: 400 each, nothing left charged, normal requests served"

    async def run(self, ctx: Context) -> Outcome:
        out, sem = Outcome(), asyncio.Semaphore(32)
        router = await spawn_router(ctx, "router-poison", ["--max-inflight", "8", "--slo-ttft-s", "0.5"])

        async def poisoned(i: int) -> int:
            depth = 255 + i % 769  # parses (orjson reads 1024 levels), cannot be written again (254)
            async with sem:
                return (await ask(ctx, router.url, b'{"prompt": "hi", "max_tokens": 1, "unused": '
                                   + b"[" * depth + b"]" * depth + b"}"))[0]
        try:
            poison = await asyncio.gather(*(poisoned(i) for i in range(1000)))
            left = await charged(ctx, router.url)
            normal = [(await ask(ctx, router.url, {"prompt": text(i, 200), "max_tokens": 4}))[0] for i in range(20)]
        finally:
            router.terminate(grace_s=5.0)
        out.require(set(poison) == {400}, "poison-is-400", self.name, f"statuses {collections.Counter(poison)}")
        out.require(left == 0, "no-charge-survives", self.name, f"{left} still charged after the poison")
        out.require(normal.count(200) == 20, "normal-traffic-served", self.name, f"normal requests: {normal}")
        out.rows += [row(self.name, "1,000 poisoned -> router-poison", poison, poison.count(400), charged=left),
                     row(self.name, "20 normal after them", normal, normal.count(200))]
        return out


class SloHeader:
    name = "slo-header"
    summary = "x-kvroute-slo-ttft-s: 3600 cannot loosen a tenant's SLO: its requests are still refused"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        path = tenant_file(ctx, "slo-header", {"tight": {"keys": ["k-tight"], "slo_ttft_s": 0.0001,
                                                      "allow_request_slo": True}})
        router = await spawn_router(ctx, "router-slo", ["--tenants", path])
        loose = {"x-kvroute-slo-ttft-s": "3600"}
        try:
            _, explained = await ask(ctx, router.url, {"prompt": "hello", "max_tokens": 2}, "k-tight", loose,
                                      "/router/explain")
            t0 = time.monotonic()
            statuses = [s for s, _ in await asyncio.gather(*(
                ask(ctx, router.url, {"prompt": text(i, 400), "max_tokens": 2}, "k-tight", loose)
                for i in range(30)))]
            probes = 1 + int(time.monotonic() - t0)  # the gate lets one request a second through to learn
        finally:
            router.terminate(grace_s=5.0)
        slo = explained.get("admission", {}).get("slo_ttft_s")
        out.require(slo == 0.0001, "slo-not-loosened", self.name, f"explain shows SLO {slo}")
        out.require(statuses.count(200) <= probes, "slo-not-loosened", self.name,
                    f"{statuses.count(200)} of 30 admitted (probes allowed: {probes})")
        out.rows.append(row(self.name, "30 with x-kvroute-slo-ttft-s: 3600", statuses, statuses.count(200),
                             explained_slo_s=slo, probes_allowed=probes))
        return out


class TenantLimits:
    name = "tenant-limits"
    summary = "40 concurrent 5,000-character prompts: max_concurrency 2 admits 2, rate 0.1 burst 2 admits 2"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        path = tenant_file(ctx, "tenant-limits", {"capped": {"keys": ["k-capped"], "max_concurrency": 2},
                                              "metered": {"keys": ["k-metered"], "rate": 0.1, "burst": 2}})
        router = await spawn_router(ctx, "router-limits", ["--tenants", path])
        try:
            for key, bound in (("k-capped", lambda s: 2), ("k-metered", lambda s: 2 + int(0.1 * s))):
                t0 = time.monotonic()
                body = {"max_tokens": 2048, "ignore_eos": True}  # ~3 s each: all 40 overlap
                statuses = [s for s, _ in await asyncio.gather(*(
                    ask(ctx, router.url, {**body, "prompt": text(i, 5000)}, key) for i in range(40)))]
                most = bound(time.monotonic() - t0)
                out.require(statuses.count(200) <= most and set(statuses) <= {200, 429}, "limits-hold", self.name,
                            f"{key}: {collections.Counter(statuses)} (at most {most} admitted)")
                out.rows.append(row(self.name, f"40 x 5,000 chars, {key[2:]}", statuses, statuses.count(200),
                                     most_admissible=most))
        finally:
            router.terminate(grace_s=5.0)
        return out


class KeyBoundTenant:
    name = "key-bound-tenant"
    summary = "with API keys the key decides the tenant: a header can neither change it nor make new ones"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        path = tenant_file(ctx, "key-bound", {"A": {"keys": ["ka"], "rate": 5, "burst": 5},
                                           "default": {"rate": 1000}})
        refused = ctx.fleet.spawn("router-header-keys", ["router", "--engine", ctx.fleet.engines[0].url,
                                                         "--tenants", path, "--tenant-header", "x-tenant"])
        assert refused.popen is not None  # spawn() started it
        try:
            code = await asyncio.to_thread(refused.popen.wait, ctx.config.wait_s)
        except subprocess.TimeoutExpired:  # it started and serves: the invariant below is broken
            refused.terminate(grace_s=5.0)
            code = None
        with open(refused.log_path, errors="replace") as f:
            said = f.read().strip()
        out.require(code not in (None, 0) and "--trust-tenant-header" in said and "\n" not in said,
                    "header-beside-keys-refused", self.name, f"exit {code}: {said[:300]!r}")
        keyed = await spawn_router(ctx, "router-keys", ["--tenants", path])
        trusted = await spawn_router(ctx, "router-trusted", ["--tenants", path, "--tenant-header", "x-tenant",
                                                        "--trust-tenant-header"])
        try:
            t0 = time.monotonic()
            statuses = [s for s, _ in await asyncio.gather(*(
                ask(ctx, keyed.url, {"prompt": text(i, 100), "max_tokens": 2}, "ka", {"x-tenant": f"B{i}"})
                for i in range(100)))]
            most = 5 + int(5 * (time.monotonic() - t0)) + 1
            _, explained = await ask(ctx, keyed.url, {"prompt": "hi"}, "ka", path="/router/explain")
            for i in range(100):
                await ask(ctx, trusted.url, {"prompt": "hi", "max_tokens": 1}, "ka", {"x-tenant": f"new-{i}"})
            labels = await _tenant_labels(ctx, trusted.url)
        finally:
            keyed.terminate(grace_s=5.0)
            trusted.terminate(grace_s=5.0)
        tenant = explained.get("admission", {}).get("tenant")
        out.require(statuses.count(200) <= most, "key-decides-tenant", self.name,
                    f"{statuses.count(200)} of 100 admitted at rate 5 (at most {most})")
        out.require(tenant == "A", "explain-names-key-tenant", self.name, f"explain says {tenant!r}")
        out.require(labels <= {"A", "default"}, "no-series-per-name", self.name, f"tenant labels {sorted(labels)}")
        out.rows.append(row(self.name, "100 of key A (rate 5) naming others", statuses, statuses.count(200),
                             most_admissible=most, explained_tenant=tenant, tenant_labels=sorted(labels)))
        return out


async def _tenant_labels(ctx: Context, url: str) -> set[str]:
    """The tenants the router's admission metrics have a series for."""
    async with ctx.session.get(url + "/metrics") as r:
        exposition = await r.text()
    return {line.split('tenant="', 1)[1].split('"', 1)[0] for line in exposition.splitlines()
            if line.startswith("kvroute_router_admission_requests_total{")}


class TokenizerFlood:
    name = "tokenizer-flood"
    summary = "one tenant's flood of 30,000-character prompts: another's 6,000-character requests refused <= 5%"

    async def run(self, ctx: Context) -> Outcome:
        out, stop, flooded = Outcome(), asyncio.Event(), []
        path = tenant_file(ctx, "tokenizer-flood", {"flood": {"keys": ["k-flood"]}, "quiet": {"keys": ["k-quiet"]}})
        router = await spawn_router(ctx, "router-tokenize", ["--tenants", path])

        async def flood(i: int) -> None:
            while not stop.is_set():
                flooded.append((await ask(ctx, router.url, {"prompt": text(i, 30_000), "max_tokens": 1}, "k-flood"))[0])
                i += FLOODERS

        tasks = [asyncio.ensure_future(flood(i)) for i in range(FLOODERS)]
        quiet: list[int] = []
        try:
            await asyncio.sleep(1.0)  # the flood fills the tokenizer pool
            for i in range(QUIET):
                quiet.append((await ask(ctx, router.url, {"prompt": text(i, 6000), "max_tokens": 2}, "k-quiet"))[0])
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            router.terminate(grace_s=5.0)
        refused = len(quiet) - quiet.count(200)
        out.require(refused <= 0.05 * len(quiet), "quiet-tenant-served", self.name,
                    f"{refused} of {len(quiet)} quiet requests refused: {collections.Counter(quiet)}")
        out.rows += [row(self.name, f"flood: {FLOODERS} at a time x 30,000 chars", flooded, flooded.count(200)),
                     row(self.name, f"quiet: {QUIET} x 6,000 chars beside it", quiet, quiet.count(200),
                         refused_share=round(refused / max(1, len(quiet)), 3))]
        return out
