"""What loading cached K/V from a slower tier costs: the contract engines advertise and routers read.

An engine with tiers advertises, in `GET /kv/info` and in every load record
(`LoadRecord.kv_tiers`), its measured transfer links and the size of a block:

    {"bytes_per_block": 32768,
     "links": {"h2d": {"bandwidth_bps": 5.1e9, "latency_s": 4e-5},          # host -> device
               "d2h": {...}, "store_read": {...}, "store_write": {...}},
     "host": {"blocks": 4096, "used": 812},                                  # with --host-blocks
     "remote": {"store": "redis://10.0.0.5:6379/0#3f2a..."}}                 # with --kv-store

A link moves `n` bytes in `latency_s + n / bandwidth_bps` seconds (engines fit both
online, engine/kv/link_estimate.py). Loading a run of blocks costs, per tier:

    host    h2d(bytes)                      (host pool -> device pool)
    remote  store_read(bytes) + h2d(bytes)  (store -> host memory -> device pool)

and recomputing it costs its tokens times the prefill time per token. `plan_runs`
takes the cached runs after the device prefix, in order, and returns how many to
load (the rest is recomputed) and the time that saves: the engine uses it to
decide (engine/kv/recovery.py) and the router to credit each instance by the time a
hit saves (router/decision/scoring/tier_credit.py), so both read the same numbers the
same way. The `remote.store` key names the store and the engine's K/V layout
(namespace), so blocks in a shared store count for every instance with that key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

LINK_NAMES = ("h2d", "d2h", "store_read", "store_write")
STORE_OWNER_PREFIX = "store:"  # index pseudo-instance holding a shared store's blocks


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    bandwidth_bps: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0 or self.latency_s < 0:
            raise ValueError(f"a link needs a positive bandwidth and a non-negative latency, "
                             f"got {self.bandwidth_bps} B/s and {self.latency_s} s")

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_bps

    def to_dict(self) -> dict:
        return {"bandwidth_bps": self.bandwidth_bps, "latency_s": self.latency_s}


@dataclasses.dataclass(frozen=True, slots=True)
class TierCosts:
    """One engine's advertised tier figures, parsed."""

    bytes_per_block: int
    links: Mapping[str, Link]
    has_host: bool = False
    store: str = ""  # store key (store id + layout namespace); "" without a store

    def load_time(self, tier: str, num_blocks: int) -> float | None:
        """Seconds to bring `num_blocks` of `tier` into the device pool; None if not advertised."""
        nbytes = num_blocks * self.bytes_per_block
        h2d = self.links.get("h2d")
        if h2d is None:
            return None
        if tier == "host":
            return h2d.time(nbytes) if self.has_host else None
        if tier == "remote":
            read = self.links.get("store_read")
            return read.time(nbytes) + h2d.time(nbytes) if read is not None and self.store else None
        return None

    @classmethod
    def from_wire(cls, d: Mapping | None) -> TierCosts | None:
        """Parse an advertised `kv_tiers` object; None when absent or malformed (the router falls back)."""
        if not d:
            return None
        try:
            links = {name: Link(float(v["bandwidth_bps"]), float(v["latency_s"]))
                     for name, v in (d.get("links") or {}).items() if name in LINK_NAMES}
            remote = d.get("remote") or {}
            return cls(int(d["bytes_per_block"]), links, bool(d.get("host")), str(remote.get("store") or ""))
        except (KeyError, TypeError, ValueError):
            return None


def store_owner(store_key: str) -> str:
    """The index pseudo-instance under which a shared store's blocks are recorded."""
    return STORE_OWNER_PREFIX + store_key


def plan_runs(runs: Sequence[tuple[str, int]], load_time, compute_s_per_block: float) -> tuple[int, float]:
    """(runs to load, seconds saved) for cached runs in prompt order.

    `runs` are (tier, blocks) after the device prefix; `load_time(tier, blocks)` gives
    seconds or None (unknown: never loaded). Loading runs 0..j-1 and recomputing the
    rest is chosen for the j with the least total predicted time; ties load more.
    """
    best_j, best_total = 0, sum(n for _, n in runs) * compute_s_per_block
    total_compute = best_total
    loaded = 0.0
    for j, (tier, n) in enumerate(runs, 1):
        t = load_time(tier, n)
        if t is None:
            break
        loaded += t
        total_compute -= n * compute_s_per_block
        if loaded + total_compute <= best_total:
            best_j, best_total = j, loaded + total_compute
    recompute_all = sum(n for _, n in runs) * compute_s_per_block
    return best_j, recompute_all - best_total
