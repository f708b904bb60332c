"""What a torch engine measures on its device at start-up, for recovery and for the routers' credit.

- the host link, each direction: batches of 1 to 32 blocks through the very copy path the tiers
  use (engine/runners/model/tier_copies.py: one gather and one transfer through pinned staging
  on CUDA), `seconds = latency + bytes / bandwidth` fitted over the medians;
- the prefill rate: one prompt of `PREFILL_TOKENS` after a warm-up run.

They replace the engine's starting figures (engine/kv/recovery.py `Recovery.use_measured`) before
it serves; the online estimates refine them from there. Both runs write into blocks no request
holds yet (the pool is empty at start-up).
"""

from __future__ import annotations

import functools
import statistics
import time

from kvroute.engine.core.kv_copies import CopyPlan, StoredBlock
from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.kv.link_estimate import DeviceCosts, fit_link
from kvroute.router.contract.tier_costs import Link

SIZES = (1, 8, 32)  # blocks per measured batch
REPS = 3
PREFILL_TOKENS = 512


def median_seconds(fn, reps: int = REPS) -> float:
    """Median seconds of `fn` over `reps` calls after one to warm up (first-use allocations)."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_host_link(runner) -> dict[str, Link]:
    """Device-to-host (blocks read out, as for the store) and host-to-device (bytes written in, as a load)."""
    bpb = runner.kv_bytes_per_block
    points: dict[str, list[tuple[int, float]]] = {"d2h": [], "h2d": []}
    for n in (s for s in SIZES if s <= runner.num_blocks):
        blocks = list(range(n))
        reads = CopyPlan(device_reads=[(b, StoredBlock(0, (), None)) for b in blocks])  # what is read, not whose
        writes = CopyPlan(writes=[(b, bytes(bpb)) for b in blocks])
        points["d2h"].append((n * bpb, median_seconds(functools.partial(runner.run_copies_sync, reads))))
        points["h2d"].append((n * bpb, median_seconds(functools.partial(runner.run_copies_sync, writes))))
    return {name: fit_link(p) for name, p in points.items()}


def measure_prefill_rate(runner) -> float:
    bs = runner.block_size
    n = max(1, min(PREFILL_TOKENS, runner.info.max_model_len - 1, runner.num_blocks * bs))
    work = SeqWork(0, tuple(5 + i % 1000 for i in range(n)), 0, tuple(range(-(-n // bs))), True,
                   SamplingParams(max_tokens=1, temperature=0.0))
    return n / median_seconds(lambda: runner.execute_sync([work]))


def measure(runner) -> DeviceCosts:
    return DeviceCosts(links=measure_host_link(runner), prefill_tokens_per_s=measure_prefill_rate(runner))
