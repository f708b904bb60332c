"""`TorchRunner`: the real `ModelRunner`, a Llama forward over a paged K/V pool.

`execute` runs each step on one dedicated worker thread, so the event loop stays free while
torch computes; `start_copies` (the batched host/store tier copies of engine/core/kv_copies.py,
engine/runners/model/tier_copies.py) runs on the same thread, so a batch is queued between
the steps it was planned between. `execute_sync`, `forward_logits` and `write_blocks` run in
the caller's thread; all of them take one lock, so they are safe to call from any thread
but never overlap (a step and a block copy are serialized).

A step is queued on the device without waiting (its indices packed into one host-to-device
copy, engine/runners/model/step_inputs.py; decode-only steps replayed from CUDA graphs on CUDA,
engine/runners/model/decode_graphs.py), then synchronised once: the sampled rows' argmax and
the logits sampling needs come back in one wait (engine/runners/readback.py).

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
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kvroute.engine.core.kv_copies import CopyPlan, CopyTimes
from kvroute.engine.core.work import SampledTokens, SeqWork
from kvroute.engine.kv.link_estimate import DeviceCosts
from kvroute.engine.runners import device_costs
from kvroute.engine.runners.lora_config import AdapterSpec
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.model.decode_graphs import DecodeGraphs
from kvroute.engine.runners.model.kv_pool import DTYPES, GatherSpace, KVPool
from kvroute.engine.runners.model.loader import build_model
from kvroute.engine.runners.model.lora import LoraWeights
from kvroute.engine.runners.model.step_inputs import StepInputs
from kvroute.engine.runners.model.tier_copies import HostKV
from kvroute.engine.runners.readback import HostLogits, Readback
from kvroute.engine.runners.sampling import sample_works

log = logging.getLogger(__name__)


class TorchRunner:
    def __init__(self, model_config: ModelConfig | None = None, num_blocks: int = 1024,
                 block_size: int = 16, model_dir: str | Path | None = None,
                 device: str = "cpu", num_threads: int | None = None, seed: int = 0,
                 host_blocks: int = 0, max_running: int = 64, cuda_graphs: bool = True,
                 adapters: tuple[AdapterSpec, ...] = (), max_loras: int = 1) -> None:
        """No config and no model_dir: the tiny random model. model_dir alone: its config.json.
        Decode steps of up to `max_running` sequences replay CUDA graphs when the device is CUDA
        and `cuda_graphs` (engine/runners/model/decode_graphs.py). `adapters` (LoRA, read at start)
        are applied per row from `max_loras` slots (engine/runners/model/lora.py)."""
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
        if adapters:
            self.model.lora = LoraWeights(model_config, adapters, max_loras, self.device, DTYPES[model_config.dtype])
        self.inputs = StepInputs(block_size, self.pool.scratch_block, self.device, lora=bool(adapters))
        self.space = GatherSpace(self.pool)
        self.readback = Readback(self.device)
        self.graphs, self.num_graphs = None, 0
        if cuda_graphs and self.device.type == "cuda":
            self.graphs = DecodeGraphs(self.model, self.pool, self.inputs, max_running,
                                       -(-model_config.max_position_embeddings // block_size), capture=True)
        self.info = model_config.runner_info()
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
            out = sample_works(self._step(works), sampled, self._generator)
        tokens, logprobs = iter(out), iter(out.logprobs)
        return SampledTokens([next(tokens) if w.sample else None for w in works],
                             [next(logprobs) if w.sample else None for w in works])

    def forward_logits(self, works: Sequence[SeqWork]) -> torch.Tensor:
        """Runs the step; (S, V) float32 logits, one row per work with `sample`, in order."""
        with self._lock:
            for w in works:
                self._check(w)
            with torch.inference_mode():
                logits, _ = self._forward(works)
                return logits.clone()

    def _step(self, works: Sequence[SeqWork]) -> HostLogits:
        """The step on the device, then its one synchronisation: what sampling needs, on the host."""
        for w in works:
            self._check(w)
        with torch.inference_mode():
            logits, wanted = self._forward(works)
            return self.readback.read(logits, wanted)

    def _forward(self, works: Sequence[SeqWork]) -> tuple[torch.Tensor, torch.Tensor]:
        """Queues the step's work on the device: ((S, V) logits, the `wanted` rows), nothing waited for."""
        lora = self.model.lora
        if lora is not None:
            for w in works:
                if w.adapter is not None:
                    lora.ensure(w.adapter_slot, w.adapter)  # a copy in, queued before the step
        pad = self.graphs.bucket(works) if self.graphs is not None else None
        if pad is not None and self.graphs is not None:  # a bucket: the graphs exist
            return self.graphs.run(works, pad)
        batch = self.inputs.build(works, self.space)
        return self.model(batch, self.pool), batch.wanted

    def warm_up(self, measure: bool = False) -> DeviceCosts | None:
        """Before serving: capture the decode graphs (CUDA) and, with `measure`, time the host link and the
        prefill rate on this device (engine/runners/device_costs.py)."""
        if self.graphs is not None:
            t0 = time.perf_counter()
            with self._lock, torch.inference_mode():
                self.num_graphs = self.graphs.capture_all()
            log.info("captured %d decode graphs in %.1f s", self.num_graphs, time.perf_counter() - t0)
        return device_costs.measure(self) if measure else None

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        """Raw K/V of whole blocks, all layers; layout in `engine.runners.model.kv_pool`.

        Takes no lock: callers read blocks no step writes (a pinned prefill's blocks are
        referenced, so never reallocated), and a transfer must not wait for a long step."""
        return self.pool.read_blocks(block_ids)

    def write_blocks(self, block_ids: Sequence[int], data) -> None:
        """`data`: the blocks' bytes, one bytes-like object or a sequence of them: one copy to the device."""
        with self._lock:
            self.pool.write_blocks(block_ids, data)

    @property
    def payload_bytes_per_block(self) -> int:
        """Bytes of one block's K/V as `read_blocks` returns them (what a store entry carries)."""
        return self.pool.bytes_per_block

    async def start_copies(self, plan: CopyPlan, ahead: CopyPlan) -> None:
        """Queue a batch of tier copies on the step thread, before the step it was planned for."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._start_copies, plan, ahead)

    def _start_copies(self, plan: CopyPlan, ahead: CopyPlan) -> None:
        with self._lock:
            self.host.start(plan, ahead)

    async def finish_copies(self) -> CopyTimes:
        """After the step: the batch's payloads for the store and its times."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.host.finish)

    def run_copies_sync(self, plan: CopyPlan) -> CopyTimes:
        """One batch, start to finish, in the caller's thread."""
        with self._lock:
            return self.host.run(plan)

    prefill_rate_hint = 15_000.0  # tokens/s until warm_up measures the device (with tiers), then refined online

    def store_delay(self, num_blocks: int) -> float:
        return 0.0  # real bytes move here: nothing to model

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.host.close()

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
        if w.adapter is not None or w.adapter_slot >= 0:
            lora = self.model.lora
            if lora is None or w.adapter not in lora.host or not 0 <= w.adapter_slot < lora.num_slots:
                raise ValueError(f"sequence {w.seq_id}: adapter {w.adapter!r} in slot {w.adapter_slot} is not "
                                 f"one this runner loaded")

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
