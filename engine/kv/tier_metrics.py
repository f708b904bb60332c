"""Prometheus metrics of the KV tiers (host pool, shared store, cold recovery), kvroute_engine_kv_*.

Transfers are counted per direction -- "d2h" (device -> host pool, and reads of
device blocks for the store), "h2d" (host pool or store bytes -> device),
"store_write", "store_read" -- in bytes, seconds and operations (a copy batch part
or a store call), so bytes / seconds is the achieved bandwidth of each.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

DIRECTIONS = ("d2h", "h2d", "store_write", "store_read")


class TierMetrics:
    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        r, m = registry, {"model_name": model}

        def by(name: str, doc: str, label: str) -> Counter:
            return Counter(name, doc, ["model_name", label], registry=r)

        self.transfer_bytes = by("kvroute_engine_kv_transfer_bytes", "K/V bytes moved between tiers.", "direction")
        self.transfer_seconds = by("kvroute_engine_kv_transfer_seconds", "Time spent moving K/V between tiers.",
                                   "direction")
        self.transfers = by("kvroute_engine_kv_transfers", "Tier transfer operations (copy batches, store calls).",
                            "direction")
        self.recoveries = by("kvroute_engine_kv_recoveries", "Cached runs after the device prefix, by choice "
                             "(load_host, load_remote, recompute).", "choice")
        self.recovered_blocks = by("kvroute_engine_kv_recovered_blocks", "Blocks of those runs, by choice.", "choice")
        self.ahead = by("kvroute_engine_kv_ahead_copies", "Blocks copied to the host ahead of their eviction, by "
                        "what became of them (evicted: the copy was used; reused: the block was hit on the device "
                        "first and its copy dropped).", "outcome")
        self.store_lookups = by("kvroute_engine_kv_store_lookup_blocks", "Blocks looked up in the store, by result "
                                "(hit, miss).", "result")
        self.store_errors = by("kvroute_engine_kv_store_errors", "Store calls that failed or timed out, by operation.",
                               "op")
        self.store_rejected = Counter("kvroute_engine_kv_store_rejected_entries", "Store entries refused on read "
                                      "(missing, corrupt, foreign layout); the block was recomputed.",
                                      ["model_name"], registry=r).labels(**m)
        self.store_dropped = Counter("kvroute_engine_kv_store_dropped_writes", "Blocks not written to the store "
                                     "(store down or write queue full).", ["model_name"], registry=r).labels(**m)
        self.store_up = Gauge("kvroute_engine_kv_store_up", "1 while the store answers, 0 during an outage.",
                              ["model_name"], registry=r).labels(**m)
        self.host_used = Gauge("kvroute_engine_kv_host_blocks_used", "Host pool blocks holding K/V.",
                               ["model_name"], registry=r).labels(**m)
        self.host_usage = Gauge("kvroute_engine_kv_host_usage_perc", "Fraction of host pool blocks in use (0-1).",
                                ["model_name"], registry=r).labels(**m)
        self.recovery_moved = Counter("kvroute_engine_kv_recovery_moved_bytes", "Bytes moved to bring cached "
                                      "blocks back into the device (store reads, whole entries, and host-to-device "
                                      "copies).", ["model_name"], registry=r).labels(**m)
        self.recovery_needed = Counter("kvroute_engine_kv_recovery_needed_bytes", "The K/V bytes those moves "
                                       "carried (blocks x bytes per block, per link crossed).", ["model_name"],
                                       registry=r).labels(**m)
        self.recovery_ratio = Gauge("kvroute_engine_kv_recovery_moved_ratio", "Recovery bytes moved over bytes "
                                    "needed since start (1 = nothing moved in vain; 0 before any recovery).",
                                    ["model_name"], registry=r).labels(**m)
        self.load_queue = Gauge("kvroute_engine_kv_load_queue_blocks", "Blocks waiting to be loaded into the device.",
                                ["model_name"], registry=r).labels(**m)
        self._model = model
        self._moved = self._needed = 0
        self._seen_runs: dict[str, int] = {}
        self._seen_blocks: dict[str, int] = {}
        self._seen_ahead: dict[str, int] = {}

    def transfer(self, direction: str, nbytes: float, seconds: float) -> None:
        labels = (self._model, direction)
        self.transfer_bytes.labels(*labels).inc(nbytes)
        self.transfer_seconds.labels(*labels).inc(seconds)
        self.transfers.labels(*labels).inc()

    def recovery_bytes(self, moved: int, needed: int) -> None:
        self.recovery_moved.inc(moved)
        self.recovery_needed.inc(needed)
        self._moved += moved
        self._needed += needed
        self.recovery_ratio.set(self._moved / self._needed)

    def lookups(self, hits: int, misses: int) -> None:
        self.store_lookups.labels(self._model, "hit").inc(hits)
        self.store_lookups.labels(self._model, "miss").inc(misses)

    def store_error(self, op: str) -> None:
        self.store_errors.labels(self._model, op).inc()

    def observe_recovery(self, runs: dict[str, int], blocks: dict[str, int]) -> None:
        """Bring the choice counters up to `recovery.runs` / `.blocks` (cumulative counts)."""
        self._catch_up(self._seen_runs, runs, self.recoveries)
        self._catch_up(self._seen_blocks, blocks, self.recovered_blocks)

    def observe_ahead(self, outcomes: dict[str, int]) -> None:
        """Bring the ahead-copy counters up to the prestager's cumulative `outcomes`."""
        self._catch_up(self._seen_ahead, outcomes, self.ahead)

    def _catch_up(self, seen: dict[str, int], counts: dict[str, int], metric: Counter) -> None:
        for label, n in counts.items():
            if n > seen.get(label, 0):
                metric.labels(self._model, label).inc(n - seen.get(label, 0))
                seen[label] = n
