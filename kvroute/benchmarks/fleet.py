"""How fast the fleet follows changes (issue 11), on loopback with sim engines and a real redis-server.

    join   an engine started with --registry: spawn -> its first routed request (target <= 2 s)
    kill   kill -9 of a registered engine -> the router stops routing to it (target <= the 3 s TTL)
    drain  SIGTERM to one of 4 engines under steady streamed load: requests lost (must be 0),
           requests the router retried, time from SIGTERM to the engine's exit 0

    python -m kvroute.benchmarks.fleet [--repeats 5] [--out fleet.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import aiohttp

from kvroute.benchmarks.results import write_json
from kvroute.loadgen.processes import Processes, free_port
from kvroute.loadgen.redis_server import RedisServer
from kvroute.router.contract.prometheus_text import metric_sum


async def until(check, what: str, timeout_s: float = 60.0, poll_s: float = 0.02) -> None:
    """Poll `check()` (async) until it holds; a bench that would wait forever says what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"kvroute.benchmarks.fleet: {what} did not happen within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


def engine(procs: Processes, redis_url: str, name: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = procs.kvroute(name, "engine", "--backend", "sim", "--port", str(port), "--instance-id", name, "--registry",
                         redis_url, "--advertise-url", f"http://127.0.0.1:{port}", "--time-scale", "0.05",
                         "--log-level", "WARNING", *extra)
    return proc, f"http://127.0.0.1:{port}"


async def served_by(session, router: str) -> str | None:
    try:
        async with session.post(router + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
            await r.read()
            return r.headers.get("x-kvroute-instance") if r.status == 200 else None
    except aiohttp.ClientError:
        return None


async def routable(session, router: str) -> set[str]:
    async with session.get(router + "/router/instances") as r:
        return {i["id"] for i in (await r.json())["instances"] if i["routable"]}


async def join_and_kill(procs: Processes, session, redis_url: str, router: str, k: int) -> tuple[float, float]:
    t0 = time.monotonic()
    proc, _ = engine(procs, redis_url, f"join-{k}")

    async def served_by_it() -> bool:
        return await served_by(session, router) == f"join-{k}"

    async def gone() -> bool:
        return f"join-{k}" not in await routable(session, router)

    await until(served_by_it, f"a request served by join-{k}")
    joined = time.monotonic() - t0
    t1 = time.monotonic()
    os.killpg(proc.pid, signal.SIGKILL)
    await until(gone, f"join-{k} leaving the routable set after kill -9")
    procs.stop(proc)
    return joined, time.monotonic() - t1


async def steady_load(session, router: str, stop: asyncio.Event, results: list) -> None:
    async def one():
        body = {"prompt": [7] * 300, "max_tokens": 40, "ignore_eos": True, "stream": True}
        try:
            async with session.post(router + "/v1/completions", json=body) as r:
                text = await r.read()
                results.append(r.status == 200 and b"[DONE]" in text and b'"error"' not in text)
        except aiohttp.ClientError:
            results.append(False)

    tasks = []
    while not stop.is_set():
        tasks.append(asyncio.ensure_future(one()))
        await asyncio.sleep(0.05)  # 20 requests/s
    await asyncio.gather(*tasks)


async def drain(procs: Processes, session, redis_url: str, router: str) -> dict:
    engines = [engine(procs, redis_url, f"drain-{i}", "--drain-timeout-s", "30") for i in range(4)]
    for _, url in engines:
        await procs.wait_ready(url)

    async def all_routable() -> bool:
        return len(await routable(session, router)) >= 4

    await until(all_routable, "4 routable engines", poll_s=0.05)
    retries0 = await metric(session, router, "kvroute_router_retries_total")
    stop, results = asyncio.Event(), list[bool]()
    load = asyncio.ensure_future(steady_load(session, router, stop, results))
    await asyncio.sleep(3.0)
    victim = engines[0][0]
    t0 = time.monotonic()
    victim.send_signal(signal.SIGTERM)

    async def exited() -> bool:
        return victim.poll() is not None

    await until(exited, "the drained engine's exit")
    exit_s, code = time.monotonic() - t0, victim.returncode
    await asyncio.sleep(2.0)
    stop.set()
    await load
    retried = await metric(session, router, "kvroute_router_retries_total") - retries0
    for proc, _ in engines:
        procs.stop(proc, grace_s=30.0)
    return {"requests": len(results), "lost": results.count(False), "retried": retried, "exit_s": exit_s,
            "exit_code": code}


async def metric(session, router: str, name: str) -> float:
    async with session.get(router + "/metrics", timeout=aiohttp.ClientTimeout(total=5.0)) as r:
        return metric_sum(await r.text(), name) or 0.0


async def main_async(args) -> dict:
    redis = RedisServer()
    try:
        with Processes(env={"OMP_NUM_THREADS": "1"}) as procs:
            router = procs.server("router", "router", "--registry", redis.url, "--health-interval-s", "1",
                                  "--log-level", "WARNING")
            await procs.wait_ready(router, "/router/instances")
            async with aiohttp.ClientSession() as session:
                joins, kills = [], []
                for k in range(args.repeats):
                    joined, excluded = await join_and_kill(procs, session, redis.url, router, k)
                    joins.append(joined)
                    kills.append(excluded)
                    print(f"  join {joined:.2f} s, kill -9 -> excluded {excluded:.3f} s", file=sys.stderr)
                drained = await drain(procs, session, redis.url, router)
                print(f"  drain: {drained}", file=sys.stderr)
            procs.close(grace_s=10.0)
    finally:
        redis.stop()
    return {"join_s": joins, "join_s_median": statistics.median(joins), "kill_excluded_s": kills,
            "kill_excluded_s_median": statistics.median(kills), "drain": drained}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args(argv)
    out = asyncio.run(main_async(args))
    print(json.dumps(out, indent=2))
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
