"""The paged K/V pool: one tensor, block-major, so a block's K/V for all layers is contiguous.

Layout of `KVPool.data`:

    (num_blocks + 1, num_layers, 2, block_size, num_kv_heads, head_dim)   # 2 = (K, V)

Token at position p of a sequence lives in block `block_table[p // block_size]` at offset
`p % block_size`. K is stored after RoPE, as Hugging Face's cache stores it. The last block
(`scratch_block`) belongs to no sequence: padded rows of a replayed decode graph write there
and padded block tables point there.

Attention reads a step's context blocks straight from the pool into a `GatherSpace`, buffers
allocated once and reused by every layer (no allocation, no concatenation per layer).

`read_blocks` / `write_blocks` move whole blocks as raw bytes in exactly that layout
(blocks in the order given, then layer, then K before V, then offset, head, dim; the pool's
dtype, native byte order), so `kv_bytes_per_block` bytes per block: one device-to-host or
host-to-device copy each, through a pinned staging buffer on CUDA (engine/runners/model/staging.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from kvroute.engine.runners.model.staging import Staging, fill_bytes, gather_to

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class GatherSpace:
    """K and V buffers of `capacity` blocks, (capacity, block_size, kvh, hd) each; grown on demand."""

    def __init__(self, pool: KVPool, capacity: int = 0) -> None:
        self.shape, self.dtype, self.device = pool.data.shape[3:], pool.data.dtype, pool.data.device
        self.k = self.v = torch.empty(0, *self.shape, dtype=self.dtype, device=self.device)
        self.ensure(capacity)

    def ensure(self, blocks: int) -> None:
        if blocks > self.k.shape[0]:
            blocks = max(blocks, 2 * self.k.shape[0])
            self.k = torch.empty(blocks, *self.shape, dtype=self.dtype, device=self.device)
            self.v = torch.empty_like(self.k)


class KVPool:
    def __init__(self, num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a KV pool needs a positive number of blocks and block size")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        self.data = torch.zeros(num_blocks + 1, num_layers, 2, block_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)
        self.device = self.data.device
        self._reads, self._writes = Staging(self.device), Staging(self.device)
        self._read_lock = threading.Lock()  # reads take no runner lock (engine/runners/torch_runner.py)

    @property
    def bytes_per_block(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def layer(self, layer: int) -> torch.Tensor:
        return self.data[:, layer]  # (num_blocks + 1, 2, block_size, kvh, hd), a strided view

    def write(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (T, kvh, hd) for the T slots (blocks[i], offsets[i])."""
        kv = self.layer(layer)
        kv[blocks, 0, offsets] = k
        kv[blocks, 1, offsets] = v

    def gather(self, layer: int, block_ids: torch.Tensor, space: GatherSpace) -> tuple[torch.Tensor, torch.Tensor]:
        """block_ids: (n,) -> K, V each (n * block_size, kvh, hd), views of `space` (valid until the next gather)."""
        n, kv = block_ids.shape[0], self.layer(layer)
        k = torch.index_select(kv[:, 0], 0, block_ids, out=space.k[:n])
        v = torch.index_select(kv[:, 1], 0, block_ids, out=space.v[:n])
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        with torch.inference_mode(), self._read_lock:
            index = self._index(block_ids)
            host = self._reads.take(len(block_ids) * self.bytes_per_block)
            gather_to(host.view(self.data.dtype).view(len(block_ids), *self.data.shape[1:]), self.data, index)
            self._reads.fence()
            self._reads.wait()  # the one synchronisation: the bytes must be there
            return host.numpy().tobytes()

    def write_blocks(self, block_ids: Sequence[int], data) -> None:
        """`data`: the blocks' bytes, as one bytes-like object or a sequence of them (one copy to the device)."""
        payloads = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        expected = len(block_ids) * self.bytes_per_block
        got = sum(len(p) for p in payloads)
        if got != expected:
            raise ValueError(f"expected {expected} bytes for {len(block_ids)} blocks, got {got}")
        with torch.inference_mode():
            index = self._index(block_ids)
            host = self._writes.take(expected)
            fill_bytes(host, payloads)
            chunk = host.view(self.data.dtype).view(len(block_ids), *self.data.shape[1:])
            self.data.index_copy_(0, index, chunk.to(self.device, non_blocking=True))
            self._writes.fence()

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        index = torch.tensor(list(block_ids), dtype=torch.long)
        if index.numel() and (index.min() < 0 or index.max() >= self.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.num_blocks})")
        return index.to(self.device)
