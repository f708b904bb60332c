"""What the scheduler hands a model runner each step, and the runner protocol.

A step is a list of `SeqWork`: for each scheduled sequence, the new tokens to run
(a prefill chunk, or the one token of a decode), the number of tokens whose KV is
already in the pool before them, the sequence's block table, and whether to sample
a next token after the last new token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvroute.engine.core.kv_copies import CopyPlan, CopyTimes


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    """vLLM's sampling semantics. Logits pass, in order: `logit_bias` (added), `repetition_penalty`
    (tokens in the prompt or the output: positive logits divided by it, negative multiplied),
    `frequency_penalty` (minus penalty x count in the output), `presence_penalty` (minus penalty
    if in the output); then greedy argmax, or temperature, top-k, min-p, top-p and a draw.
    `logprobs` (N >= 0, or None for none) asks for the sampled token's log-probability and the
    N most likely tokens', from the model's raw logits (vLLM V1's default `raw_logprobs`)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    top_k: int = 0  # 0 (or -1): no top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be a positive integer")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < -1 or not 0 <= self.min_p <= 1:
            raise ValueError("top_k must be >= -1 and min_p in [0, 1]")
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError("logprobs must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """The penalties read the prompt and output tokens."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def edits_logits(self) -> bool:
        return self.needs_history or bool(self.logit_bias)

    @property
    def needs_logits(self) -> bool:
        """Sampling needs the row's logits on the host (else the device's argmax is the token)."""
        return not self.greedy or self.edits_logits or self.logprobs is not None


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The sampled token's log-probability and the `top` most likely (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class SampledTokens(list):
    """What `ModelRunner.execute` returns: a list with one token id per work (None where nothing was
    sampled), and `logprobs`, the same length, a TokenLogprobs where the work's sampling asked."""

    def __init__(self, tokens=(), logprobs=None) -> None:
        super().__init__(tokens)
        self.logprobs: list[TokenLogprobs | None] = list(logprobs) if logprobs is not None else [None] * len(self)


@dataclasses.dataclass(frozen=True, slots=True)
class SeqWork:
    seq_id: int
    token_ids: tuple[int, ...]  # new tokens, at positions start_pos .. start_pos+len-1
    start_pos: int  # tokens already in the KV pool for this sequence
    block_table: tuple[int, ...]  # physical block ids covering positions [0, start_pos+len)
    sample: bool  # sample a next token after the last new token
    sampling: SamplingParams
    num_generated: int = 0  # tokens generated so far (seeds per-step sampling)
    prompt_ids: tuple[int, ...] = ()  # prompt and output so far, only when the sampling's penalties need them
    output_ids: tuple[int, ...] = ()
    adapter: str | None = None  # the LoRA adapter it runs under (None: the base model) ...
    adapter_slot: int = -1  # ... in this slot, which the scheduler gave it (engine/core/adapter_slots.py)

    @property
    def num_new(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerInfo:
    model: str
    vocab_size: int
    max_model_len: int
    eos_token_id: int | None
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int


class ModelRunner(Protocol):
    """Runs one scheduler step: writes new K/V into the pool, samples where asked.

    `read_blocks` / `write_blocks` move whole blocks' raw K/V (all layers) for
    prefill -> decode transfers."""

    @property
    def info(self) -> RunnerInfo: ...

    @property
    def kv_bytes_per_block(self) -> int: ...

    @property
    def transfer_payload_bytes(self) -> int: ...  # one block's payload in a transfer frame (0: moves no bytes)

    @property
    def payload_bytes_per_block(self) -> int: ...  # K/V bytes of one block in a store entry (0: headers only)

    @property
    def prefill_rate_hint(self) -> float: ...  # prefill tokens/s to start from, before any is measured

    async def execute(self, works: Sequence[SeqWork]) -> list[int | None]:
        """One sampled token per work item with `sample` set, else None (same order); a
        `SampledTokens` when some work asked for logprobs."""
        ...

    def read_blocks(self, block_ids: Sequence[int]) -> bytes: ...

    def write_blocks(self, block_ids: Sequence[int], data) -> None:
        """`data`: the blocks' bytes, one bytes-like object or a sequence of them, in order."""

    def warm_up(self, measure: bool = False):
        """Once before serving (blocking): prepare the device; with `measure`, return what was measured of
        it (engine/kv/link_estimate.py `DeviceCosts`), else None."""

    def close(self) -> None: ...

    # the tier copies (engine/kv/tier_service.py `CopyRunner`)
    async def start_copies(self, plan: CopyPlan, ahead: CopyPlan) -> None: ...

    async def finish_copies(self) -> CopyTimes: ...

    def store_delay(self, num_blocks: int) -> float: ...
