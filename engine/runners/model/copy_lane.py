"""Where tier copies run beside the model's steps: a copy stream on CUDA, a thread for the host side.

On CUDA, `CopyLane.stream` is a stream of its own: copies queued there overlap the compute stream's
kernels. `after_compute()` makes the lane's next copies wait for the kernels queued so far (they
wrote the blocks a copy reads); `before_compute(event)` makes the compute stream's next kernels
wait for a copy (it wrote blocks the step reads, or read blocks the step overwrites). Neither
blocks the host. Elsewhere there is one stream: the copies run in order with the step and these
do nothing.

`submit(fn)` runs host work (scattering a finished device-to-host copy into host slots, turning
blocks into bytes) on the lane's thread while the runner's thread goes on with the next step;
`wait()` returns its result.
"""

from __future__ import annotations

import concurrent.futures
import contextlib

import torch


class CopyLane:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kv-copies")
        self._future: concurrent.futures.Future | None = None

    def on_lane(self):
        """Context in which device copies are queued on the lane."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def after_compute(self) -> None:
        if self.stream is not None:  # on CUDA
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def mark(self):
        """An event at this point of the lane (None off CUDA): later `before_compute` or `done` calls use it."""
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def before_compute(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    @staticmethod
    def seconds(start, end, fallback: float) -> float:
        """Device time between two marks once both have passed (the host's measure off CUDA)."""
        if start is None or end is None:
            return fallback
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def submit(self, fn) -> None:
        self.wait()
        self._future = self._thread.submit(fn)

    def wait(self):
        future, self._future = self._future, None
        return future.result() if future is not None else None

    def close(self) -> None:
        self.wait()
        self._thread.shutdown(wait=True)
