"""`python -m kvroute.benchmarks.router decision|latency|instructions [--out FILE]` (kvroute/benchmarks/router/)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from kvroute.benchmarks import router
from kvroute.benchmarks.results import write_json
from kvroute.benchmarks.router.decision import decision
from kvroute.benchmarks.router.instructions import instructions
from kvroute.benchmarks.router.latency import latency

RUN = {"decision": decision, "latency": latency, "instructions": instructions}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvroute.benchmarks.router", description=router.__doc__.splitlines()[0])
    p.add_argument("what", choices=tuple(RUN))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--requests", type=int, default=None,
                   help="latency: requests at concurrency 1 (2000); instructions: requests counted (300)")
    p.add_argument("--concurrency", type=int, default=32, help="latency: connections for the throughput run")
    p.add_argument("--duration", type=float, default=10.0, help="latency: seconds of the throughput run")
    p.add_argument("--only", action="append",
                   help="latency, instructions: only routers whose name contains this (repeatable)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.requests is None:
        args.requests = 300 if args.what == "instructions" else 2000
    write_json(args.out, asyncio.run(RUN[args.what](args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
