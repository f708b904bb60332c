"""`kvroute engine --backend sim --calibrate`: fit the sim cost model to the torch runner here.

Times single prefill chunks (various lengths and cached prefixes) and decode batches
(various sizes and contexts) on the torch runner, fits the CostModel coefficients by
least squares (coefficients kept non-negative), and prints them with the fit error.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from kvroute.engine.core.config import BatchConfig
from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.config import RunnerConfig
from kvroute.engine.runners.cost_model import CostModel

PREFILLS = [(64, 0), (256, 0), (512, 0), (1024, 0), (2048, 0), (256, 1024), (512, 1536), (256, 1792), (1024, 1024)]
DECODES = [(1, 128), (1, 1024), (4, 256), (8, 256), (16, 512), (32, 256), (32, 1024)]
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


def prefill_work(num_new: int, cached: int, block_size: int, first_block: int = 0) -> SeqWork:
    total = num_new + cached
    table = tuple(range(first_block, first_block + -(-total // block_size)))
    return SeqWork(0, tuple(range(5, 5 + num_new)), cached, table, True, GREEDY)


def decode_works(batch: int, context: int, block_size: int) -> list[SeqWork]:
    per = -(-(context + 1) // block_size)
    return [SeqWork(i, (7,), context, tuple(range(i * per, (i + 1) * per)), True, GREEDY) for i in range(batch)]


def time_step(runner, works, repeats: int) -> float:
    runner.execute_sync(works)  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner.execute_sync(works)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fit(rows: Sequence[tuple[tuple[float, ...], float]]) -> np.ndarray:
    """Least squares of the *relative* error on [1, features...], coefficients forced >= 0
    (drop the most negative one and refit), so short decode steps weigh as much as long prefills."""
    t = np.array([t for _, t in rows])
    x = np.array([(1.0, *f) for f, _ in rows]) / t[:, None]
    y = np.ones_like(t)
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all():
            out = np.zeros(x.shape[1])
            out[active] = coef
            return out
        active.pop(int(np.argmin(coef)))


def run_calibration(config: RunnerConfig, batch: BatchConfig, out_path: str | None = None, repeats: int = 5) -> int:
    from kvroute.engine.kv.config import TierConfig
    from kvroute.engine.runners.registry import RUNNERS
    from kvroute.engine.runners.torch_runner import TorchRunner

    runner = RUNNERS["torch"](dataclasses.replace(config, backend="torch", num_threads=config.num_threads or 1),
                              dataclasses.replace(batch, num_blocks=max(batch.num_blocks, 4096)), TierConfig())
    assert isinstance(runner, TorchRunner)  # what it times: execute_sync
    probe = CostModel("probe", 0.0, 0.0, 0.0, 0.0, 0.0)
    bs = batch.block_size
    rows = []
    cases = [("prefill", n, c, [prefill_work(n, c, bs)]) for n, c in PREFILLS]
    cases += [("decode", b, ctx, decode_works(b, ctx, bs)) for b, ctx in DECODES]
    for kind, a, b, works in cases:
        if kind == "prefill" and a > 0 and b > 0:
            runner.execute_sync([prefill_work(b, 0, bs)])  # put the cached prefix's K/V in place
        t = time_step(runner, works, repeats)
        rows.append((probe.features(works), t))
        print(f"  {kind:<8} {a:>5} x {b:>5}: {t * 1000:8.2f} ms", file=sys.stderr)
    runner.close()
    coef = fit(rows)
    step_s, prefill_token_s, prefill_pair_s, decode_seq_s, decode_context_s = map(float, coef)  # 1 + 4 features
    model = CostModel("calibrated", step_s, prefill_token_s, prefill_pair_s, decode_seq_s, decode_context_s,
                      description="fitted by kvroute engine --calibrate")
    errors = [abs(model.step_time(w) - t) / t for (_, _, _, w), (_, t) in zip(cases, rows)]
    result = {
        "coefficients": {k: v for k, v in dataclasses.asdict(model).items() if isinstance(v, float)},
        "median_rel_error": statistics.median(errors),
        "max_rel_error": max(errors),
        "points": [{"kind": k, "a": a, "b": b, "measured_s": t, "model_s": model.step_time(w)}
                   for (k, a, b, w), (_, t) in zip(cases, rows)],
    }
    print(json.dumps(result["coefficients"], indent=2))
    print(f"fit error: median {result['median_rel_error']:.1%}, max {result['max_rel_error']:.1%}")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
