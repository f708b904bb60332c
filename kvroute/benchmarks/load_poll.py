"""What load polls cost a router: GET /load from a sim engine through aiohttp's client and through the
lean keep-alive client (router/fleet/kinds/http.py EngineHTTP, with and without `lean`), CPU per poll of
this process (user + system), polls one after another; then a router over 4 sim engines, idle (load
polls every --load-interval-s, health checks, event long polls), its CPU per second over --idle-s.

    python -m kvroute.benchmarks.load_poll [--polls 2000] [--idle-s 20] [--out load_poll.json]

A 256-token stream run serves ~150 requests a second on this machine's sim fleet, so each ms/s the
router burns idle is ~7 us of its CPU per stream (kvroute/benchmarks/gateway.py counts it in).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import aiohttp

from kvroute.benchmarks.results import write_json
from kvroute.benchmarks.router.routers import cpu_seconds
from kvroute.loadgen.processes import Processes, free_port, kvroute_argv
from kvroute.router.contract.serve import install_uvloop
from kvroute.router.fleet.kinds.http import EngineHTTP
from kvroute.router.service.upstream import Upstream

ENGINE = ("engine", "--backend", "sim", "--time-scale", "0.001", "--num-threads", "1", "--log-level", "WARNING")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_poll(http: EngineHTTP, url: str, polls: int) -> float:
    """CPU microseconds of this process per GET `url` (after a warm-up)."""
    for _ in range(50):
        await http.json(url)
    start = cpu_s()
    for _ in range(polls):
        await http.json(url)
    return (cpu_s() - start) / polls * 1e6


async def measure(engine: str, polls: int) -> dict:
    lean = Upstream()
    async with aiohttp.ClientSession() as session:
        rows = {}
        for name, http in (("aiohttp", EngineHTTP(session=session, timeout_s=2.0)),
                           ("lean", EngineHTTP(session=session, timeout_s=2.0, lean=lean))):
            rows[name] = await per_poll(http, engine + "/load", polls)
            print(f"GET /load through {name:<8} {rows[name]:6.1f} us of CPU per poll", flush=True)
    lean.close()
    return {"polls": polls, "cpu_us_per_poll": rows}


def idle_router(procs: Processes, engines: list[str], idle_s: float) -> float:
    """ms of CPU per second a router over `engines` burns with no request, after a 2 s settling."""
    port = free_port()
    router = procs.start("router", kvroute_argv("router", "--port", str(port), "--log-level", "WARNING",
                                                *[a for u in engines for a in ("--engine", u)]))
    asyncio.run(procs.wait_ready(f"http://127.0.0.1:{port}"))
    time.sleep(2.0)
    start = cpu_seconds(router.pid)
    time.sleep(idle_s)
    used = (cpu_seconds(router.pid) - start) / idle_s * 1e3
    procs.stop(router)
    print(f"router idle over 4 engines: {used:.1f} ms of CPU per second", flush=True)
    return used


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--polls", type=int, default=2000, help="polls per client")
    p.add_argument("--idle-s", type=float, default=20.0, help="seconds the idle router is measured over")
    p.add_argument("--out", default=None, help="write the result as JSON")
    args = p.parse_args(argv)
    install_uvloop()  # as the router runs
    with Processes() as procs:
        engines = [procs.server(f"engine-{i}", *ENGINE, "--instance-id", f"e{i}") for i in range(4)]
        for engine in engines:
            asyncio.run(procs.wait_ready(engine))
        result = asyncio.run(measure(engines[0], args.polls))
        result["router_idle_cpu_ms_per_s"] = idle_router(procs, engines, args.idle_s)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
