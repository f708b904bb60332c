"""A request's state inside the engine: its tokens, blocks and progress."""

from __future__ import annotations

import enum
import itertools

from kvroute.engine.core.work import SamplingParams

_ids = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens; `num_computed` of them have K/V in the pool."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int] | tuple[int, ...],  # copied
        sampling: SamplingParams,
        hash_seed: int,
        arrival: float = 0.0,
        *,
        hash_chain: list[int] | None = None,
        adapter: str | None = None,
    ) -> None:
        """`hash_chain`: the prompt's chained block hashes (router/contract/protocol.py `block_hashes` of
        `prompt_ids` under `hash_seed`), when the caller has them already (the simulator's router).
        `adapter`: the LoRA adapter it runs under (its `hash_seed` names it too: its blocks are its own)."""
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.token_ids = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.sampling = sampling
        self.hash_seed = hash_seed
        self.adapter = adapter
        self.adapter_slot = -1  # while running: its adapter's slot (engine/core/adapter_slots.py)
        self.arrival = arrival
        self.status = SeqStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hashes of the full blocks hashed so far
        # chained hashes of token_ids' first full blocks (a cache: tokens only grow)
        self.hash_chain: list[int] = list(hash_chain) if hash_chain else []
        self.num_computed = 0
        self.num_cached = 0  # prompt tokens found in the prefix cache (first admission), all tiers
        self.cached_by_tier: dict[str, int] = {}  # of num_cached: {"device", "host", "remote"}
        self.store_hits: frozenset[int] | None = None  # block hashes the shared store was found to hold
        self.pending_loads = 0  # blocks still to be copied in from the host pool or the store
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.scheduled_time: float | None = None  # first time a step ran it (engine clock)
        self.first_token_time: float | None = None
        self.pin_kv = False  # prefill for a remote decode: keep the blocks for a pull
        self.remote: object = None  # decode of a remote prefill: its engine/transfer TransferHandle
        self.pulling = False  # K/V being pulled into this sequence's blocks
        self.transfer_address = ""  # prefill for a remote decode: the address the grant named
        self.transfer_signature: str | None = None  # ... and the handle's signature, checked on the pull
        self.last_token_time = 0.0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def is_prefilling(self) -> bool:
        """More than one token lacks K/V: a prompt (or a preempted sequence) being prefilled."""
        return len(self.token_ids) - self.num_computed > 1

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status == SeqStatus.FINISHED
