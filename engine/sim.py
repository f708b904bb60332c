"""Simulated model runner: the real scheduler and block manager, model time from a cost model.

Each step sleeps for `cost_model.step_time(works)` instead of computing. Sampled
tokens are pseudo-random but deterministic per (seed, sequence, position) and
never a special token, so generation always runs to `max_tokens`.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

import xxhash

from engine.cost_model import CostModel
from engine.work import RunnerInfo, SeqWork

NUM_SPECIAL_TOKENS = 5  # ids below this are the built-in tokenizer's special tokens


class SimRunner:
    def __init__(self, cost_model: CostModel, info: RunnerInfo, seed: int = 0, time_scale: float = 1.0) -> None:
        self.cost_model = cost_model
        self.info = info
        self.seed = seed
        self.time_scale = time_scale
        self.busy_s = 0.0

    def sample(self, work: SeqWork) -> int:
        key = f"{self.seed}:{work.sampling.seed}:{work.token_ids[-1]}:{work.context_len}"
        span = self.info.vocab_size - NUM_SPECIAL_TOKENS
        return NUM_SPECIAL_TOKENS + xxhash.xxh3_64_intdigest(key.encode()) % span

    def execute_sync(self, works: Sequence[SeqWork]) -> tuple[float, list[int | None]]:
        """Modelled step time and tokens, without sleeping (for the virtual-clock simulator)."""
        duration = self.cost_model.step_time(works) * self.time_scale
        return duration, [self.sample(w) if w.sample else None for w in works]

    async def execute(self, works: Sequence[SeqWork]) -> list[int | None]:
        duration, tokens = self.execute_sync(works)
        self.busy_s += duration
        await asyncio.sleep(duration)
        return tokens

    def close(self) -> None:
        pass
