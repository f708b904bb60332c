"""Prefill TTFT with a cached prefix and decode throughput of `TorchRunner` (tiny model).

    python -m kvroute.benchmarks.torch_runner --out bench_torch.json [--threads 1] [--reps 9]

TTFT: time of the one step that prefills the uncached tail of a 2048-token prompt and
samples its first token, with 0, 1024 and 1792 tokens already in the pool.
Decode: tokens/s of steps decoding a batch of 1, 8 or 32 sequences at ~256 tokens of context.
Figures are medians over --reps repetitions.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.torch_runner import TorchRunner

GREEDY = SamplingParams(temperature=0.0)


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def ttft_ms(runner: TorchRunner, tokens: list[int], cached: list[int], reps: int) -> dict[int, float]:
    """Median time of the step prefilling tokens[c:] after c cached ones, for each c in cached.

    The cases take turns within each repetition, so a noisy machine slows them alike. The
    prompt and block table are the same in every case, so the K/V of positions < c is
    already right in the pool after the warm-up run of the whole prompt.
    """
    table = tuple(range(-(-len(tokens) // runner.block_size)))
    runner.execute_sync([SeqWork(0, tuple(tokens), 0, table, True, GREEDY)])
    times: dict[int, list[float]] = {c: [] for c in cached}
    for _ in range(reps):
        for c in cached:
            work = SeqWork(0, tuple(tokens[c:]), c, table, True, GREEDY)
            start = time.perf_counter()
            runner.execute_sync([work])
            times[c].append(time.perf_counter() - start)
    return {c: statistics.median(ts) * 1000 for c, ts in times.items()}


def decode_tokens_per_s(runner: TorchRunner, batch: int, context: int, steps: int, reps: int) -> float:
    bs = runner.block_size
    blocks_per_seq = -(-(context + steps) // bs)
    tables = [tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    rates = []
    for rep in range(reps + 1):
        last = []
        for i in range(batch):  # prefill each sequence (not timed)
            toks = prompt(context, runner.config.vocab_size, seed=1000 * rep + i)
            work = SeqWork(i, tuple(toks), 0, tables[i], True, GREEDY)
            last.append(runner.execute_sync([work])[0])
        start = time.perf_counter()
        for step in range(steps):
            works = [SeqWork(i, (last[i],), context + step, tables[i], True, GREEDY, step + 1)
                     for i in range(batch)]
            last = runner.execute_sync(works)
        rates.append(batch * steps / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="path of the JSON results")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--decode-context", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=32)
    args = parser.parse_args(argv)

    config = ModelConfig.tiny()
    runner = TorchRunner(config, num_blocks=4096, block_size=16, num_threads=args.threads)
    tokens = prompt(args.prompt_len, config.vocab_size, seed=0)
    most = args.prompt_len * 7 // 8
    ttft = ttft_ms(runner, tokens, [0, args.prompt_len // 2, most], args.reps)
    for cached, ms in ttft.items():
        print(f"TTFT prompt={args.prompt_len} cached={cached:5d}: {ms:8.2f} ms")
    ratio = ttft[0] / ttft[most]
    print(f"TTFT ratio 0-cached / {most}-cached: {ratio:.2f}x")
    decode = {}
    for batch in (1, 8, 32):
        decode[batch] = decode_tokens_per_s(runner, batch, args.decode_context, args.decode_steps, args.reps)
        print(f"decode batch={batch:2d} context~{args.decode_context}: {decode[batch]:9.1f} tokens/s")
    runner.close()
    result = {
        "model": config.name, "threads": args.threads, "reps": args.reps, "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "prompt_len": args.prompt_len,
        "ttft_ms": {str(k): round(v, 3) for k, v in ttft.items()},
        "ttft_ratio_0_vs_most_cached": round(ratio, 3),
        "decode_context": args.decode_context, "decode_steps": args.decode_steps,
        "decode_tokens_per_s": {str(k): round(v, 1) for k, v in decode.items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
