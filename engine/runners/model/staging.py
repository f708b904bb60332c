"""Host staging buffers for copies between host memory and the device, and the copy's completion.

A copy between pageable host memory and a CUDA device is synchronous and staged by the driver
through a small pinned buffer of its own; from pinned memory it is one DMA that runs
asynchronously. So every transfer of K/V goes through a `Staging` buffer: pinned when the
device is CUDA, plain host memory elsewhere (where a "transfer" is a memcpy). A buffer may
be refilled only once the copy that last read or wrote it is done: `fence()` records that
point on the current stream, `wait()` blocks until it has passed (nothing to wait for on CPU).
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    def __init__(self, device: torch.device, dtype: torch.dtype = torch.uint8) -> None:
        self.device = device
        self.dtype = dtype
        self.pinned = device.type == "cuda"
        self.buffer = torch.empty(0, dtype=dtype, pin_memory=self.pinned)
        self._event: torch.cuda.Event | None = None

    def take(self, numel: int) -> torch.Tensor:
        """A buffer of `numel` elements, free to fill (the last copy through it has finished)."""
        self.wait()
        if self.buffer.numel() < numel:  # grows by doubling: pinned allocations are slow, so rare
            self.buffer = torch.empty(max(numel, 2 * self.buffer.numel()), dtype=self.dtype, pin_memory=self.pinned)
        return self.buffer[:numel]

    def fence(self, stream=None) -> None:
        """The copies queued so far (on `stream`, else the current one) use the buffer: later `take`s wait."""
        if self.pinned:
            self._event = torch.cuda.Event()
            self._event.record(stream)

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None


def fill_bytes(dest: torch.Tensor, payloads) -> None:
    """Copy `payloads` (bytes-like, one after the other) into the uint8 tensor `dest`, which they fill."""
    view = dest.numpy()
    offset = 0
    for payload in payloads:
        n = len(payload)
        view[offset:offset + n] = np.frombuffer(payload, dtype=np.uint8)
        offset += n
    if offset != dest.numel():
        raise ValueError(f"expected {dest.numel()} bytes, got {offset}")


def gather_to(dest: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    """dest[i] = src[index[i]] along dim 0, `dest` in host memory: one gather, one copy off the device."""
    if src.device == dest.device:
        torch.index_select(src, 0, index, out=dest)
    else:
        dest.copy_(src.index_select(0, index), non_blocking=True)
