"""Envoy's own CPU per request under settings GIE's configuration does not need, against
deploy/envoy/envoy.yaml as it is: one kvroute endpoint picker over 4 sim engines, Envoy restarted per
variant (as configured, then tuned, alternately, --pairs times), c=32 for 10 s each (as the gateway
benchmark's runs).

    python -m kvroute.benchmarks.envoy_settings [--workload stream256|whole] [--pairs 2] [--out FILE]

"tuned": no stats (stats_matcher reject_all), no stream idle timer (stream_idle_timeout 0s, reset on
every chunk), no request ids (generate_request_id false), no x-envoy-* response headers
(suppress_envoy_headers). docs/gateway.md#cost has a run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from kvroute.benchmarks import gateway as g
from kvroute.benchmarks.results import write_json
from kvroute.benchmarks.router.routers import cpu_seconds, load
from kvroute.loadgen.envoy_gateway import LocalEnvoy, replaced
from kvroute.loadgen.processes import Processes, free_port

DURATION_S, CONCURRENCY = 10.0, 32
ROUTER = '"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router'


def tuned(text: str) -> str:
    text = replaced(text, "static_resources:", "stats_config:\n  stats_matcher: {reject_all: true}\nstatic_resources:")
    text = replaced(text, "          stat_prefix: inference\n", "          stat_prefix: inference\n"
                    "          stream_idle_timeout: 0s\n          generate_request_id: false\n")
    return replaced(text, ROUTER, ROUTER + "\n              suppress_envoy_headers: true")


async def run(args) -> dict:
    rows = []
    with Processes(env={"OMP_NUM_THREADS": "1"}) as procs:
        urls = [procs.server(f"engine-{i}", *g.ENGINE_ARGS, "--instance-id", f"e{i}") for i in range(4)]
        for u in urls:
            await procs.wait_ready(u)
        port, picker = free_port(), free_port()
        kvroute = procs.start("kvroute-epp", g.kvroute_router(urls, port, "--ext-proc-port", str(picker)))
        await procs.wait_ready(f"http://127.0.0.1:{port}")
        body = g.WORKLOADS[args.workload]
        for name in ("as configured", "tuned") * args.pairs:
            envoy = LocalEnvoy(picker, edit=None if name == "as configured" else tuned).start()
            assert envoy.proc is not None
            try:
                load(envoy.url, 1, requests=50, warmup=10, body=body)
                before = (cpu_seconds(kvroute.pid), cpu_seconds(envoy.proc.pid))
                busy = load(envoy.url, args.concurrency, duration=args.duration, body=body)
                n = max(1, busy["requests"])
                row = {"envoy": name, "workload": args.workload, "rps": busy["rps"], "non_2xx": busy["non_2xx"],
                       "kvroute_cpu_us": (cpu_seconds(kvroute.pid) - before[0]) / n * 1e6,
                       "envoy_cpu_us": (cpu_seconds(envoy.proc.pid) - before[1]) / n * 1e6}
                print(f"{name:<14} {args.workload} {row['rps']:6.0f} req/s  kvroute {row['kvroute_cpu_us']:5.0f} us  "
                      f"envoy {row['envoy_cpu_us']:5.0f} us", flush=True)
                rows.append(row)
            finally:
                envoy.stop()
    return {"rows": rows, "concurrency": args.concurrency, "duration_s": args.duration}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=list(g.WORKLOADS), default="stream256")
    p.add_argument("--pairs", type=int, default=2, help="as configured, then tuned: this many times")
    p.add_argument("--out", default=None, help="write the result as JSON")
    args = p.parse_args(argv)
    args.duration, args.concurrency = DURATION_S, CONCURRENCY
    write_json(args.out, asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
