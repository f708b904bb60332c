"""Router benchmarks: decision time, and added latency / throughput over loopback.

    python tools/bench_router.py decision --out decision.json
    python tools/bench_router.py latency --out latency.json [--requests 2000] [--concurrency 32] [--only kvroute]
    python tools/bench_router.py instructions --out instructions.json [--requests 300]

decision: the router's own prepare (limits, tokenize, hash) and decide (index lookup, candidates,
kv_aware scoring, on_routed, all before the request is sent: "after the send" is 0 since the
decide stage records its choice itself, router/service/request_path.py), in process: 8k- and 32k-token chats whose system prompt was seen
before, never-seen 8k-token completions, memory and Redis index at 64 instances (alternately tokenized
in place, as an idle router does, and through the tokenizer pool, as with other requests in flight);
token-id prompts at 64 and 1,024 instances. For never-seen prompts, the router's own work is prepare + decide less
the time spent inside the tokenizer's encode calls of the same request (timed around them, reading
the ids included), and,
as a cross-check, less the same text encoded alone right before (noisier: two separate timings).
latency: 4 sim engines (near-zero model time); 1 KB non-streamed completions from a lean
closed-loop client (tools/http_load.py, its own process); per router (kvroute kv_aware,
round_robin, --workers 2; sglang-router and vllm-router from their own venvs when
installed): c=1 latency against one engine direct, measured right before in the same
run (added = difference of the p50s and of the p99s), and requests/s at --concurrency.
instructions: one sim engine; each kvroute router variant, the no-routing floor (a raw asyncio
server + router/service/upstream.py) and the Rust routers where installed, under valgrind's
callgrind, counting the user-space instructions of --requests requests (300) at concurrency 8
after a warm-up, startup and load/health polls excluded: a figure that other load on the machine
does not move (kernel time, the syscalls, is not in it). Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, ".")

import aiohttp  # noqa: E402

from kvroute.loadgen.redis_server import RedisServer, free_port  # noqa: E402
from tools.procs import spawn, wait_ready, write_json  # noqa: E402

WORDS = "the router hashes blocks of tokens and sends each request where its prefix is cached".split()


def text_of(tokens_wanted: int, tokenizer) -> str:
    words, text = [], ""
    i = 0
    while True:
        words.append(WORDS[i % len(WORDS)] + str(i % 97))
        i += 1
        if i % 64 == 0:
            text = " ".join(words)
            if len(tokenizer.encode(text)) >= tokens_wanted:
                return text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def make_router(tok, index, n_inst: int, max_model_len: int = 131072):
    from kvroute.router.contract.protocol import hash_seed
    from kvroute.router.decision.policies import make_policy
    from kvroute.router.fleet.cluster import Cluster
    from kvroute.router.fleet.instance import EngineInfo
    from kvroute.router.service.config import RouterConfig
    from kvroute.router.service.metrics import RouterMetrics
    from kvroute.router.service.routing import Router

    model = "kvroute-tiny"
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(n_inst))
    cluster = Cluster(RouterConfig(engines=urls), index, tok.fingerprint, RouterMetrics())
    for i, inst in enumerate(cluster.instances):
        inst.info = EngineInfo(f"e{i}", model, 16, hash_seed(model), tok.fingerprint, max_model_len=max_model_len,
                               vocab_size=tok.vocab_size)
        inst.healthy = inst.reachable = True
    cluster.check_compatibility()
    return Router(cluster, make_policy("kv_aware"), tok, RouterMetrics(), "kv_aware")


class _Read:
    """A tokenizers.Encoding whose ids were read (a Python list made) inside the timed call."""

    def __init__(self, encoding) -> None:
        self.encoding, self.ids = encoding, encoding.ids

    def __getattr__(self, name):
        return getattr(self.encoding, name)


class TimedBackend:
    """A tokenizers.Tokenizer that adds the time spent in its encode calls, reading their ids
    included (what `tokenizer.encode(text).ids` costs a caller), to `seconds`."""

    def __init__(self, backend) -> None:
        self.backend, self.seconds = backend, 0.0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def encode(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return _Read(self.backend.encode(*args, **kwargs))
        finally:
            self.seconds += time.perf_counter() - t0

    def encode_batch_fast(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return [_Read(e) for e in self.backend.encode_batch_fast(*args, **kwargs)]
        finally:
            self.seconds += time.perf_counter() - t0


def timed_tokenizer(tok):
    """`tok` with every encode it does (in full or through the segment cache) timed by one TimedBackend."""
    import dataclasses

    timed = TimedBackend(tok.backend)
    if tok.segments is not None:
        tok.segments.backend = timed
    return dataclasses.replace(tok, backend=timed), timed


async def hold_prefixes(index, ids: list[int], holders: int) -> None:
    """`holders` instances hold growing shares of the prompt's prefix; the rest hold nothing."""
    from kvroute.router.contract.protocol import block_hashes, hash_seed

    hashes = block_hashes(ids, 16, hash_seed("kvroute-tiny"))
    for i in range(holders):
        await index.add(f"e{i}", "device", hashes[: len(hashes) * (i + 1) // holders])


async def time_decisions(router, bodies, kind: str) -> tuple[list[float], list[float], list[float]]:
    """Per body: (prepare = limits + tokenize + hash, decide = lookup + candidates + score + the policy
    learning its choice, the part after the send: none since the decide stage records its choice
    before the request is sent, router/service/request_path.py), seconds."""
    prep, dec, after = [], [], []
    for body in bodies:
        t0 = time.perf_counter()
        prepared = await router.prepare(body, kind)
        t1 = time.perf_counter()
        choice = await router.decide(prepared, record=True)  # recorded before the send: nothing after it
        t2 = t3 = time.perf_counter()
        dec.append(t3 - t1)
        prep.append(t1 - t0)
        after.append(t3 - t2)
        router.policy.on_finished(prepared.route, choice.instance.id)
    return prep, dec, after


def scenario(name, index_name, n_inst, tokens, prep, dec, after, alone=None) -> dict:
    total = [a + b for a, b in zip(prep, dec)]
    row = {"scenario": name, "index": index_name, "instances": n_inst, "prompt_tokens": tokens,
           "median_ms": statistics.median(total) * 1e3, "p99_ms": pct(total, 0.99) * 1e3,
           "prepare_median_ms": statistics.median(prep) * 1e3, "decide_median_ms": statistics.median(dec) * 1e3,
           "after_send_median_ms": statistics.median(after) * 1e3}
    if alone is not None:
        row["tokenizer_alone_median_ms"] = statistics.median(alone) * 1e3
    print(f"{name:<34} {index_name:<6} {n_inst:>5} inst {tokens:>6} tok: median {row['median_ms']:.3f} ms "
          f"(prepare {row['prepare_median_ms']:.3f} + decide {row['decide_median_ms']:.3f}, of which "
          f"{row['after_send_median_ms']:.3f} after the send), "
          f"p99 {row['p99_ms']:.3f}" + (f", tokenizer alone {row['tokenizer_alone_median_ms']:.3f} ms"
                                         if alone else ""), flush=True)
    return row


def never_seen(name: str, index_name: str, tokens: int,
               runs: list[tuple[float, float, float, float, float]]) -> dict:
    """A never-seen row from (tokenizer alone, inside its calls, prepare, decide, after the send) per prompt."""
    alone, inside, prep, dec, after = map(list, zip(*runs))
    row = scenario(name, index_name, 64, tokens, prep, dec, after, alone)
    row["tokenizer_inside_median_ms"] = statistics.median(inside) * 1e3
    row["own_median_ms"] = statistics.median(p + d - i for p, d, i in zip(prep, dec, inside)) * 1e3
    row["over_tokenizer_median_ms"] = statistics.median(p + d - a for p, d, a in zip(prep, dec, alone)) * 1e3
    print(f"{'':<34} the router's own work (outside its encode calls): median {row['own_median_ms']:.3f} ms; "
          f"per pair, over the tokenizer alone: median {row['over_tokenizer_median_ms']:+.3f} ms", flush=True)
    return row


async def decision(args) -> dict:
    from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer
    from kvroute.router.index import make_index

    redis = RedisServer()
    rows = []
    try:
        for index_name in ("memory", "redis"):
            for n_tokens in (8192, 32768):  # a chat whose long system prompt was seen before
                tok = load_tokenizer(DATA_DIR)  # fresh cache
                index = make_index(index_name, url=redis.url)
                router = make_router(tok, index, 64)
                system = {"role": "system", "content": text_of(n_tokens, tok)}
                first = [system, {"role": "user", "content": "question 0"}]
                await hold_prefixes(index, tok.encode_chat(first), 8)
                await router.prepare({"messages": first, "max_tokens": 1}, "chat")  # the system prompt is seen
                bodies = [{"messages": [system, {"role": "user", "content": f"question {i} about caches"}],
                           "max_tokens": 1} for i in range(args.reps)]
                prep, dec, after = await time_decisions(router, bodies, "chat")
                rows.append(scenario("chat, system prompt seen before", index_name, 64,
                                     len(tok.encode_chat(bodies[0]["messages"])), prep, dec, after))
                await index.close()
            tok, timed = timed_tokenizer(load_tokenizer(DATA_DIR))
            index = make_index(index_name, url=redis.url)
            router = make_router(tok, index, 64)
            texts = [f"fresh prompt {i}: " + text_of(8192, tok) for i in range(2 * args.reps)]
            places = {"in place": [], "through the pool": []}  # per prompt: (alone, inside, prepare, decide)
            in_place = router.pool.idle_inline_chars
            for i, t in enumerate(texts):  # interleaved: both sides see the same machine
                place = "through the pool" if i % 2 else "in place"  # an idle router tokenizes in place
                router.pool.idle_inline_chars = 0 if i % 2 else in_place
                t0 = time.perf_counter()
                timed.backend.encode_batch_fast([t], add_special_tokens=False)  # the tokenizer's fastest call
                alone = time.perf_counter() - t0
                before = timed.seconds
                p, d, a = await time_decisions(router, [{"prompt": t, "max_tokens": 1}], "completion")
                places[place].append((alone, timed.seconds - before, p[0], d[0], a[0]))
            for place, runs in places.items():
                rows.append(never_seen(f"completion, never seen, {place}", index_name, len(tok.encode(texts[0])),
                                       runs))
            await index.close()
        for n_inst in (64, 1024):  # a 1k-token prompt, holders among many instances (memory index)
            tok = load_tokenizer(DATA_DIR)
            index = make_index("memory")
            router = make_router(tok, index, n_inst)
            base = text_of(1024, tok)
            await hold_prefixes(index, tok.encode(base), 8)
            bodies = [{"prompt": [*tok.encode(base), 5 + i % 50, 6, 7], "max_tokens": 1} for i in range(args.reps)]
            prep, dec, after = await time_decisions(router, bodies, "completion")
            rows.append(scenario("token ids, 8 holders", "memory", n_inst, len(bodies[0]["prompt"]), prep, dec,
                                 after))
    finally:
        redis.stop()
    return {"decision": rows}


SGLANG_ROUTER = "/work/venv-sglang-router/bin/python"  # a venv with sglang-router 0.3.2
VLLM_ROUTER = "/work/venv-vllm-router/bin/vllm-router"  # a venv with vllm-router 0.1.17
PROMPT = ("Summarise what a KV-cache-aware router does for a fleet of LLM engines, in two sentences. " * 11)[:1024]


def load(url: str, concurrency: int, requests: int | None = None, duration: float | None = None,
         warmup: int = 0) -> dict:
    """tools/http_load.py in its own process: the client does not share the router's interpreter."""
    body = json.dumps({"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 1})
    cmd = [sys.executable, "tools/http_load.py", "--url", url + "/v1/completions", "--body", body,
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
    out = {}
    kv = [sys.executable, "-m", "kvroute.router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
          *[a for u in engines for a in ("--engine", u)]]
    out["kvroute kv_aware"] = ([*kv], {})
    out["kvroute round_robin"] = ([*kv, "--policy", "round_robin"], {})
    out["kvroute kv_aware --workers 2"] = ([*kv, "--workers", "2"], {})
    for server in ("aiohttp", "raw"):  # no routing at all: what the HTTP server and upstream client cost
        out[f"floor: {server} server + upstream.py"] = (
            [sys.executable, "tools/proxy_floor.py", "--server", server, "--port", str(port), "--engine", engines[0]], {})
    if os.path.exists(SGLANG_ROUTER):
        sg = [SGLANG_ROUTER, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
              "--worker-urls", *engines, "--log-level", "error", "--prometheus-port", str(free_port())]
        out["sglang-router 0.3.2 cache_aware"] = ([*sg, "--policy", "cache_aware"], {})
        out["sglang-router 0.3.2 round_robin"] = ([*sg, "--policy", "round_robin"], {})
    if os.path.exists(VLLM_ROUTER):
        from kvroute.router.contract.tokenizer import DATA_DIR

        out["vllm-router 0.1.17 round_robin"] = (
            [VLLM_ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines, "--policy",
             "round_robin", "--prometheus-port", str(free_port()), "--log-level", "warning"],
            {"VLLM_ROUTER_TOKENIZER": str(DATA_DIR)})
    return {k: v for k, v in out.items() if not which or any(w in k for w in which)}


async def latency(args) -> dict:
    """4 sim engines; per router: c=1 latency against the engine direct (measured right before,
    in the same run) and c=32 throughput; and the engine direct at c=32."""
    ports = [free_port() for _ in range(4)]
    engines = [spawn(["engine", "--backend", "sim", "--port", str(p), "--instance-id", f"e{i}", "--time-scale",
                      "0.001", "--log-level", "WARNING"]) for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    rows = []
    try:
        async with aiohttp.ClientSession() as session:
            for u in urls:
                await wait_ready(session, u)
            direct32 = load(urls[0], args.concurrency, duration=args.duration, warmup=100)
            rows.append({"target": "one engine direct", "rps_c32": direct32["rps"], "c32": direct32})
            print(f"{'one engine direct':<34} c={args.concurrency}: {direct32['rps']:.0f} req/s", flush=True)
            which = set(args.only or ())
            for name in router_commands(urls, 0, which):
                port = free_port()
                cmd, env = router_commands(urls, port, which)[name]
                proc = subprocess.Popen(cmd, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                url = f"http://127.0.0.1:{port}"
                try:
                    await wait_ready(session, url, "/health", tries=600)
                    load(url, 1, requests=300, warmup=50)  # warm-up: connections, caches, JIT-free paths
                    direct = load(urls[0], 1, requests=args.requests, warmup=50)
                    via = load(url, 1, requests=args.requests)
                    cpu0 = cpu_seconds(proc.pid)
                    c32 = load(url, args.concurrency, duration=args.duration, warmup=50)
                    # the warm-up requests are timed out of c32 but not out of the CPU: counted in
                    cpu_us = (cpu_seconds(proc.pid) - cpu0) / (c32["requests"] + 50) * 1e6
                finally:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                row = {"target": name, "added_p50_us": (via["p50_ms"] - direct["p50_ms"]) * 1e3,
                       "added_p99_us": (via["p99_ms"] - direct["p99_ms"]) * 1e3, "rps_c32": c32["rps"],
                       "cpu_us_per_request_c32": cpu_us,
                       "c1": via, "direct_c1": direct, "c32": c32}
                rows.append(row)
                print(f"{name:<34} c=1 p50 {via['p50_ms']:.3f} ms (direct {direct['p50_ms']:.3f}: added "
                      f"{row['added_p50_us']:+.0f} us), p99 {via['p99_ms']:.3f} (direct {direct['p99_ms']:.3f}: "
                      f"added {row['added_p99_us']:+.0f} us); c={args.concurrency}: {c32['rps']:.0f} req/s, "
                      f"{cpu_us:.0f} us CPU/request"
                      + (f", {c32['non_2xx']} non-2xx" if c32["non_2xx"] or via["non_2xx"] else ""), flush=True)
    finally:
        for e in engines:
            e.terminate()
            e.wait()
    return {"latency": rows, "concurrency": args.concurrency, "requests": args.requests,
            "duration_s": args.duration, "prompt_bytes": len(PROMPT)}


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
    kv = [sys.executable, "-m", "kvroute.router", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
          "--engine", engine, "--load-interval-s", "30", "--health-interval-s", "60"]  # requests, not polls
    out = {f"kvroute {name}": ([*kv, *extra], {}) for name, extra in INSTRUCTION_VARIANTS.items()}
    for name, command in router_commands([engine], port, set()).items():
        if name.startswith(("floor: raw", "sglang-router", "vllm-router")):
            out[name] = command
    return out


def under_callgrind(out: str, argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
                             *argv], env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def instructions(args) -> dict:
    """User-space instructions per request of each router, counted by callgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench_router instructions: needs valgrind (apt-get install valgrind)")
    port = free_port()
    engine = spawn(["engine", "--backend", "sim", "--port", str(port), "--instance-id", "e0", "--time-scale", "0.001",
                    "--log-level", "WARNING"])
    work, rows = tempfile.mkdtemp(prefix="kvroute-callgrind-"), []
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, f"http://127.0.0.1:{port}")
            engine_url = f"http://127.0.0.1:{port}"
            for name in instruction_commands(engine_url, 0):
                if args.only and not any(w in name for w in args.only):
                    continue
                rport = free_port()
                argv, env = instruction_commands(engine_url, rport)[name]
                out = os.path.join(work, name.replace(" ", "_").replace(":", "").replace("/", "_"))
                proc = under_callgrind(out, argv, env)
                try:
                    url = f"http://127.0.0.1:{rport}"
                    await wait_ready(session, url, "/health", tries=3000)
                    load(url, 8, requests=100)
                    for command in (("-i", "on"), None, ("-i", "off"), ("-d",)):
                        if command is None:
                            load(url, 8, requests=args.requests)
                        else:
                            subprocess.run(["callgrind_control", *command, str(proc.pid)], capture_output=True,
                                           check=True)
                finally:
                    proc.terminate()
                    proc.wait(60)
                per = callgrind_totals(out + ".*") / args.requests
                rows.append({"router": name, "instructions_per_request": per})
                print(f"{name:<40} {per / 1e6:.3f} M user-space instructions per request", flush=True)
    finally:
        engine.terminate()
        engine.wait()
        if os.environ.get("KVROUTE_KEEP_CALLGRIND"):
            print(f"callgrind files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {"instructions": rows, "requests": args.requests, "concurrency": 8}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("decision", "latency", "instructions"))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--requests", type=int, default=None,
                   help="latency: requests at concurrency 1 (2000); instructions: requests counted (300)")
    p.add_argument("--concurrency", type=int, default=32, help="latency: connections for the throughput run")
    p.add_argument("--duration", type=float, default=10.0, help="latency: seconds of the throughput run")
    p.add_argument("--only", action="append",
                   help="latency, instructions: only routers whose name contains this (repeatable)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.requests is None:
        args.requests = 300 if args.what == "instructions" else 2000
    run = {"decision": decision, "latency": latency, "instructions": instructions}[args.what]
    result = asyncio.run(run(args))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
