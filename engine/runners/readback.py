"""The step's one synchronisation with the host: what sampling needs, off the device in one go.

The device computes each sampled row's argmax (a greedy row's token); only the rows whose
sampling needs logits on the host (temperature, logit edits, logprobs: `StepBatch.wanted`)
are copied whole. Both copies go into pinned staging buffers without blocking, then one wait
for the stream covers them (and the step's kernels before them). `syncs` counts the waits:
a test holds it to one per step.
"""

from __future__ import annotations

import dataclasses

import torch

from kvroute.engine.runners.model.staging import Staging


@dataclasses.dataclass(slots=True)
class HostLogits:
    greedy: list[int]  # argmax of every sampled row
    logits: torch.Tensor | None  # (R, V) float32 in host memory: the wanted rows, in order; None if R == 0


class Readback:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_host = device.type == "cpu"
        self._ids = Staging(device, torch.long)
        self._rows = Staging(device, torch.float32)
        self.syncs = 0

    def read(self, logits: torch.Tensor, wanted: torch.Tensor) -> HostLogits:
        """logits: (S, V) float32 on the device; wanted: (R,) long rows of it -> the host's view."""
        greedy = logits.argmax(dim=-1)
        rows = logits.index_select(0, wanted) if wanted.numel() else None
        if self.on_host:
            self.syncs += 1  # nothing to wait for: counted as the step's synchronisation all the same
            return HostLogits(greedy.tolist(), rows)
        ids = self._ids.take(greedy.numel())
        ids.copy_(greedy, non_blocking=True)
        host_rows = None
        if rows is not None:
            host_rows = self._rows.take(rows.numel()).view(rows.shape)
            host_rows.copy_(rows, non_blocking=True)
        self._ids.fence()
        self._rows.fence()
        self.syncs += 1
        synchronize(self.device)
        return HostLogits(ids.tolist(), host_rows)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device`'s current stream."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()
