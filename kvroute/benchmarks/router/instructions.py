"""User-space instructions per request of each router, counted by valgrind's callgrind."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile

from kvroute.benchmarks.router.routers import load, router_commands
from kvroute.loadgen.processes import Processes, free_port, kvroute_argv

INSTRUCTION_VARIANTS = {"kv_aware": (), "round_robin": ("--policy", "round_robin")}


def callgrind_totals(pattern: str) -> int:
    total = 0
    for path in glob.glob(pattern):
        with open(path, errors="replace") as f:
            total += max((int(line.split()[1]) for line in f if line.startswith("totals:")), default=0)
    return total


def instruction_commands(engine: str, port: int) -> dict[str, tuple[list[str], dict]]:
    """name -> argv of every router counted: kvroute's variants, the no-routing floor, and the
    Rust routers where their venvs exist (the same command lines as `latency`'s)."""
    kv = kvroute_argv("router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING", "--engine",
                      engine, "--load-interval-s", "30", "--health-interval-s", "60")  # requests, not polls
    out: dict[str, tuple[list[str], dict]] = {f"kvroute {name}": ([*kv, *extra], {})
                                              for name, extra in INSTRUCTION_VARIANTS.items()}
    for name, command in router_commands([engine], port, set()).items():
        if name.startswith(("floor: raw", "sglang-router", "vllm-router")):
            out[name] = command
    return out


async def instructions(args) -> dict:
    """User-space instructions per request of each router, counted by callgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("kvroute.benchmarks.router instructions: needs valgrind (apt-get install valgrind)")
    work, rows = tempfile.mkdtemp(prefix="kvroute-callgrind-"), []
    try:
        with Processes() as procs:
            engine = procs.server("engine", "engine", "--backend", "sim", "--instance-id", "e0", "--time-scale",
                                  "0.001", "--log-level", "WARNING")
            await procs.wait_ready(engine)
            for name in instruction_commands(engine, 0):
                if not args.only or any(w in name for w in args.only):
                    rows.append(await count(procs, name, engine, os.path.join(work, file_name(name)), args.requests))
    finally:
        if os.environ.get("KVROUTE_KEEP_CALLGRIND"):
            print(f"callgrind files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {"instructions": rows, "requests": args.requests, "concurrency": 8}


def file_name(router: str) -> str:
    return router.replace(" ", "_").replace(":", "").replace("/", "_")


async def count(procs: Processes, name: str, engine: str, out: str, requests: int) -> dict:
    """One router under callgrind: instrumentation on for `requests` requests after a warm-up, then dumped."""
    port = free_port()
    argv, env = instruction_commands(engine, port)[name]
    callgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]
    proc = procs.start(file_name(name), [*callgrind, *argv], env)
    try:
        url = f"http://127.0.0.1:{port}"
        await procs.wait_ready(url, timeout_s=300.0)
        load(url, 8, requests=100)
        for command in (("-i", "on"), None, ("-i", "off"), ("-d",)):
            if command is None:
                load(url, 8, requests=requests)
            else:
                subprocess.run(["callgrind_control", *command, str(proc.pid)], capture_output=True, check=True)
    finally:
        procs.stop(proc, grace_s=60.0)
    per = callgrind_totals(out + ".*") / requests
    print(f"{name:<40} {per / 1e6:.3f} M user-space instructions per request", flush=True)
    return {"router": name, "instructions_per_request": per}
