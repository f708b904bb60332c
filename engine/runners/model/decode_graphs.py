"""Decode steps replayed from CUDA graphs, one graph per (batch, context) bucket.

A decode-only step launches the same few hundred kernels every time for a given batch size and
context length; on a GPU, launching them from Python costs more than running them. So on CUDA a
decode step whose B sequences and nblk context blocks fit a bucket (B' from `BATCH_BUCKETS`, nblk'
a power of two from `MIN_CONTEXT_BLOCKS`, B' * nblk' * block size at most `MAX_GRAPH_TOKENS`) is
padded to it (engine/runners/model/step_inputs.py `Padding`), its packed indices copied into the
static input buffer the bucket's graph reads (one host-to-device copy), and the graph replayed:
embedding to logits, every layer's attention gathering into one static `GatherSpace`. All graphs
share one memory pool and are captured at start-up (`capture_all`), largest first, as vLLM and
nano-vllm do; a step that fits no bucket, or any step with a prefill chunk, runs eagerly.

Elsewhere (CPU, MPS) nothing is captured; `DecodeGraphs(..., capture=False)` runs the same padded
path eagerly, which is how the tests check the padding on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvroute.engine.core.work import SeqWork
from kvroute.engine.runners.model.kv_pool import GatherSpace, KVPool
from kvroute.engine.runners.model.llama import Llama
from kvroute.engine.runners.model.step_inputs import Padding, StepInputs, batch_from, blocks_for

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_CONTEXT_BLOCKS = 16
MAX_GRAPH_TOKENS = 1 << 18  # gathered context of one graphed step: B' x nblk' x block size


class DecodeGraphs:
    def __init__(self, model: Llama, pool: KVPool, inputs: StepInputs, max_batch: int, max_blocks: int,
                 capture: bool) -> None:
        self.model, self.pool, self.inputs, self.capture = model, pool, inputs, capture
        bs = pool.block_size
        self.batches = [b for b in BATCH_BUCKETS if b < max_batch] + [max_batch]
        blocks, n = [], MIN_CONTEXT_BLOCKS
        while n < max_blocks:
            blocks.append(n)
            n *= 2
        self.blocks = blocks + [max_blocks]
        self.buckets = [Padding(b, n) for b in self.batches for n in self.blocks if b * n * bs <= MAX_GRAPH_TOKENS]
        largest = max((p.rows * (p.blocks + 8) for p in self.buckets), default=0)
        self.static = torch.zeros(largest, dtype=torch.long, device=pool.device)  # packed inputs, see step_inputs
        self.space = GatherSpace(pool, max((p.rows * p.blocks for p in self.buckets), default=0))
        self.mempool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[Padding, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket -> (graph, logits)

    def bucket(self, works: Sequence[SeqWork]) -> Padding | None:
        """The smallest bucket holding this step, None if it must run eagerly."""
        if not works or any(w.num_new != 1 or not w.sample for w in works):
            return None
        nblk = max(blocks_for(w.context_len, self.pool.block_size) for w in works)
        fits = [p for p in self.buckets if p.rows >= len(works) and p.blocks >= nblk]
        return min(fits, key=lambda p: (p.rows * p.blocks, p.rows)) if fits else None

    def run(self, works: Sequence[SeqWork], pad: Padding) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay `pad`'s graph for these decodes: (their (B, V) float32 logits, the `wanted` rows)."""
        flat, lengths = self.inputs.pack(works, pad)
        self._load(flat)
        graph, logits = self.graphs.get(pad) or self._capture(pad, lengths)
        if graph is None or logits is None:  # not capturing (both None): the same padded step, eagerly
            logits = self.model(batch_from(self.static, lengths, (), self.space), self.pool)
        else:
            graph.replay()
        wanted_at = sum(lengths[:8])
        return logits[:len(works)], self.static[wanted_at:wanted_at + lengths[8]]

    def capture_all(self) -> int:
        """Capture every bucket's graph now (start-up), largest first; returns how many."""
        for pad in sorted(self.buckets, key=lambda p: -p.rows * p.blocks):
            if pad not in self.graphs:
                flat, lengths = self.inputs.pack((), pad)
                self._load(flat)
                self._capture(pad, lengths)
        return len(self.graphs)

    def _load(self, flat: list[int]) -> None:
        host = self.inputs.staging.take(len(flat))
        host.numpy()[:] = flat
        self.static[:len(flat)].copy_(host, non_blocking=True)
        self.inputs.staging.fence()

    def _capture(self, pad: Padding, lengths: list[int]
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | tuple[None, None]:
        """Warm up and capture the bucket's forward over the static inputs (which hold a valid step)."""
        batch = batch_from(self.static, lengths[:8] + [0], (), self.space)
        if not self.capture:
            return None, None
        device = self.pool.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisations (cuBLAS workspaces, kernels) happen outside the capture
                self.model(batch, self.pool)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model(batch, self.pool)
        self.graphs[pad] = (graph, logits)
        return graph, logits
