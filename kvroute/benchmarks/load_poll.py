"""What one load poll costs the router's process: GET /load from a sim engine through aiohttp's client
and through the lean keep-alive client (router/fleet/kinds/http.py EngineHTTP, with and without `lean`),
CPU per poll of this process (user + system), polls one after another.

    python -m kvroute.benchmarks.load_poll [--polls 2000] [--out load_poll.json]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys

import aiohttp

from kvroute.benchmarks.results import write_json
from kvroute.loadgen.processes import Processes
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
        for name, http in (("aiohttp", EngineHTTP(session, 2.0)), ("lean", EngineHTTP(session, 2.0, lean))):
            rows[name] = await per_poll(http, engine + "/load", polls)
            print(f"GET /load through {name:<8} {rows[name]:6.1f} us of CPU per poll", flush=True)
    lean.close()
    return {"polls": polls, "cpu_us_per_poll": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--polls", type=int, default=2000, help="polls per client")
    p.add_argument("--out", default=None, help="write the result as JSON")
    args = p.parse_args(argv)
    with Processes() as procs:
        engine = procs.server("engine-0", *ENGINE, "--instance-id", "e0")
        asyncio.run(procs.wait_ready(engine))
        install_uvloop()
        write_json(args.out, asyncio.run(measure(engine, args.polls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
