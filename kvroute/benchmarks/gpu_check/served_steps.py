"""The steps over processes (the process harness, loadgen/processes.py): an engine served over HTTP,
`kvroute bench` and `kvroute bench --tiers`, a disaggregated prefill/decode pair behind a router."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import statistics
import time

from kvroute.benchmarks.gpu_check.runner_steps import prompt, repeat_step_s


async def routable(session, router: str, n: int, timeout_s: float = 120.0) -> None:
    """Wait until the router routes to `n` engines (it has seen their roles and caches)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(router + "/router/instances") as r:
            if sum(i.get("routable", False) for i in (await r.json())["instances"]) >= n:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the router at {router} did not route to {n} engines within {timeout_s:.0f} s")


async def first_token(session, url: str, ids: list[int], max_tokens: int = 1) -> float:
    """Seconds from sending a streamed completion (its body encoded beforehand) to its first token."""
    body = json.dumps({"prompt": ids, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                ttft = time.perf_counter() - t0
                async for _ in r.content:
                    pass
                return ttft
    raise RuntimeError(f"{url} streamed no token")


async def metric_sums(session, url: str, *names: str) -> dict[str, float]:
    out = dict.fromkeys(names, 0.0)
    async with session.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


async def served(session, url: str, n: int, reps: int, rng: random.Random) -> dict:
    """Median TTFT of `n`-token prompts sent cold then again, and the engine's own step time for the repeat."""
    step = "kvroute_engine_step_seconds_sum"
    cold, warm, in_engine = [], [], []
    for _ in range(reps):
        ids = prompt(n, rng)
        cold.append(await first_token(session, url, ids))
        before = (await metric_sums(session, url, step))[step]
        warm.append(await first_token(session, url, ids))
        in_engine.append((await metric_sums(session, url, step))[step] - before)
    c, w, e = (statistics.median(x) * 1e3 for x in (cold, warm, in_engine))
    return {"cold_ttft_ms": c, "served_ttft_ms": w, "cold_over_warm": c / w, "engine_step_ms": e,
            "outside_engine_step_ms": w - e}


async def serving(ctx) -> dict:
    """Served TTFT by prompt length; for the prefill step's prompt, each served repeat paired with the runner's
    step for the same case right before it (so load on the machine weighs on both alike)."""
    import aiohttp

    rng, p, runner, reps = random.Random(3), ctx.plan.prompt, ctx.runner(), max(ctx.plan.reps, 3)
    lengths = sorted({1024, p} | ({4096} if not ctx.plan.quick else set()))
    with ctx.processes() as procs:
        url = ctx.engine(procs, "serving", "--num-blocks", str(4 * max(lengths) // 16))
        await procs.wait_ready(url, timeout_s=300.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for n in lengths:  # first-use costs (allocations that grow to each size) out of the figures
                await served(session, url, n, 1, rng)
            rows = {n: await served(session, url, n, reps, rng) for n in lengths}
            pairs = []
            for _ in range(reps):
                step_ms = repeat_step_s(runner, p, rng) * 1e3
                pairs.append((step_ms, (await served(session, url, p, 1, rng))["served_ttft_ms"]))
    ctx.close_runner()
    step_ms, served_ms = (statistics.median(x) for x in zip(*pairs))
    return {**{f"prompt_{n}": row for n, row in rows.items()}, "prompt_tokens": p, "served_ttft_ms": served_ms,
            "runner_step_ms": step_ms, "overhead_ms": statistics.median(b - a for a, b in pairs),
            "cold_over_warm": rows[max(lengths)]["cold_over_warm"]}


def kvroute_bench(ctx, name: str, *args: str) -> list[dict]:
    out = ctx.out / name
    shutil.rmtree(out, ignore_errors=True)
    engine_args = [f"--engine-arg={a}" for a in ctx.engine_args]
    with ctx.processes() as procs:
        proc = procs.kvroute(name, "bench", "--backend", "torch", "--engines", str(ctx.plan.engines),
                             "--no-progress", "--out", str(out), *engine_args, *args)
        if proc.wait() != 0:
            raise RuntimeError(f"kvroute bench ({name}) failed: see {ctx.out / 'logs' / (name + '.log')}")
    return json.loads((out / "results.json").read_text())


def step_bench(ctx) -> dict:
    runs = kvroute_bench(ctx, "bench", "--policies", ctx.plan.policies, *ctx.plan.bench)
    return {r["name"]: {k: r.get(k) for k in ("requests", "errors", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
                                              "cached_token_ratio")} for r in runs}


def step_tiers(ctx) -> dict:
    runs = kvroute_bench(ctx, "tiers", "--tiers", "--tier-runs", ctx.plan.tier_runs, *ctx.plan.storm)
    device = runs[0]["ttft_p90_s"]
    out = {}
    for r in runs:
        t = r.get("tiers") or {}
        out[r["name"]] = {"storm_ttft_p90_s": r["ttft_p90_s"], "p90_over_device": r["ttft_p90_s"] / device,
                          "errors": r["all_errors"], "outputs_equal_device": r.get("outputs_equal_device"),
                          "storm_requests": r["requests"], "gb_per_s": t.get("gb_per_s"), "bytes": t.get("bytes"),
                          "recovery_moved_over_needed": t.get("recovery_moved_over_needed")}
    return out


async def pd_pull(ctx) -> dict:
    import aiohttp

    names = ("kvroute_engine_kv_pull_bytes_total", "kvroute_engine_kv_pull_seconds_sum",
             "kvroute_engine_kv_pull_seconds_count")
    rng = random.Random(4)
    with ctx.processes() as procs:
        prefill = ctx.engine(procs, "prefill", "--role", "prefill")
        decode = ctx.engine(procs, "decode", "--role", "decode")
        router = procs.server("router", "router", "--pd-min-uncached", "0", "--engine", prefill, "--engine", decode)
        for url in (prefill, decode, router):
            await procs.wait_ready(url, timeout_s=300.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            await routable(session, router, 2)
            for _ in range(ctx.plan.pulls):
                await first_token(session, router, prompt(ctx.plan.prompt, rng), max_tokens=2)
            got = await metric_sums(session, decode, *names)
    nbytes, seconds, pulls = (got[n] for n in names)
    return {"pulls": pulls, "bytes": nbytes, "pull_seconds": seconds,
            "gb_per_s": nbytes / seconds / 1e9 if seconds else None}
