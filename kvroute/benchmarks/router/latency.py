"""Added latency and throughput of each router against one engine direct, over loopback."""

from __future__ import annotations

from kvroute.benchmarks.router.routers import PROMPT, cpu_seconds, load, router_commands
from kvroute.loadgen.processes import Processes, free_port

ENGINE_ARGS = ("engine", "--backend", "sim", "--time-scale", "0.001", "--log-level", "WARNING")


async def latency(args) -> dict:
    """4 sim engines; per router: c=1 latency against the engine direct (measured right before,
    in the same run) and c=32 throughput; and the engine direct at c=32."""
    rows = []
    with Processes() as procs:
        urls = [procs.server(f"engine-{i}", *ENGINE_ARGS, "--instance-id", f"e{i}") for i in range(4)]
        for u in urls:
            await procs.wait_ready(u)
        direct32 = load(urls[0], args.concurrency, duration=args.duration, warmup=100)
        rows.append({"target": "one engine direct", "rps_c32": direct32["rps"], "c32": direct32})
        print(f"{'one engine direct':<34} c={args.concurrency}: {direct32['rps']:.0f} req/s", flush=True)
        which = set(args.only or ())
        for name in router_commands(urls, 0, which):
            rows.append(await measure(procs, name, urls, which, args))
    return {"latency": rows, "concurrency": args.concurrency, "requests": args.requests,
            "duration_s": args.duration, "prompt_bytes": len(PROMPT)}


async def measure(procs: Processes, name: str, urls: list[str], which: set[str], args) -> dict:
    """One router in front of the engines: c=1 against the engine direct, then throughput and CPU at c=32."""
    port = free_port()
    cmd, env = router_commands(urls, port, which)[name]
    proc = procs.start(name.replace(" ", "_").replace(":", "").replace("/", "_"), cmd, env)
    url = f"http://127.0.0.1:{port}"
    try:
        await procs.wait_ready(url, timeout_s=60.0)
        load(url, 1, requests=300, warmup=50)  # warm-up: connections, caches, JIT-free paths
        direct = load(urls[0], 1, requests=args.requests, warmup=50)
        via = load(url, 1, requests=args.requests)
        cpu0 = cpu_seconds(proc.pid)
        c32 = load(url, args.concurrency, duration=args.duration, warmup=50)
        # the warm-up requests are timed out of c32 but not out of the CPU: counted in
        cpu_us = (cpu_seconds(proc.pid) - cpu0) / (c32["requests"] + 50) * 1e6
    finally:
        procs.stop(proc, grace_s=15.0)
    row = {"target": name, "added_p50_us": (via["p50_ms"] - direct["p50_ms"]) * 1e3,
           "added_p99_us": (via["p99_ms"] - direct["p99_ms"]) * 1e3, "rps_c32": c32["rps"],
           "cpu_us_per_request_c32": cpu_us, "c1": via, "direct_c1": direct, "c32": c32}
    print(f"{name:<34} c=1 p50 {via['p50_ms']:.3f} ms (direct {direct['p50_ms']:.3f}: added "
          f"{row['added_p50_us']:+.0f} us), p99 {via['p99_ms']:.3f} (direct {direct['p99_ms']:.3f}: "
          f"added {row['added_p99_us']:+.0f} us); c={args.concurrency}: {c32['rps']:.0f} req/s, "
          f"{cpu_us:.0f} us CPU/request"
          + (f", {c32['non_2xx']} non-2xx" if c32["non_2xx"] or via["non_2xx"] else ""), flush=True)
    return row
