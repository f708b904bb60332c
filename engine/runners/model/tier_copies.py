"""The host tier's K/V bytes and the batched copies between it and the device pool (torch).

`HostKV.data` has the device pool's layout (engine/runners/model/kv_pool.py):

    (num_host_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)

in host memory (no rows without a host tier: the plan then only reads device blocks
for the store), pinned when the device is CUDA (so host-to-device copies can run
asynchronously). `run` executes one `CopyPlan` (engine/kv/kv_copies.py) in its order,
one gather/scatter per part: reads for the store, device -> host, host -> device,
store bytes -> device. On CUDA the device -> host part waits for its bytes (the host
slots may be read by the next part), while the host -> device copies are queued on
the compute stream without blocking the host thread, so they overlap with the
preparation of the step that follows and run before its kernels. Ahead batches
(`ahead=True`) use a copy stream of their own on CUDA.
"""

from __future__ import annotations

import contextlib
import time

import torch

from engine.kv.kv_copies import CopyPlan, CopyTimes
from engine.runners.model.kv_pool import KVPool


class HostKV:
    def __init__(self, num_blocks: int, pool: KVPool) -> None:
        if num_blocks < 0:
            raise ValueError(f"the host pool cannot have a negative size, got {num_blocks}")
        self.pool = pool
        self.device = pool.data.device
        self.pinned = self.device.type == "cuda"
        self.data = torch.zeros((num_blocks, *pool.data.shape[1:]), dtype=pool.data.dtype, pin_memory=self.pinned)
        # Ahead copies (engine/kv/prestage.py) run on their own CUDA stream, so they overlap the step's kernels;
        # the blocks they read were written by steps that have finished (sampling waited for them).
        self.copy_stream = torch.cuda.Stream(self.device) if self.pinned else None

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    def run(self, plan: CopyPlan, ahead: bool = False) -> CopyTimes:
        stream = torch.cuda.stream(self.copy_stream) if ahead and self.copy_stream is not None \
            else contextlib.nullcontext()
        with torch.inference_mode(), stream:
            t0 = time.perf_counter()
            payloads = self._read_device([b for b, _ in plan.device_reads])
            payloads += [self._raw(self.data.index_select(0, _index(plan.host_reads)))]
            payloads = _split(b"".join(payloads), len(plan.device_reads) + len(plan.host_reads))
            t1 = time.perf_counter()
            if plan.d2h:
                dev_ids, slots = zip(*plan.d2h)
                chunk = self.pool.data.index_select(0, _ids(dev_ids, self.device)).cpu()
                self.data.index_copy_(0, _ids(slots), chunk)
            t2 = time.perf_counter()
            if plan.h2d:
                slots, dev_ids = zip(*plan.h2d)
                chunk = torch.empty((len(slots), *self.data.shape[1:]), dtype=self.data.dtype, pin_memory=self.pinned)
                torch.index_select(self.data, 0, _ids(slots), out=chunk)  # pinned staging: the copy can be async
                self.pool.data.index_copy_(0, _ids(dev_ids, self.device), chunk.to(self.device, non_blocking=True))
            if plan.writes:
                dev_ids, blobs = zip(*plan.writes)
                self.pool.write_blocks(list(dev_ids), b"".join(blobs))
            t3 = time.perf_counter()
        return CopyTimes(payloads, read_s=t1 - t0, d2h_s=t2 - t1, h2d_s=t3 - t2)

    def _read_device(self, ids: list[int]) -> list[bytes]:
        return [self.pool.read_blocks(ids)] if ids else []

    @staticmethod
    def _raw(t: torch.Tensor) -> bytes:
        return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _ids(values, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long, device=device)


def _index(reads: list[tuple[int, object]]) -> torch.Tensor:
    return _ids([slot for slot, _ in reads])


def _split(blob: bytes, n: int) -> list[bytes]:
    if n == 0:
        return []
    size = len(blob) // n
    return [blob[i * size:(i + 1) * size] for i in range(n)]
