"""The host tier's K/V bytes and the batched copies between it and the device pool (torch).

`HostKV.data` has the device pool's layout (engine/runners/model/kv_pool.py):

    (num_host_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)

in host memory (no rows without a host tier: a batch then only reads device blocks for the
store), pinned when the device is CUDA. Each step's batch (engine/core/kv_copies.py: the plan,
and the ahead copies of engine/kv/prestage.py) is at most one copy per direction, queued on the
copy lane (engine/runners/model/copy_lane.py) by `start` before the step:

- device -> host: the device blocks read for the store, evicted now and staged ahead, gathered
  in one `index_select` and copied to a pinned staging buffer in one transfer; the step waits
  only for the gather (it may reuse those blocks), the transfer overlaps its kernels;
- host -> device: the host slots loaded back and the store bytes fetched, staged into one pinned
  buffer on the host and copied in one transfer, scattered into their device blocks; the step
  waits for that.

Host slots read by the plan (for the store, for a load) are read before anything is written to
a slot. After the step, `finish` takes what the lane's thread did meanwhile: the staged rows
scattered into their host slots and the store's payloads as bytes; it returns the batch's bytes
and seconds per direction (device time from the stream's events on CUDA).
"""

from __future__ import annotations

import collections
import dataclasses
import time

import torch

from kvroute.engine.core.kv_copies import CopyPlan, CopyTimes
from kvroute.engine.runners.model.copy_lane import CopyLane
from kvroute.engine.runners.model.kv_pool import KVPool
from kvroute.engine.runners.model.staging import Staging, fill_bytes


@dataclasses.dataclass(slots=True)
class _Batch:
    slots: list[int]  # host slots of the device-to-host rows after the store reads
    num_reads: int  # leading rows read for the store
    host_payloads: list[bytes]  # the plan's host reads, in order
    marks: tuple  # lane events: start, gathered, out copied, in copied
    host_s: tuple[float, float]  # host-measured seconds: out, in
    in_bytes: int


class HostKV:
    def __init__(self, num_blocks: int, pool: KVPool) -> None:
        if num_blocks < 0:
            raise ValueError(f"the host pool cannot have a negative size, got {num_blocks}")
        self.pool = pool
        self.device = pool.device
        self.pinned = self.device.type == "cuda"
        self.row_shape = pool.data.shape[1:]
        self.data = torch.zeros((num_blocks, *self.row_shape), dtype=pool.data.dtype, pin_memory=self.pinned)
        self.lane = CopyLane(self.device)
        self._out, self._in = Staging(self.device, pool.data.dtype), Staging(self.device, pool.data.dtype)
        self._ids = Staging(self.device, torch.long)
        self.transfers: collections.Counter[str] = collections.Counter()  # copies made, by direction
        self.moved: collections.Counter[str] = collections.Counter()  # bytes copied, by direction
        self._batch: _Batch | None = None

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    def start(self, plan: CopyPlan, ahead: CopyPlan) -> None:
        """Queue the batch (`ahead`'s device-to-host copies join the plan's) before the step."""
        t0 = time.perf_counter()
        host_payloads = [self._bytes(self.data[slot]) for slot, _ in plan.host_reads]
        out_ids = [b for b, _ in plan.device_reads] + [b for b, _ in plan.d2h] + [b for b, _ in ahead.d2h]
        in_ids = [b for _, b in plan.h2d] + [b for b, _ in plan.writes]
        ids = self._device_ids(out_ids + in_ids)
        lane, rows = self.lane, None
        lane.after_compute()
        with torch.inference_mode(), lane.on_lane():
            start = gathered = lane.mark()
            if out_ids:
                rows = self._out.take(len(out_ids) * self._row_numel).view(len(out_ids), *self.row_shape)
                gathered = self._gather(rows, ids[:len(out_ids)])
                self._count("d2h", rows)
            copied_out = lane.mark()
            t1 = time.perf_counter()
            in_bytes = self._load(plan, ids[len(out_ids):]) if in_ids else 0
            copied_in = lane.mark()
        lane.before_compute(copied_in if in_ids else gathered)
        t2 = time.perf_counter()
        slots = [s for _, s in plan.d2h] + [s for _, s in ahead.d2h]
        self._batch = _Batch(slots, len(plan.device_reads), host_payloads, (start, gathered, copied_out, copied_in),
                             (t1 - t0, t2 - t1), in_bytes)
        if rows is not None:
            lane.submit(lambda: self._land(rows, slots, len(plan.device_reads), copied_out))

    def finish(self) -> CopyTimes:
        """After the step: the batch's payloads for the store (the plan's reads, in order) and times."""
        batch, self._batch = self._batch, None
        if batch is None:
            return CopyTimes([])
        landed: tuple[list[bytes], float] = self.lane.wait() or ([], 0.0)
        payloads, scatter_s = landed
        start, gathered, copied_out, copied_in = batch.marks
        out_s = CopyLane.seconds(start, copied_out, batch.host_s[0]) + scatter_s
        in_s = batch.host_s[1] if copied_in is None else CopyLane.seconds(copied_out, copied_in, batch.host_s[1])
        return CopyTimes(payloads + batch.host_payloads, d2h_s=out_s, h2d_s=in_s, h2d_bytes=batch.in_bytes)

    def run(self, plan: CopyPlan) -> CopyTimes:
        """One batch start to finish (tests, start-up measurements)."""
        self.start(plan, CopyPlan())
        return self.finish()

    def close(self) -> None:
        self.lane.close()

    @property
    def _row_numel(self) -> int:
        return self.data[0].numel() if self.num_blocks else self.pool.data[0].numel()

    def _gather(self, rows: torch.Tensor, ids: torch.Tensor):
        """The device-to-host copy of blocks `ids` into `rows`; the lane's mark once they are gathered."""
        if self.device.type == "cpu":
            torch.index_select(self.pool.data, 0, ids, out=rows)  # the "device" is host memory: one copy
            return None
        chunk = self.pool.data.index_select(0, ids)
        gathered = self.lane.mark()  # the step may overwrite the blocks from here on (None off CUDA)
        rows.copy_(chunk, non_blocking=True)
        return gathered

    def _load(self, plan: CopyPlan, dest: torch.Tensor) -> int:
        """The host-to-device copy: host slots, then store bytes, through one staging buffer."""
        n = len(plan.h2d) + len(plan.writes)
        staged = self._in.take(n * self._row_numel).view(n, *self.row_shape)
        if plan.h2d:
            slots = torch.tensor([s for s, _ in plan.h2d], dtype=torch.long)
            torch.index_select(self.data, 0, slots, out=staged[:len(plan.h2d)])
        if plan.writes:
            fill_bytes(staged[len(plan.h2d):].view(-1).view(torch.uint8), [blob for _, blob in plan.writes])
        moved = staged.to(self.device, non_blocking=True)
        self.pool.data.index_copy_(0, dest, moved)
        self._in.fence()
        self._count("h2d", moved)
        return moved.numel() * moved.element_size()

    def _land(self, rows: torch.Tensor, slots: list[int], num_reads: int, copied) -> tuple[list[bytes], float]:
        """On the lane's thread, once the copy is done: rows to their host slots, the store's rows as bytes."""
        if copied is not None:
            copied.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            if slots:
                self.data.index_copy_(0, torch.tensor(slots, dtype=torch.long), rows[num_reads:])
            payloads = [self._bytes(rows[i]) for i in range(num_reads)]
        return payloads, time.perf_counter() - t0

    def _device_ids(self, ids: list[int]) -> torch.Tensor:
        """The batch's device block ids on the device, in one small copy on the lane."""
        host = self._ids.take(len(ids))
        host.numpy()[:] = ids
        if self.device.type == "cpu":
            return host
        with self.lane.on_lane():
            dev = host.to(self.device, non_blocking=True)
            self._ids.fence()
        return dev

    def _count(self, direction: str, t: torch.Tensor) -> None:
        self.transfers[direction] += 1
        self.moved[direction] += t.numel() * t.element_size()

    @staticmethod
    def _bytes(t: torch.Tensor) -> bytes:
        return t.contiguous().view(torch.uint8).numpy().tobytes()
