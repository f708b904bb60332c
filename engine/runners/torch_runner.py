"""`TorchRunner`: the real `ModelRunner`, a Llama forward over a paged K/V pool.

`execute` runs each step on one dedicated worker thread, so the event loop stays free while
torch computes; `run_copies` (the batched host/store tier copies of engine/kv/kv_copies.py)
runs on the same thread, so a batch always runs between the steps it was planned between. `execute_sync`, `forward_logits`, `read_blocks` and `write_blocks` run in
the caller's thread; all of them take one lock, so they are safe to call from any thread
but never overlap (a step and a block copy are serialized).

What a step expects of its works (checked where cheap, ValueError otherwise):
- each sequence at most once per step, with at least one new token;
- the K/V of token position p goes to block `block_table[p // block_size]`, offset
  `p % block_size`: a block this step writes into must not be shared with another live
  sequence (copy-on-write of a partly filled shared block is the block manager's job);
- `block_table` covers at least ceil(context_len / block_size) blocks; entries past that
  are ignored; positions < start_pos must already hold this sequence's K/V.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Sequence

import torch

from engine.runners.model.config import ModelConfig
from engine.runners.model.kv_pool import DTYPES, KVPool
from engine.runners.model.llama import DecodeGroup, PrefillChunk, StepBatch
from engine.runners.model.loader import build_model
from engine.kv.kv_copies import CopyPlan, CopyTimes
from engine.runners.model.tier_copies import HostKV
from engine.runners.sampling import sample_works
from engine.core.work import RunnerInfo, SampledTokens, SeqWork


class TorchRunner:
    def __init__(self, model_config: ModelConfig | None = None, num_blocks: int = 1024,
                 block_size: int = 16, model_dir: str | Path | None = None,
                 device: str = "cpu", num_threads: int | None = None, seed: int = 0,
                 host_blocks: int = 0) -> None:
        """No config and no model_dir: the tiny random model. model_dir alone: its config.json."""
        if model_config is None:
            model_config = ModelConfig.from_hf_dir(model_dir) if model_dir else ModelConfig.tiny()
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide in torch
        self.config = model_config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.model = build_model(model_config, model_dir, self.device, seed)
        self.pool = KVPool(num_blocks, block_size, model_config.num_layers, model_config.num_kv_heads,
                           model_config.head_dim, DTYPES[model_config.dtype], self.device)
        self.host = HostKV(host_blocks, self.pool)
        self.info = RunnerInfo(
            model=model_config.name, vocab_size=model_config.vocab_size,
            max_model_len=model_config.max_position_embeddings,
            eos_token_id=model_config.eos_token_id, dtype=model_config.dtype,
            num_layers=model_config.num_layers, num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim)
        self._lock = threading.Lock()
        self._generator = torch.Generator()
        self._generator.seed()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-runner")

    @property
    def kv_bytes_per_block(self) -> int:
        return self.pool.bytes_per_block

    @property
    def transfer_payload_bytes(self) -> int:
        """Bytes of one block's payload in a KV transfer frame (engine/transfer/kv_transfer.py)."""
        return self.pool.bytes_per_block

    async def execute(self, works: Sequence[SeqWork]) -> SampledTokens:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.execute_sync, list(works))

    def execute_sync(self, works: Sequence[SeqWork]) -> SampledTokens:
        """One sampled token per work with `sample` set, else None (same order), with logprobs."""
        if not works:
            return SampledTokens()
        sampled = [w for w in works if w.sample]
        with self._lock:
            logits = self._forward(works)
            out = sample_works(logits, sampled, self._generator)
        tokens, logprobs = iter(out), iter(out.logprobs)
        return SampledTokens([next(tokens) if w.sample else None for w in works],
                             [next(logprobs) if w.sample else None for w in works])

    def forward_logits(self, works: Sequence[SeqWork]) -> torch.Tensor:
        """Runs the step; (S, V) float32 logits, one row per work with `sample`, in order."""
        with self._lock:
            return self._forward(works)

    def _forward(self, works: Sequence[SeqWork]) -> torch.Tensor:
        for w in works:
            self._check(w)
        with torch.inference_mode():
            return self.model(self._prepare(works), self.pool)

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        """Raw K/V of whole blocks, all layers; layout in `engine.runners.model.kv_pool`.

        Takes no lock: callers read blocks no step writes (a pinned prefill's blocks are
        referenced, so never reallocated), and a transfer must not wait for a long step."""
        return self.pool.read_blocks(block_ids)

    def write_blocks(self, block_ids: Sequence[int], data: bytes | bytearray | memoryview) -> None:
        with self._lock:
            self.pool.write_blocks(block_ids, data)

    @property
    def payload_bytes_per_block(self) -> int:
        """Bytes of one block's K/V as `read_blocks` returns them (what a store entry carries)."""
        return self.pool.bytes_per_block

    async def run_copies(self, plan: CopyPlan) -> CopyTimes:
        """Run a batch of tier copies on the step thread: in order with the steps around it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run_copies_sync, plan)

    def run_copies_sync(self, plan: CopyPlan) -> CopyTimes:
        with self._lock:
            return self.host.run(plan)

    async def run_ahead(self, plan: CopyPlan) -> CopyTimes:
        """Ahead copies (engine/kv/prestage.py) on another thread, while a step runs: they read only free
        blocks and write only reserved host slots, so they take no lock."""
        return await asyncio.to_thread(self.host.run, plan, True)

    prefill_rate_hint = 15_000.0  # tokens/s of the built-in model on one CPU thread; recovery refines it online

    def store_delay(self, num_blocks: int) -> float:
        return 0.0  # real bytes move here: nothing to model

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _check(self, w: SeqWork) -> None:
        if not w.token_ids:
            raise ValueError(f"sequence {w.seq_id}: a step needs at least one new token")
        if w.context_len > self.info.max_model_len:
            raise ValueError(f"sequence {w.seq_id}: context of {w.context_len} tokens exceeds "
                             f"the model's {self.info.max_model_len}")
        if len(w.block_table) * self.block_size < w.context_len:
            raise ValueError(f"sequence {w.seq_id}: {len(w.block_table)} blocks can't hold "
                             f"{w.context_len} tokens")
        needed = w.block_table[:self._num_blocks_for(w.context_len)]
        if min(needed) < 0 or max(needed) >= self.num_blocks:
            raise ValueError(f"sequence {w.seq_id}: block ids must be in [0, {self.num_blocks})")
        if min(w.token_ids) < 0 or max(w.token_ids) >= self.config.vocab_size:
            raise ValueError(f"sequence {w.seq_id}: token ids must be in [0, {self.config.vocab_size})")

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prepare(self, works: Sequence[SeqWork]) -> StepBatch:
        """Decode rows first, then each prefill chunk; logits rows in work order."""
        bs = self.block_size
        decodes = [i for i, w in enumerate(works) if w.num_new == 1]
        prefills = [i for i, w in enumerate(works) if w.num_new > 1]
        ids = [works[i].token_ids[0] for i in decodes]
        positions = [torch.tensor([works[i].start_pos for i in decodes], dtype=torch.long)]
        slots = [torch.tensor([works[i].block_table[works[i].start_pos // bs] for i in decodes],
                              dtype=torch.long)]
        last_row = {i: row for row, i in enumerate(decodes)}  # work index -> row of its last token
        chunks = []
        for i in prefills:
            w = works[i]
            row_start = len(ids)
            last_row[i] = row_start + w.num_new - 1
            ids.extend(w.token_ids)
            pos = torch.arange(w.start_pos, w.context_len)
            positions.append(pos)
            table = torch.tensor(w.block_table[:self._num_blocks_for(w.context_len)], dtype=torch.long)
            slots.append(table[pos // bs])
            chunks.append(self._prefill_chunk(w, row_start, table))
        positions_t = torch.cat(positions)
        return StepBatch(
            input_ids=self._to_device(torch.tensor(ids, dtype=torch.long)),
            positions=self._to_device(positions_t),
            slot_blocks=self._to_device(torch.cat(slots)),
            slot_offsets=self._to_device(positions_t % bs),
            decode=self._decode_group([works[i] for i in decodes]) if decodes else None,
            prefills=chunks,
            logits_rows=self._to_device(torch.tensor(
                [last_row[i] for i, w in enumerate(works) if w.sample], dtype=torch.long)))

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def _decode_group(self, decodes: list[SeqWork]) -> DecodeGroup:
        nblk = max(self._num_blocks_for(w.context_len) for w in decodes)
        tables = []
        for w in decodes:  # pad with block 0: any valid id, masked out below
            n = self._num_blocks_for(w.context_len)
            tables.append(tuple(w.block_table[:n]) + (0,) * (nblk - n))
        context_lens = torch.tensor([w.context_len for w in decodes])
        key_mask = torch.arange(nblk * self.block_size)[None, :] < context_lens[:, None]  # (B, L)
        return DecodeGroup(len(decodes), self._to_device(torch.tensor(tables, dtype=torch.long)),
                           self._to_device(key_mask[:, None, None, :]))

    def _prefill_chunk(self, w: SeqWork, row_start: int, table: torch.Tensor) -> PrefillChunk:
        prefix = None
        if w.start_pos > 0:
            prefix = self._to_device(table[None, :self._num_blocks_for(w.start_pos)])
        return PrefillChunk(row_start, w.num_new, w.start_pos, prefix)
