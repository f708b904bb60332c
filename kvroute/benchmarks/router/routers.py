"""The routers the latency and instruction counts compare, and the load client that drives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kvroute.loadgen.processes import free_port, kvroute_argv

# a venv with sglang-router 0.3.2 and one with vllm-router 0.1.17 (elsewhere: these environment variables)
SGLANG_ROUTER = os.environ.get("KVROUTE_SGLANG_ROUTER", "/work/venv-sglang-router/bin/python")
VLLM_ROUTER = os.environ.get("KVROUTE_VLLM_ROUTER", "/work/venv-vllm-router/bin/vllm-router")
PROMPT = ("Summarise what a KV-cache-aware router does for a fleet of LLM engines, in two sentences. " * 11)[:1024]


def sglang_router_argv(python: str, engines: list[str], port: int, policy: str) -> list[str]:
    """sglang-router (installed in the venv whose interpreter is `python`) on 127.0.0.1:`port` before `engines`."""
    return [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--log-level", "error", "--prometheus-port", str(free_port()),
            "--policy", policy]


def load(url: str, concurrency: int, requests: int | None = None, duration: float | None = None,
         warmup: int = 0, body: dict | None = None) -> dict:
    """kvroute/benchmarks/http_load.py in its own process: the client does not share the router's interpreter.
    `body`: the completion request sent (None: PROMPT, one token)."""
    text = json.dumps(body or {"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 1})
    cmd = [sys.executable, "-m", "kvroute.benchmarks.http_load", "--url", url + "/v1/completions", "--body", text,
           "--concurrency", str(concurrency), "--warmup", str(warmup)]
    cmd += ["--requests", str(requests)] if requests else ["--duration", str(duration)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"http_load failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, its threads and its live child processes (router workers)."""
    ticks, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def router_commands(engines: list[str], port: int, which: set[str]) -> dict[str, tuple[list[str], dict]]:
    """name -> (argv, extra env) for every router to compare (those installed)."""
    out: dict[str, tuple[list[str], dict]] = {}
    kv = kvroute_argv("router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
                      *[a for u in engines for a in ("--engine", u)])
    out["kvroute kv_aware"] = ([*kv], {})
    out["kvroute round_robin"] = ([*kv, "--policy", "round_robin"], {})
    out["kvroute kv_aware --workers 2"] = ([*kv, "--workers", "2"], {})
    for server in ("aiohttp", "raw"):  # no routing at all: what the HTTP server and upstream client cost
        out[f"floor: {server} server + upstream.py"] = (
            [sys.executable, "-m", "kvroute.benchmarks.proxy_floor", "--server", server, "--port", str(port),
             "--engine", engines[0]], {})
    if os.path.exists(SGLANG_ROUTER):
        for policy in ("cache_aware", "round_robin"):
            out[f"sglang-router 0.3.2 {policy}"] = (sglang_router_argv(SGLANG_ROUTER, engines, port, policy), {})
    if os.path.exists(VLLM_ROUTER):
        from kvroute.router.contract.tokenizer import DATA_DIR

        out["vllm-router 0.1.17 round_robin"] = (
            [VLLM_ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines, "--policy",
             "round_robin", "--prometheus-port", str(free_port()), "--log-level", "warning"],
            {"VLLM_ROUTER_TOKENIZER": str(DATA_DIR)})
    return {k: v for k, v in out.items() if not which or any(w in k for w in which)}
