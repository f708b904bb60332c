"""The steps measured in this process: the copy ceiling (memcpy), the runner's prefill and decode steps."""

from __future__ import annotations

import functools
import random
import statistics
import time

from kvroute.benchmarks.gpu_check.plan import VOCAB


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
        out[f"step_ms_{cached}_cached"] = timed(functools.partial(runner.execute_sync, [work]), ctx.plan.reps) * 1e3
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
