"""The runner's choices, measured: attention over the paged pool, and torch.compile of the small ops.

    python -m kvroute.benchmarks.attention --out attention.json [--device cpu] [--reps 20]

`attention`: decode attention of B sequences at 512 tokens of context over a pool of 4,096 blocks
(the tiny model's heads), as the engine does it -- the context blocks gathered into preallocated
buffers, one SDPA call (engine/runners/model/attention.py) -- against FlexAttention reading the
pool in place through a paged block mask (mask_mod maps each query row to its sequence's blocks;
compiled, as FlexAttention must be to be fast; the block mask built per step from the block
tables, as a step would), with the time to build that mask and to compile.

`compile`: the runner's step (tiny model) eager, then with RMSNorm, the rotary embedding and the
MLP compiled by torch.compile (the fusions it would buy), and the compile time.

Medians over --reps; docs/engine.md#the-step-on-a-device quotes the result.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

NB, BS, KVH, NH, HD, CONTEXT = 4096, 16, 2, 4, 64, 512


def median_ms(fn, reps: int) -> float:
    from kvroute.engine.runners.device_costs import median_seconds

    return median_seconds(fn, reps) * 1e3


def attention(device: str, reps: int) -> dict:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    pools = tuple(torch.randn(NB * BS, KVH, HD, device=device) for _ in range(2))
    flex = torch.compile(flex_attention, dynamic=False)
    out = {}
    for batch in (1, 16):
        out[f"batch_{batch}"] = attention_batch(batch, pools, flex, device, reps)
        print(f"attention batch {batch}: {out[f'batch_{batch}']}", flush=True)
    return out


def attention_batch(batch: int, pools, flex, device: str, reps: int) -> dict:
    """One batch of decode attention: the engine's gather + SDPA against FlexAttention over the pool in place."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from kvroute.engine.runners.model.attention import decode_attention

    pool_k, pool_v = pools
    nblk = CONTEXT // BS
    tables = torch.randperm(NB, device=device)[:batch * nblk].view(batch, nblk)
    q = torch.randn(batch, NH, HD, device=device)
    lens = torch.full((batch,), CONTEXT, device=device)
    k_buf, v_buf = (torch.empty(batch * nblk, BS, KVH, HD, device=device) for _ in range(2))
    mask = (torch.arange(nblk * BS, device=device)[None] < lens[:, None])[:, None, None, :]

    def gathered():
        ids = tables.reshape(-1)
        k = torch.index_select(pool_k.view(NB, BS, KVH, HD), 0, ids, out=k_buf).view(-1, KVH, HD)
        v = torch.index_select(pool_v.view(NB, BS, KVH, HD), 0, ids, out=v_buf).view(-1, KVH, HD)
        return decode_attention(q, k, v, mask)

    owner = torch.full((NB,), -1, dtype=torch.long, device=device)
    logical = torch.zeros(NB, dtype=torch.long, device=device)
    for b in range(batch):
        owner[tables[b]] = b
        logical[tables[b]] = torch.arange(nblk, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        blk = kv_idx // BS
        return (owner[blk] == q_idx) & (logical[blk] * BS + kv_idx % BS < lens[q_idx])

    def block_mask():
        return create_block_mask(mask_mod, 1, None, batch, NB * BS, device=device, BLOCK_SIZE=(batch, BS))

    qf, kf, vf = q.transpose(0, 1)[None], pool_k.transpose(0, 1)[None], pool_v.transpose(0, 1)[None]
    t0 = time.perf_counter()
    bm = block_mask()
    flex(qf, kf, vf, block_mask=bm, enable_gqa=True)
    compile_s = time.perf_counter() - t0
    return {"gather_sdpa_ms": median_ms(gathered, reps),
            "flex_paged_ms": median_ms(lambda: flex(qf, kf, vf, block_mask=bm, enable_gqa=True), reps),
            "flex_block_mask_ms": median_ms(block_mask, max(3, reps // 4)),
            "flex_first_call_s": compile_s}


def step_times(runner, reps: int) -> dict:
    from kvroute.engine.core.work import SamplingParams, SeqWork

    greedy = SamplingParams(temperature=0.0)
    tokens = [5 + i % 8000 for i in range(2048)]
    table = tuple(range(128))
    runner.execute_sync([SeqWork(0, tuple(tokens), 0, table, True, greedy)])
    out = {"prefill_2048_ms": median_ms(lambda: runner.execute_sync([SeqWork(0, tuple(tokens), 0, table, True,
                                                                             greedy)]), max(3, reps // 4)),
           "prefill_2032_cached_ms": median_ms(lambda: runner.execute_sync(
               [SeqWork(0, tuple(tokens[2032:]), 2032, table, True, greedy)]), reps)}
    for batch in (1, 16, 64):
        works = [SeqWork(i, (7,), CONTEXT, tuple(range(200 + i * 33, 200 + (i + 1) * 33)), True, greedy)
                 for i in range(batch)]
        out[f"decode_{batch}_ms"] = median_ms(functools.partial(runner.execute_sync, works), reps)
    return out


def compiled(device: str, reps: int) -> dict:
    import torch

    from kvroute.engine.runners.model import llama
    from kvroute.engine.runners.torch_runner import TorchRunner

    runner = TorchRunner(num_blocks=8192, device=device)
    try:
        eager = step_times(runner, reps)
        t0 = time.perf_counter()
        for cls, name in ((llama.RMSNorm, "forward"), (llama.Rotary, "__call__"), (llama.MLP, "forward")):
            setattr(cls, name, torch.compile(getattr(cls, name), dynamic=True))
        fused = step_times(runner, reps)
        out = {"eager": eager, "compiled": fused, "compile_and_run_s": time.perf_counter() - t0}
    finally:
        runner.close()
    print(f"compile: {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    result = {"device": args.device, "torch": torch.__version__, "threads": args.threads,
              "attention": attention(args.device, args.reps), "compile": compiled(args.device, args.reps)}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
