"""A step's works as the model's `StepBatch`: every index the step needs, packed into one host
buffer of int64 and moved to the device in one copy (from pinned memory on CUDA: no wait).

Rows: decodes (one new token each) first, then each prefill chunk; logits rows in work order.
Packed sections, in order:

    ids (T) | positions (T) | slot blocks (T) | slot offsets (T) | logits rows (S)
    | decode block ids (B * nblk) | decode context lengths (B) | adapter slots (T, or nothing)
    | wanted (R: which of the S logits rows sampling needs on the host) | each chunk's context block ids

Adapter slots (each row's LoRA slot, -1 for none: engine/runners/model/lora.py) are packed only
by an engine with adapters, and only for a step in which some row has one, or a padded step (a
CUDA graph applies the adapters whatever its rows hold).

`pad` (a decode-only step replayed from a CUDA graph, engine/runners/model/decode_graphs.py)
lays the decodes out for B' >= B rows and nblk' >= nblk blocks, so every section sits at the
same offset in every step of that bucket: padded rows hold token 0 at position 0, write into the
pool's scratch block and see only it; padded table entries are the scratch block too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from kvroute.engine.core.work import SeqWork
from kvroute.engine.runners.model.kv_pool import GatherSpace
from kvroute.engine.runners.model.llama import DecodeGroup, PrefillChunk, StepBatch
from kvroute.engine.runners.model.staging import Staging


@dataclasses.dataclass(frozen=True, slots=True)
class Padding:
    rows: int  # B' decode rows
    blocks: int  # nblk' blocks per row


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class StepInputs:
    def __init__(self, block_size: int, scratch_block: int, device: torch.device, lora: bool = False) -> None:
        self.block_size = block_size
        self.lora = lora  # the engine has adapter slots
        self.scratch = scratch_block
        self.device = device
        self.staging = Staging(device, torch.long)

    def pack(self, works: Sequence[SeqWork], pad: Padding | None = None) -> tuple[list[int], list[int]]:
        """(the packed ints, section lengths) of a step, decodes padded to `pad` when given."""
        bs = self.block_size
        decodes = [w for w in works if w.num_new == 1]
        prefills = [w for w in works if w.num_new > 1]
        rows = pad.rows if pad else len(decodes)
        nblk = pad.blocks if pad else max((blocks_for(w.context_len, bs) for w in decodes), default=0)
        idle = rows - len(decodes)
        ids = [w.token_ids[0] for w in decodes] + [0] * idle
        pos = [w.start_pos for w in decodes] + [0] * idle
        blocks = [w.block_table[w.start_pos // bs] for w in decodes] + [self.scratch] * idle
        offsets = [w.start_pos % bs for w in decodes] + [0] * idle
        tables: list[int] = []
        chunks: list[tuple[int, ...]] = []
        lens = [w.context_len for w in decodes] + [1] * idle
        for w in decodes:
            n = blocks_for(w.context_len, bs)
            tables += w.block_table[:n]
            tables += [self.scratch] * (nblk - n)
        tables += [self.scratch] * (nblk * idle)
        adapters = self._adapters(decodes, prefills, idle, pad)
        last_row, row = {id(w): i for i, w in enumerate(decodes)}, rows
        for w in prefills:
            ids += w.token_ids
            span = range(w.start_pos, w.context_len)
            pos += span
            blocks += [w.block_table[p // bs] for p in span]
            offsets += [p % bs for p in span]
            row += w.num_new
            last_row[id(w)] = row - 1
            if w.start_pos > 0:
                chunks.append(w.block_table[:blocks_for(w.context_len, bs)])
        sampled = list(range(rows)) if pad else [last_row[id(w)] for w in works if w.sample]
        wanted = [i for i, w in enumerate(w for w in works if w.sample) if w.sampling.needs_logits]
        sections = [ids, pos, blocks, offsets, sampled, tables, lens, adapters, wanted, *chunks]
        return [x for s in sections for x in s], [len(s) for s in sections]

    def _adapters(self, decodes: list[SeqWork], prefills: list[SeqWork], idle: int, pad: Padding | None) -> list[int]:
        if not self.lora or (pad is None and all(w.adapter_slot < 0 for w in (*decodes, *prefills))):
            return []
        out = [w.adapter_slot for w in decodes] + [-1] * idle
        for w in prefills:
            out += [w.adapter_slot] * w.num_new
        return out

    def to_device(self, flat: list[int]) -> torch.Tensor:
        """One copy of the packed ints to the device (the staging buffer is reused once it has left)."""
        host = self.staging.take(len(flat))
        host.numpy()[:] = flat
        if self.device.type == "cpu":
            return host
        dev = host.to(self.device, non_blocking=True)
        self.staging.fence()
        return dev

    def build(self, works: Sequence[SeqWork], space: GatherSpace) -> StepBatch:
        flat, lengths = self.pack(works)
        return batch_from(self.to_device(flat), lengths, works, space)


def batch_from(packed: torch.Tensor, lengths: list[int], works: Sequence[SeqWork], space: GatherSpace) -> StepBatch:
    """The `StepBatch` over views of `packed` (on the device), sections of `lengths`."""
    parts, at = [], 0
    for n in lengths:
        parts.append(packed[at:at + n])
        at += n
    ids, pos, blocks, offsets, sampled, tables, lens, adapters, wanted, *chunk_blocks = parts
    chunks, it, row = [], iter(chunk_blocks), len(lens)
    for w in works:
        if w.num_new > 1:
            chunks.append(PrefillChunk(row, w.num_new, w.start_pos, next(it) if w.start_pos > 0 else None))
            row += w.num_new
    space.ensure(max([len(tables)] + [len(c) for c in chunk_blocks]))
    return StepBatch(input_ids=ids, positions=pos, slot_blocks=blocks, slot_offsets=offsets,
                     decode=DecodeGroup(len(lens), tables, lens) if len(lens) else None,
                     prefills=chunks, logits_rows=sampled, wanted=wanted, space=space,
                     adapter_rows=adapters if lengths[7] else None)
