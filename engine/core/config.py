"""The engine core's settings: its KV block pool and its batch, declared once
(router/contract/settings.py). The runners, the tiers and the server have their own sections
(engine/runners/config.py, engine/kv/config.py, engine/config.py)."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.constraints import NOT_NEGATIVE, Range, at_least
from kvroute.router.contract.settings import check_settings, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """KV pool and batch (engine/core)"""

    block_size: int = setting(16, "tokens per KV block", check=Range(1, 1024))
    num_blocks: int = setting(4096, "KV blocks in the pool", check=at_least(2))
    max_batched_tokens: int = setting(2048, "token budget of one step (at least --block-size)", check=at_least(1))
    max_running: int = setting(64, "sequences in the running batch", check=at_least(1))
    max_waiting: int = setting(256, "queued requests before 503s", check=NOT_NEGATIVE)
    event_buffer: int = setting(10_000, "KV events kept for GET /kv/events?since=SEQ", check=at_least(1))

    def __post_init__(self) -> None:
        check_settings(self)
        if self.max_batched_tokens < self.block_size:
            raise ValueError(f"--max-batched-tokens must be at least the block size ({self.block_size}), "
                             f"got {self.max_batched_tokens}")
