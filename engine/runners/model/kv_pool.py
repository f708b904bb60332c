"""The paged K/V pool: one tensor, block-major, so a block's K/V for all layers is contiguous.

Layout of `KVPool.data`:

    (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)   # 2 = (K, V)

Token at position p of a sequence lives in block `block_table[p // block_size]` at offset
`p % block_size`. K is stored after RoPE, as Hugging Face's cache stores it.

`read_blocks` / `write_blocks` move whole blocks as raw bytes in exactly that layout
(blocks in the order given, then layer, then K before V, then offset, head, dim; the pool's
dtype, native byte order), so `kv_bytes_per_block` bytes per block.
"""

from __future__ import annotations

from typing import Sequence

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class KVPool:
    def __init__(self, num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a KV pool needs a positive number of blocks and block size")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.data = torch.zeros(num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)

    @property
    def bytes_per_block(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def layer(self, layer: int) -> torch.Tensor:
        return self.data[:, layer]  # (num_blocks, 2, block_size, kvh, hd), a strided view

    def write(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (T, kvh, hd) for the T slots (blocks[i], offsets[i])."""
        kv = self.layer(layer)
        kv[blocks, 0, offsets] = k
        kv[blocks, 1, offsets] = v

    def gather(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """block_tables: (B, nblk) -> K, V each (B, kvh, nblk * block_size, hd)."""
        b, nblk = block_tables.shape
        ids = block_tables.reshape(-1)
        kv = self.layer(layer)
        k = kv[:, 0].index_select(0, ids).view(b, nblk * self.block_size, *kv.shape[-2:])
        v = kv[:, 1].index_select(0, ids).view(b, nblk * self.block_size, *kv.shape[-2:])
        return k.transpose(1, 2), v.transpose(1, 2)  # (B, nblk * bs, kvh, hd) -> (B, kvh, L, hd)

    def read_blocks(self, block_ids: Sequence[int]) -> bytes:
        with torch.inference_mode():
            index = self._index(block_ids)
            chunk = self.data.index_select(0, index).contiguous().cpu()
            return chunk.view(torch.uint8).numpy().tobytes()

    def write_blocks(self, block_ids: Sequence[int], data: bytes | bytearray | memoryview) -> None:
        expected = len(block_ids) * self.bytes_per_block
        if len(data) != expected:
            raise ValueError(f"expected {expected} bytes for {len(block_ids)} blocks, got {len(data)}")
        with torch.inference_mode():
            index = self._index(block_ids)
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            chunk = raw.view(self.data.dtype).view(len(block_ids), *self.data.shape[1:])
            self.data.index_copy_(0, index, chunk.to(self.data.device))

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        index = torch.tensor(list(block_ids), dtype=torch.long)
        if index.numel() and (index.min() < 0 or index.max() >= self.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.num_blocks})")
        return index.to(self.data.device)
