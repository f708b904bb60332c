"""Progress, not presence: whether an engine that holds work is moving.

A load report proves that an engine's HTTP server lives, not that its step loop does: a step that
never ends (a GPU hang behind a live HTTP thread, a stuck runner) leaves /load and /kv/events
answering while no request advances. So engines report a counter that only grows while they work
(`LoadRecord.progress`: the tokens their finished steps computed; vLLM's prompt and generation
token counters; SGLang's `sglang:realtime_tokens_total`, router/fleet/kinds/), and the router
notes when it last saw an engine move (`Instance.progress_seen`, time.monotonic()): a report whose
counter changed, a report saying it is idle (nothing running or waiting: an idle engine is never
stalled), or any report from an engine without a counter (presence is all it offers).

Two decisions use it, with the same patience, `--first-byte-timeout-s`:

- a whole (non-streamed) answer awaited from an engine that has not moved for that long is given
  up on and retried elsewhere (router/service/attempt_deadlines.py);
- an engine that holds work and has not moved for that long is *stalled*: out of routing until a
  report shows it moving again (`ProgressWatch`), whatever its health checks say.
"""

from __future__ import annotations

import logging
import time

from kvroute.router.contract.protocol import LoadRecord

log = logging.getLogger(__name__)


def moved(previous: LoadRecord | None, load: LoadRecord) -> bool:
    """Whether `load` shows the engine moving since `previous`, its last report (None: the first)."""
    return (previous is None or load.progress < 0 or load.progress != previous.progress
            or not (load.running or load.waiting))


def still_for(inst, now: float) -> float:
    """Seconds `inst` has held work without moving, by its last report (0 when idle or moving)."""
    load = inst.load
    if load is None or not (load.running or load.waiting):
        return 0.0
    return max(0.0, now - inst.progress_seen)


class ProgressWatch:
    """Takes a stalled engine out of routing and brings it back once it moves; run on each load report."""

    def __init__(self, patience_s: float, metrics) -> None:
        """`metrics`: its `stalls` counter and routable gauge (router/fleet/metrics.py FleetMetrics)."""
        self.patience_s, self.metrics = patience_s, metrics

    def observe(self, inst) -> None:
        still = still_for(inst, time.monotonic())
        stalled = still >= self.patience_s
        if stalled == inst.stalled:
            return
        inst.stalled = stalled
        if stalled:
            self.metrics.stalls.inc()
            log.warning("instance %s holds %d running and %d waiting requests and has made no progress for "
                        "%.1fs (--first-byte-timeout-s): out of routing until it moves", inst.id, inst.load.running,
                        inst.load.waiting, still)
        else:
            log.warning("instance %s makes progress again: back in routing", inst.id)
        self.metrics.bound(self.metrics.healthy, inst.id).set(1 if inst.routable else 0)
