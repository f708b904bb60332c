"""The engine on its device, in one command, with nothing downloaded.

    python tools/gpu_check.py --out DIR                                  # CUDA, the 3B shape, bf16
    python tools/gpu_check.py --out DIR --device cpu --shape tiny [--quick]

Writes a checkpoint of random weights of a realistic shape (`--shape`, SHAPES below) with the
built-in tokenizer to DIR/model, then measures, each step writing DIR/gpu_check.json as it ends
(a run cut short keeps what it measured):

    memcpy    a plain pinned host<->device copy, GB/s each way: the ceiling for every copy below
    prefill   the runner's step (TorchRunner.execute_sync) on one prompt with 0, half and all but
              one block cached; all cached also right after a cold prompt (what a served repeat sees)
    decode    the runner's decode step at batch 1, 16 and 64 (CUDA graphs, and eager for comparison)
    serving   an engine over HTTP: TTFT of prompts of 1,024, the prefill step's and 4,096 tokens sent
              cold then again; the repeat against the runner's step (the serving overhead), and
              the engine's own step time for it
    bench     kvroute bench, 4 engines: round_robin, prefix_hash, kv_aware (TTFT, TPOT)
    tiers     kvroute bench --tiers: the session storm with device only, + host, + host + Redis
    pd_pull   a prefill and a decode engine behind a router that disaggregates: the pull's GB/s

Sized for at most 8 minutes on one H200-class GPU with the 3B shape (steps not started within
--budget-s are skipped; not yet run on a GPU); `--device cpu --shape tiny` runs the same steps in
under 3 minutes (128 s on a loaded 2-core machine); `--quick` takes every step at its smallest (one engine per cluster,
kv_aware alone, the storm with device only and host + Redis), as the test suite runs it.
docs/engine.md#the-device-check says how to read the result.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB, MAX_POS = 8192, 8192  # the built-in tokenizer's vocabulary
SHAPES = {  # hidden, layers, heads, KV heads, intermediate, dtype
    "tiny": (256, 2, 4, 2, 768, "float32"),
    "1b": (2048, 16, 32, 8, 8192, "bfloat16"),
    "3b": (3072, 28, 24, 8, 8192, "bfloat16"),
    "8b": (4096, 32, 32, 8, 14336, "bfloat16"),
}
STEPS = ("memcpy", "prefill", "decode", "serving", "bench", "tiers", "pd_pull")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How big each step is: by device and --quick."""

    prompt: int  # tokens of the prefill and serving prompt
    decode_context: int
    decode_steps: int
    reps: int
    memcpy_mib: int
    engines: int
    bench: tuple[str, ...]  # kvroute bench sizing flags
    storm: tuple[str, ...]  # kvroute bench --tiers sizing flags
    pulls: int
    quick: bool = False
    policies: str = "round_robin,prefix_hash,kv_aware"
    tier_runs: str = "device,host,host+redis"


def plan_for(device: str, quick: bool) -> Plan:
    if device.startswith("cuda"):
        return Plan(4096, 1024, 32, 5, 1024, 4, ("--num-requests", "120", "--rate", "12"),
                    ("--num-blocks", "512", "--host-blocks", "2048"), 8)
    if not quick:
        return Plan(2048, 512, 16, 5, 256, 4, ("--num-requests", "40", "--rate", "8"),
                    ("--num-blocks", "256", "--host-blocks", "2048", "--sessions", "12", "--burst", "12",
                     "--idle-requests", "16", "--idle-rate", "16"), 4)
    return Plan(1024, 128, 4, 2, 32, 1, ("--num-requests", "4", "--rate", "8", "--groups", "2",
                                           "--prefix-tokens", "512", "--output-tokens", "4"),
                ("--num-blocks", "64", "--host-blocks", "256", "--sessions", "3", "--burst", "3",
                 "--context-tokens", "768", "--min-context-tokens", "512", "--idle-requests", "4",
                 "--idle-tokens", "512", "--idle-rate", "20", "--session-rate", "20", "--output-tokens", "4",
                 "--gap", "0.5", "--burst-spread", "0.2"), 2,
                quick=True, policies="kv_aware", tier_runs="device,host+redis")  # every step, the fewest processes


# -- the checkpoint ---------------------------------------------------------------------------------

def write_checkpoint(model_dir: Path, shape: str, device: str, seed: int = 0) -> dict:
    """config.json, model.safetensors (random weights, drawn on the device) and the built-in tokenizer."""
    import torch
    from safetensors.torch import save_file

    from kvroute.router.contract.tokenizer import DATA_DIR

    hidden, layers, heads, kv_heads, inter, dtype = SHAPES[shape]
    hd = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": hd, "intermediate_size": inter, "vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": dtype}
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (VOCAB, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (heads * hd, hidden),
                   p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
                   p + "self_attn.v_proj.weight": (kv_heads * hd, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * hd),
                   p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, size in shapes.items():
        t = torch.ones(size, device=device) if name.endswith("norm.weight") else \
            torch.randn(size, generator=gen, device=device) * 0.02
        tensors[name] = t.to(getattr(torch, dtype)).cpu()
    model_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    for f in DATA_DIR.iterdir():
        shutil.copy(f, model_dir / f.name)
    return {"shape": shape, "params": sum(t.numel() for t in tensors.values()), "dtype": dtype, **config}


# -- in process: the copy ceiling, the runner ------------------------------------------------------------

def timed(fn, reps: int, sync=lambda: None) -> float:
    """Median seconds of `fn` over `reps` runs after a warm-up."""
    fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def step_memcpy(ctx) -> dict:
    import torch

    n = ctx.plan.memcpy_mib << 20
    cuda = ctx.device.startswith("cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(n, dtype=torch.uint8, device=ctx.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    h2d = timed(lambda: dev.copy_(host, non_blocking=True), ctx.plan.reps, sync)
    d2h = timed(lambda: host.copy_(dev, non_blocking=True), ctx.plan.reps, sync)
    return {"bytes": n, "h2d_gb_s": n / h2d / 1e9, "d2h_gb_s": n / d2h / 1e9, "pinned": cuda}


def prompt(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(5, VOCAB) for _ in range(n)]


def step_prefill(ctx) -> dict:
    from kvroute.engine.core.work import SamplingParams, SeqWork

    runner, p, bs, rng = ctx.runner(), ctx.plan.prompt, 16, random.Random(1)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    tokens, table = prompt(p, rng), tuple(range(p // bs + 1))
    runner.execute_sync([SeqWork(0, tuple(tokens), 0, table, True, greedy)])
    out = {"prompt_tokens": p}
    for cached in (0, p // 2, p - bs):
        work = SeqWork(0, tuple(tokens[cached:]), cached, table, True, greedy)
        out[f"step_ms_{cached}_cached"] = timed(lambda: runner.execute_sync([work]), ctx.plan.reps) * 1e3
    out["step_ms_all_cached_after_cold"] = statistics.median(
        repeat_step_s(runner, p, rng) for _ in range(ctx.plan.reps)) * 1e3
    return out


def repeat_step_s(runner, n: int, rng: random.Random) -> float:
    """A cold `n`-token prompt, then the step of its repeat (all but the last block cached), timed:
    what the runner does for a served repeat, with the caches as a served repeat finds them."""
    from kvroute.engine.core.work import SamplingParams, SeqWork

    greedy, bs = SamplingParams(max_tokens=1, temperature=0.0), 16
    tokens, table = prompt(n, rng), tuple(range(n // bs + 1))
    runner.execute_sync([SeqWork(1, tuple(tokens), 0, table, True, greedy)])
    t0 = time.perf_counter()
    runner.execute_sync([SeqWork(1, tuple(tokens[n - bs:]), n - bs, table, True, greedy)])
    return time.perf_counter() - t0


def step_decode(ctx) -> dict:
    from kvroute.engine.core.work import SamplingParams, SeqWork

    runner, bs, c, rng = ctx.runner(), 16, ctx.plan.decode_context, random.Random(2)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    per = -(-(c + ctx.plan.decode_steps + 1) // bs)
    out = {"context_tokens": c, "graphs_captured": runner.num_graphs}
    for batch in (1, 16, 64):
        tables = [tuple(range(i * per, (i + 1) * per)) for i in range(batch)]
        for i in range(0, batch, 4):  # the contexts, a few sequences per step
            runner.execute_sync([SeqWork(j, tuple(prompt(c, rng)), 0, tables[j], True, greedy)
                                 for j in range(i, min(i + 4, batch))])
        for mode in ("graphs", "eager") if runner.graphs is not None else ("eager",):
            graphs, runner.graphs = runner.graphs, runner.graphs if mode == "graphs" else None
            works = [[SeqWork(j, (7,), c + s, tables[j], True, greedy) for j in range(batch)]
                     for s in range(ctx.plan.decode_steps)]
            runner.execute_sync(works[0])  # warm-up
            t0 = time.perf_counter()
            for w in works:
                runner.execute_sync(w)
            out[f"batch_{batch}_{mode}_ms"] = (time.perf_counter() - t0) / len(works) * 1e3
            runner.graphs = graphs
    return out


# -- over processes: an engine, kvroute bench, a disaggregated pair -------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """kvroute processes started from the repository (so its code runs), logs under DIR/logs, all stopped at exit."""

    def __init__(self, ctx) -> None:
        self.ctx, self.procs = ctx, []
        self.env = dict(os.environ, KVROUTE_KV_SECRET=os.urandom(16).hex())  # signs the router's transfer grants

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.ctx.out / "logs" / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=self.env)
        self.procs.append(proc)
        return proc

    def engine(self, name: str, *args: str) -> str:
        port = free_port()
        self.start(name, "engine", "--port", str(port), "--instance-id", name, "--log-level", "INFO",
                   *self.ctx.engine_args, *args)
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def wait_ready(session, url: str, timeout_s: float = 300.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not come up within {timeout_s:.0f} s (see the logs)")


async def routable(session, router: str, n: int, timeout_s: float = 120.0) -> None:
    """Wait until the router routes to `n` engines (it has seen their roles and caches)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(router + "/router/instances") as r:
            if sum(i.get("routable", False) for i in (await r.json())["instances"]) >= n:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the router at {router} did not route to {n} engines within {timeout_s:.0f} s")


async def first_token(session, url: str, ids: list[int], max_tokens: int = 1) -> float:
    """Seconds from sending a streamed completion (its body encoded beforehand) to its first token."""
    body = json.dumps({"prompt": ids, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                ttft = time.perf_counter() - t0
                async for _ in r.content:
                    pass
                return ttft
    raise RuntimeError(f"{url} streamed no token")


async def metric_sums(session, url: str, *names: str) -> dict[str, float]:
    out = dict.fromkeys(names, 0.0)
    async with session.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


async def served(session, url: str, n: int, reps: int, rng: random.Random) -> dict:
    """Median TTFT of `n`-token prompts sent cold then again, and the engine's own step time for the repeat."""
    step = "kvroute_engine_step_seconds_sum"
    cold, warm, in_engine = [], [], []
    for _ in range(reps):
        ids = prompt(n, rng)
        cold.append(await first_token(session, url, ids))
        before = (await metric_sums(session, url, step))[step]
        warm.append(await first_token(session, url, ids))
        in_engine.append((await metric_sums(session, url, step))[step] - before)
    c, w, e = (statistics.median(x) * 1e3 for x in (cold, warm, in_engine))
    return {"cold_ttft_ms": c, "served_ttft_ms": w, "cold_over_warm": c / w, "engine_step_ms": e,
            "outside_engine_step_ms": w - e}


async def serving(ctx) -> dict:
    """Served TTFT by prompt length; for the prefill step's prompt, each served repeat paired with the runner's
    step for the same case right before it (so load on the machine weighs on both alike)."""
    import aiohttp

    rng, p, runner, reps = random.Random(3), ctx.plan.prompt, ctx.runner(), max(ctx.plan.reps, 3)
    lengths = sorted({1024, p} | ({4096} if not ctx.plan.quick else set()))
    with Procs(ctx) as procs:
        url = procs.engine("serving", "--num-blocks", str(4 * max(lengths) // 16))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            await wait_ready(session, url)
            for n in lengths:  # first-use costs (allocations that grow to each size) out of the figures
                await served(session, url, n, 1, rng)
            rows = {n: await served(session, url, n, reps, rng) for n in lengths}
            pairs = []
            for _ in range(reps):
                step_ms = repeat_step_s(runner, p, rng) * 1e3
                pairs.append((step_ms, (await served(session, url, p, 1, rng))["served_ttft_ms"]))
    ctx.close_runner()
    step_ms, served_ms = (statistics.median(x) for x in zip(*pairs))
    return {**{f"prompt_{n}": row for n, row in rows.items()}, "prompt_tokens": p, "served_ttft_ms": served_ms,
            "runner_step_ms": step_ms, "overhead_ms": statistics.median(b - a for a, b in pairs),
            "cold_over_warm": rows[max(lengths)]["cold_over_warm"]}


def kvroute_bench(ctx, name: str, *args: str) -> list[dict]:
    out = ctx.out / name
    shutil.rmtree(out, ignore_errors=True)
    engine_args = [f"--engine-arg={a}" for a in ctx.engine_args]
    with Procs(ctx) as procs:
        proc = procs.start(name, "kvroute", "bench", "--backend", "torch", "--engines", str(ctx.plan.engines),
                           "--no-progress", "--out", str(out), *engine_args, *args)
        if proc.wait() != 0:
            raise RuntimeError(f"kvroute bench ({name}) failed: see {ctx.out / 'logs' / (name + '.log')}")
    return json.loads((out / "results.json").read_text())


def step_bench(ctx) -> dict:
    runs = kvroute_bench(ctx, "bench", "--policies", ctx.plan.policies, *ctx.plan.bench)
    return {r["name"]: {k: r.get(k) for k in ("requests", "errors", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
                                              "cached_token_ratio")} for r in runs}


def step_tiers(ctx) -> dict:
    runs = kvroute_bench(ctx, "tiers", "--tiers", "--tier-runs", ctx.plan.tier_runs, *ctx.plan.storm)
    device = runs[0]["ttft_p90_s"]
    out = {}
    for r in runs:
        t = r.get("tiers") or {}
        out[r["name"]] = {"storm_ttft_p90_s": r["ttft_p90_s"], "p90_over_device": r["ttft_p90_s"] / device,
                          "errors": r["all_errors"], "outputs_equal_device": r.get("outputs_equal_device"),
                          "storm_requests": r["requests"], "gb_per_s": t.get("gb_per_s"), "bytes": t.get("bytes"),
                          "recovery_moved_over_needed": t.get("recovery_moved_over_needed")}
    return out


async def pd_pull(ctx) -> dict:
    import aiohttp

    names = ("kvroute_engine_kv_pull_bytes_total", "kvroute_engine_kv_pull_seconds_sum",
             "kvroute_engine_kv_pull_seconds_count")
    rng = random.Random(4)
    with Procs(ctx) as procs:
        prefill = procs.engine("prefill", "--role", "prefill")
        decode = procs.engine("decode", "--role", "decode")
        port = free_port()
        procs.start("router", "router", "--port", str(port), "--pd-min-uncached", "0", "--engine", prefill,
                    "--engine", decode)
        router = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for url in (prefill, decode, router):
                await wait_ready(session, url)
            await routable(session, router, 2)
            for _ in range(ctx.plan.pulls):
                await first_token(session, router, prompt(ctx.plan.prompt, rng), max_tokens=2)
            got = await metric_sums(session, decode, *names)
    nbytes, seconds, pulls = (got[n] for n in names)
    return {"pulls": pulls, "bytes": nbytes, "pull_seconds": seconds,
            "gb_per_s": nbytes / seconds / 1e9 if seconds else None}


# -- the run ------------------------------------------------------------------------------------------------

class Check:
    """One run's settings and the in-process runner the prefill and decode steps share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out, self.device, self.shape = Path(args.out), args.device, args.shape
        self.plan = plan_for(args.device, args.quick)
        self.model_dir = self.out / "model"
        self.threads = args.num_threads if args.num_threads is not None else (None if self.cuda else 1)
        self.engine_args = ("--model", str(self.model_dir.resolve()), "--device", self.device,
                            *(("--num-threads", str(self.threads)) if self.threads else ()))
        self._runner = None

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def runner(self):
        if self._runner is None:
            from kvroute.engine.runners.torch_runner import TorchRunner

            per = -(-(self.plan.decode_context + self.plan.decode_steps + 1) // 16)
            blocks = max(64 * per, self.plan.prompt // 16 + 1) + 1
            self._runner = TorchRunner(model_dir=self.model_dir, num_blocks=blocks, device=self.device,
                                       num_threads=self.threads, max_running=64)
            self._runner.warm_up()
        return self._runner

    def close_runner(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
            if self.cuda:
                import torch

                torch.cuda.empty_cache()


RUN = {"memcpy": step_memcpy, "prefill": step_prefill, "decode": step_decode,
       "serving": lambda ctx: asyncio.run(serving(ctx)), "bench": step_bench, "tiers": step_tiers,
       "pd_pull": lambda ctx: asyncio.run(pd_pull(ctx))}


def describe(device: str) -> dict:
    import platform

    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else \
        (platform.processor() or platform.machine())
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"device": device, "device_name": name, "torch": torch.__version__, "commit": commit or None,
            "cpu_threads": torch.get_num_threads(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def summary_line(name: str, r: dict) -> str:
    keys = {"memcpy": ("h2d_gb_s", "d2h_gb_s"), "prefill": ("step_ms_0_cached", "step_ms_all_cached_after_cold"),
            "decode": ("batch_1_graphs_ms", "batch_16_graphs_ms", "batch_1_eager_ms", "batch_16_eager_ms",
                       "batch_64_eager_ms"),
            "serving": ("served_ttft_ms", "runner_step_ms", "overhead_ms", "cold_over_warm"),
            "pd_pull": ("gb_per_s",)}.get(name)
    if "error" in r or "skipped" in r:
        return f"{name:8} {r.get('error') or r.get('skipped')}"
    if keys is None:  # one entry per run
        return f"{name:8} " + "; ".join(f"{k}: TTFT p90 {v.get('ttft_p90_s') or v.get('storm_ttft_p90_s'):.3f} s"
                                         for k, v in r.items() if isinstance(v, dict))
    return f"{name:8} " + ", ".join(f"{k} {r[k]:.3g}" for k in keys if isinstance(r.get(k), (int, float)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Steps: " + ", ".join(STEPS))
    p.add_argument("--out", required=True, help="directory for the checkpoint, logs and gpu_check.json")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--shape", default="3b", choices=sorted(SHAPES), help="model shape of the random checkpoint")
    p.add_argument("--quick", action="store_true", help="the smallest run that still takes every step")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads (default: 1 on CPU, torch's on CUDA)")
    p.add_argument("--steps", default=",".join(STEPS), help="the steps to run, comma-separated")
    p.add_argument("--budget-s", type=float, default=480.0, help="steps not started by then are skipped")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the repository's code, wherever this is run from
    from kvroute.engine.runners.devices import check_device_available

    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    try:
        check_device_available(args.device)
        unknown = sorted(set(steps) - set(STEPS))
        if unknown:
            raise ValueError(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    ctx = Check(args)
    (ctx.out / "logs").mkdir(parents=True, exist_ok=True)
    path, t_start = ctx.out / "gpu_check.json", time.monotonic()
    result = {**describe(args.device), "shape": args.shape, "quick": args.quick, "steps": {}}
    t0 = time.monotonic()
    result["checkpoint"] = write_checkpoint(ctx.model_dir, args.shape, args.device)
    result["checkpoint"]["seconds"] = round(time.monotonic() - t0, 2)
    for name in steps:
        t0 = time.monotonic()
        if t0 - t_start > args.budget_s:
            out = {"skipped": f"not started: {args.budget_s:.0f} s budget spent"}
        else:
            try:
                out = RUN[name](ctx)
            except Exception as e:  # noqa: BLE001 - one step failing must not lose the others' figures
                out = {"error": f"{type(e).__name__}: {e}"}
        result["steps"][name] = {**out, "seconds": round(time.monotonic() - t0, 2)}
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(summary_line(name, out), flush=True)
    ctx.close_runner()
    result["seconds"] = round(time.monotonic() - t_start, 1)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} ({result['seconds']:.0f} s on {result['device_name']})")
    return 1 if any("error" in r for r in result["steps"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
