"""KV tiers on the virtual clock: the engine's own `CacheTiers`, with modelled transfer times.

Each simulated instance runs the real block manager with the real tiers (host
pool, load queue, cost-based recovery: engine/kv/tier_setup.py builds them from the
same `EngineConfig`), and this module does for it what engine/kv/tier_service.py does
for a real engine, with times from the sim runner's links (engine/kv/links.py LINKS):

- a copy batch (evictions to the host, host hits and store bytes into the device,
  reads for the store) lengthens the step it precedes by its modelled time, as it
  does on this engine's runner thread;
- a store lookup (before a request is queued) takes the store link's latency,
  and its answer is booked as the engine books it (`CacheTiers.looked_up`: hits
  join `known`, a known block the store lacks -- written but not landed yet --
  leaves it with a `removed` event of tier "remote");
  a fetch of n blocks its latency + n blocks / bandwidth, after which the loads
  are ready for the next copy batch; a write lands after its modelled time and
  is then announced with a `stored` event of tier "remote";
- one `SimStore` holds what every instance has written: the shared store, with
  no capacity limit (it holds all historical sessions).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from kvroute.engine.core.kv_copies import CopyPlan
from kvroute.engine.core.kv_events import KVChange
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.kv.tiers import CacheTiers


class SimStore:
    def __init__(self) -> None:
        self.blocks: set[int] = set()


class SimTierIO:
    def __init__(self, tiers: CacheTiers, missing: Callable[[Sequence], list[int]], runner, store: SimStore | None,
                 call_at: Callable[[float, Callable[[], None]], None],
                 publish: Callable[[list[KVChange]], None], kick: Callable[[], None]) -> None:
        self.tiers, self.missing, self.runner, self.store = tiers, missing, runner, store
        self.call_at, self.publish, self.kick = call_at, publish, kick
        self.bytes: dict[str, float] = {"d2h": 0, "h2d": 0, "store_write": 0, "store_read": 0}
        self.seconds = dict.fromkeys(self.bytes, 0.0)

    def lookup_delay(self, seq: Sequence) -> float:
        """Ask the store for what the local tiers lack (sets `seq.store_hits`); the lookup's modelled time."""
        if self.store is None:
            return 0.0
        missing = self.missing(seq)
        if not missing:
            return 0.0
        blocks = self.store.blocks
        seq.store_hits, removed = self.tiers.looked_up(missing, [h in blocks for h in missing], misses_known=True)
        if removed is not None:
            self.publish([removed])
        return self.runner.store_link[1] * self.runner.time_scale

    def copies(self, now: float, plan: CopyPlan) -> float:
        """Account one copy batch; its modelled seconds (added to the step it precedes)."""
        if not plan:
            return 0.0
        times = self.runner.copy_times(plan)
        bpb = self.tiers.recovery.bytes_per_block
        self._count("d2h", (len(plan.reads) + len(plan.d2h)) * bpb, times.read_s + times.d2h_s)
        self._count("h2d", plan.num_loaded * bpb, times.h2d_s)
        if plan.reads and self.store is not None:
            blocks = plan.reads
            done = now + times.read_s + self.runner.store_delay(len(blocks))
            self._count("store_write", len(blocks) * bpb, self.runner.store_delay(len(blocks)))
            self.call_at(done, lambda: self._written([b.hash for b in blocks]))
        return times.read_s + times.d2h_s + times.h2d_s

    def fetch(self, now: float) -> None:
        """Start the store reads of the loads admitted since the last call."""
        loads, store = self.tiers.loads.fetches(), self.store
        if not loads or store is None:
            return
        delay = self.runner.store_delay(len(loads))
        self._count("store_read", len(loads) * self.tiers.recovery.bytes_per_block, delay)

        def arrive() -> None:
            for load in loads:
                self.tiers.loads.arrived(load, b"" if load.block.hash in store.blocks else None)
            self.kick()

        self.call_at(now + delay, arrive)

    def _written(self, hashes: list[int]) -> None:
        assert self.store is not None  # writes are made only with a store
        self.store.blocks.update(hashes)
        self.publish([KVChange("stored", hashes, None, "remote", self.tiers.store_key)])

    def _count(self, direction: str, nbytes: float, seconds: float) -> None:
        self.bytes[direction] += nbytes
        self.seconds[direction] += seconds
        self.tiers.recovery.observe(direction, nbytes, seconds)


def tier_stats(ios: list[SimTierIO], store: SimStore | None) -> dict | None:
    """Recoveries by choice and bytes moved per direction (GB/s while moving), over the instances' tier I/O."""
    if not ios:
        return None
    runs: collections.Counter[str] = collections.Counter()
    blocks: collections.Counter[str] = collections.Counter()
    moved = {d: [0.0, 0.0] for d in ios[0].bytes}
    for io in ios:
        runs.update(io.tiers.recovery.runs)
        blocks.update(io.tiers.recovery.blocks)
        for d in moved:
            moved[d][0] += io.bytes[d]
            moved[d][1] += io.seconds[d]
    return {"recoveries": dict(runs), "recovered_blocks": dict(blocks),
            "bytes": {d: b for d, (b, _) in moved.items()},
            "gb_per_s": {d: (b / s / 1e9 if s else None) for d, (b, s) in moved.items()},
            "store_blocks": len(store.blocks) if store is not None else None}
