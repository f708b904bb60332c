"""Simulated model runner: the real scheduler and block manager, model time from a cost model.

Each step sleeps for `cost_model.step_time(works)` instead of computing. Sampled
tokens are pseudo-random but deterministic per (seed, sequence, position) and
never a special token, so generation always runs to `max_tokens`.

The sim has no logits: temperature, top-k/p, penalties and logit_bias do not change its
tokens. Its model is a uniform distribution over the non-special tokens, and the logprobs
it reports say so: every token has log(1 / (vocab - special)); the `top` N are the sampled
token and the N - 1 ids after it (all tied).
"""

from __future__ import annotations

import asyncio
import math
from typing import Sequence

import xxhash

from engine.cost_model import CostModel
from engine.work import RunnerInfo, SampledTokens, SeqWork, TokenLogprobs

NUM_SPECIAL_TOKENS = 5  # ids below this are the built-in tokenizer's special tokens

# Modelled KV links for prefill -> decode pulls: (bytes/s, seconds of latency per pull).
# NVLink 4 (H100: 900 GB/s bidirectional, ~450 GB/s one way; we take 300 GB/s achieved),
# 200 Gb/s InfiniBand NDR per GPU (~25 GB/s achieved), and this machine's loopback as
# measured by tools/bench_disagg.py with the torch runner (about 1 GB/s, 2 ms per pull).
LINKS: dict[str, tuple[float, float]] = {
    "nvlink": (300e9, 10e-6),
    "infiniband": (25e9, 20e-6),
    "loopback": (1e9, 2e-3),
}


class SimRunner:
    def __init__(self, cost_model: CostModel, info: RunnerInfo, seed: int = 0, time_scale: float = 1.0,
                 block_size: int = 16, link: str = "loopback") -> None:
        if link not in LINKS:
            raise ValueError(f"unknown KV link {link!r}; choose from {', '.join(LINKS)}")
        self.cost_model = cost_model
        self.info = info
        self.seed = seed
        self.time_scale = time_scale
        self.busy_s = 0.0
        self.link = LINKS[link]
        dtype_bytes = 2 if info.dtype in ("bfloat16", "float16") else 4
        per_token = cost_model.kv_bytes_per_token or info.num_layers * 2 * info.num_kv_heads * info.head_dim * dtype_bytes
        self.kv_bytes_per_block = per_token * block_size

    transfer_payload_bytes = 0  # per block on the wire: nothing moves, `transfer_time` stands for it

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        """No K/V exists here: a pull moves empty payloads and `transfer_time` stands for the bytes."""
        return b""

    def write_blocks(self, block_ids: Sequence[int], data: bytes) -> None:
        pass

    def transfer_time(self, num_blocks: int) -> float:
        bandwidth, latency = self.link
        return (latency + num_blocks * self.kv_bytes_per_block / bandwidth) * self.time_scale

    def sample(self, work: SeqWork) -> int:
        key = f"{self.seed}:{work.sampling.seed}:{work.token_ids[-1]}:{work.context_len}"
        span = self.info.vocab_size - NUM_SPECIAL_TOKENS
        return NUM_SPECIAL_TOKENS + xxhash.xxh3_64_intdigest(key.encode()) % span

    def logprobs(self, work: SeqWork, token: int) -> TokenLogprobs | None:
        n = work.sampling.logprobs
        if n is None:
            return None
        span = self.info.vocab_size - NUM_SPECIAL_TOKENS
        lp = -math.log(span)
        top = tuple((NUM_SPECIAL_TOKENS + (token - NUM_SPECIAL_TOKENS + k) % span, lp) for k in range(min(n, span)))
        return TokenLogprobs(token, lp, top)

    def execute_sync(self, works: Sequence[SeqWork]) -> tuple[float, list[int | None]]:
        """Modelled step time and tokens, without sleeping (for the virtual-clock simulator)."""
        duration = self.cost_model.step_time(works) * self.time_scale
        tokens = [self.sample(w) if w.sample else None for w in works]
        if any(w.sampling.logprobs is not None for w in works):
            tokens = SampledTokens(tokens, [self.logprobs(w, t) if t is not None else None
                                            for w, t in zip(works, tokens)])
        return duration, tokens

    async def execute(self, works: Sequence[SeqWork]) -> list[int | None]:
        duration, tokens = self.execute_sync(works)
        self.busy_s += duration
        await asyncio.sleep(duration)
        return tokens

    def close(self) -> None:
        pass
