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
import dataclasses
import math
from collections.abc import Iterable, Sequence

import xxhash

from kvroute.engine.core.kv_copies import CopyPlan, CopyTimes
from kvroute.engine.core.work import RunnerInfo, SampledTokens, SeqWork, TokenLogprobs
from kvroute.engine.kv.links import LINKS
from kvroute.engine.runners.cost_model import CostModel

NUM_SPECIAL_TOKENS = 5  # ids below this are the built-in tokenizer's special tokens


class SimRunner:
    payload_bytes_per_block = 0  # no K/V exists here: store entries carry headers only

    def __init__(self, cost_model: CostModel, info: RunnerInfo, seed: int = 0, time_scale: float = 1.0,
                 block_size: int = 16, link: str = "loopback", host_link: str = "cpu-memcpy",
                 store_link: str = "cpu-redis") -> None:
        for name in (link, host_link, store_link):
            if name not in LINKS:
                raise ValueError(f"unknown KV link {name!r}; choose from {', '.join(LINKS)}")
        self.host_link, self.store_link = LINKS[host_link], LINKS[store_link]
        self.cost_model = cost_model
        self.info = info
        self.seed = seed
        self.time_scale = time_scale
        self.busy_s = 0.0
        self.link = LINKS[link]
        dtype_bytes = 2 if info.dtype in ("bfloat16", "float16") else 4
        per_token = (cost_model.kv_bytes_per_token
                     or info.num_layers * 2 * info.num_kv_heads * info.head_dim * dtype_bytes)
        self.kv_bytes_per_block = per_token * block_size
        self._ahead: asyncio.Future | None = None
        self._times = CopyTimes([])  # the batch between start_copies and finish_copies
        self.adapter_slots: dict[int, str] = {}  # what each LoRA slot holds: a work naming another loads it

    transfer_payload_bytes = 0  # per block on the wire: nothing moves, `transfer_time` stands for it

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        """No K/V exists here: a pull moves empty payloads and `transfer_time` stands for the bytes."""
        return b""

    def write_blocks(self, block_ids: Sequence[int], data) -> None:
        pass

    def transfer_time(self, num_blocks: int) -> float:
        return self._link_time(self.link, num_blocks)

    def _link_time(self, link: tuple[float, float], num_blocks: int) -> float:
        bandwidth, latency = link
        return (latency + num_blocks * self.kv_bytes_per_block / bandwidth) * self.time_scale if num_blocks else 0.0

    def copy_times(self, plan: CopyPlan) -> CopyTimes:
        """Modelled times of a batch of tier copies over the host link (reads for the store count as D2H)."""
        return CopyTimes([b"" for _ in plan.reads],
                         read_s=self._link_time(self.host_link, len(plan.device_reads) + len(plan.host_reads)),
                         d2h_s=self._link_time(self.host_link, len(plan.d2h)),
                         h2d_s=self._link_time(self.host_link, plan.num_loaded))

    async def start_copies(self, plan: CopyPlan, ahead: CopyPlan) -> None:
        """The plan's copies before the step; the ahead copies alongside it (overlapped with its sleep)."""
        times, ahead_s = self.copy_times(plan), self.copy_times(ahead).d2h_s
        self._ahead = asyncio.ensure_future(asyncio.sleep(ahead_s)) if ahead_s else None
        self._times = dataclasses.replace(times, d2h_s=times.d2h_s + ahead_s)
        await asyncio.sleep(times.read_s + times.d2h_s + times.h2d_s)

    async def finish_copies(self) -> CopyTimes:
        """After the step (once the ahead copies are done too): the batch's modelled times."""
        if self._ahead is not None:
            await self._ahead
            self._ahead = None
        return self._times

    def warm_up(self, measure: bool = False) -> None:
        """Nothing to capture or measure: the links and the step times are the model's."""
        return None

    @property
    def prefill_rate_hint(self) -> float:
        """Prefill tokens/s the cost model predicts for long chunks (what recovery starts from)."""
        return 1.0 / max(self.cost_model.prefill_token_s * self.time_scale, 1e-12)

    def store_delay(self, num_blocks: int) -> float:
        """Modelled time of reading `num_blocks` from the store (the entries here carry no K/V)."""
        return self._link_time(self.store_link, num_blocks)

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
        loads = self.adapter_loads([(w.adapter, w.adapter_slot) for w in works])
        duration = self.cost_model.step_time(works, loads) * self.time_scale
        tokens = [self.sample(w) if w.sample else None for w in works]
        if any(w.sampling.logprobs is not None for w in works):
            tokens = SampledTokens(tokens, [self.logprobs(w, t) if t is not None else None
                                            for w, t in zip(works, tokens)])
        return duration, tokens

    def adapter_loads(self, chunks: Iterable[tuple[str | None, int]]) -> int:
        """Slots whose adapter changes for a step that runs `chunks` (each one's adapter and slot): the
        torch runner copies the weights in then, when a work names an adapter its slot does not hold.
        The simulator (loadgen/sim/instance.py) prices its steps' loads with this too."""
        loads, slots = 0, self.adapter_slots
        for adapter, slot in chunks:
            if adapter is not None and slots.get(slot) != adapter:
                slots[slot] = adapter
                loads += 1
        return loads

    async def execute(self, works: Sequence[SeqWork]) -> list[int | None]:
        duration, tokens = self.execute_sync(works)
        self.busy_s += duration
        await asyncio.sleep(duration)
        return tokens

    def close(self) -> None:
        pass
