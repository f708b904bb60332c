"""What the scheduler hands a model runner each step, and the runner protocol.

A step is a list of `SeqWork`: for each scheduled sequence, the new tokens to run
(a prefill chunk, or the one token of a decode), the number of tokens whose KV is
already in the pool before them, the sequence's block table, and whether to sample
a next token after the last new token.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be a positive integer")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class SeqWork:
    seq_id: int
    token_ids: tuple[int, ...]  # new tokens, at positions start_pos .. start_pos+len-1
    start_pos: int  # tokens already in the KV pool for this sequence
    block_table: tuple[int, ...]  # physical block ids covering positions [0, start_pos+len)
    sample: bool  # sample a next token after the last new token
    sampling: SamplingParams
    num_generated: int = 0  # tokens generated so far (seeds per-step sampling)

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

    info: RunnerInfo
    kv_bytes_per_block: int
    transfer_payload_bytes: int  # one block's payload in a transfer frame (0: the runner moves no bytes)

    async def execute(self, works: Sequence[SeqWork]) -> list[int | None]:
        """One sampled token per work item with `sample` set, else None (same order)."""
        ...

    def read_blocks(self, block_ids: Sequence[int]) -> bytes: ...

    def write_blocks(self, block_ids: Sequence[int], data: bytes) -> None: ...

    def close(self) -> None: ...
