"""The router's record of one engine instance: identity, health, load, event position."""

from __future__ import annotations

import dataclasses
import time

from router.policies.base import InstanceState
from router.protocol import LoadRecord
from router.tier_costs import TierCosts


@dataclasses.dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an engine advertises at GET /kv/info."""

    instance_id: str
    model: str
    block_size: int
    hash_seed: int
    tokenizer: str
    role: str = "both"
    cluster_id: str = ""
    tier_costs: TierCosts | None = None  # advertised at start; /load refreshes the measured figures

    @classmethod
    def from_dict(cls, d: dict) -> "EngineInfo":
        try:
            return cls(str(d["instance_id"]), str(d["model"]), int(d["block_size"]), int(d["hash_seed"]),
                       str(d["tokenizer"]), str(d.get("role", "both")), str(d.get("cluster_id", "")),
                       TierCosts.from_wire(d.get("kv_tiers")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed /kv/info: {e}") from None


class Instance:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.info: EngineInfo | None = None
        self.healthy = False  # passes health checks (ejected after N failures)
        self.reachable = False  # last contact worked; a failure excludes it from scoring at once
        self.failures = 0
        self.successes = 0
        self.down_since: float | None = None
        self.mismatch: list[str] = []
        self.inflight = 0
        self.queued_prefill_tokens = 0
        self.load: LoadRecord | None = None
        self.epoch: int | None = None
        self.seq = 0
        self.needs_resync = True
        self.blocks_indexed = 0
        self.last_event_time: float | None = None
        self.resyncs = 0
        self._costs_of: LoadRecord | None = None  # the load record `_costs` was parsed from
        self._costs: TierCosts | None = None

    @property
    def id(self) -> str:
        return self.info.instance_id if self.info else self.url

    @property
    def routable(self) -> bool:
        return self.info is not None and self.healthy and self.reachable

    @property
    def cache_ok(self) -> bool:
        return not self.mismatch

    def mark_failure(self, eject_after: int) -> bool:
        """One failed contact; returns True when this ejects the instance."""
        self.reachable = False
        self.successes = 0
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
        if self.healthy and self.failures >= eject_after:
            self.healthy = False
            return True
        return False

    def mark_success(self, readmit_after: int) -> bool:
        """One good contact; returns True when this readmits an ejected instance (resync it)."""
        self.failures = 0
        self.successes += 1
        self.reachable = True
        self.down_since = None
        if not self.healthy and self.successes >= readmit_after:
            self.healthy = True
            self.needs_resync = True
            return True
        return False

    def state(self) -> InstanceState:
        load = self.load
        return InstanceState(
            id=self.id,
            inflight=self.inflight,
            queued_prefill_tokens=self.queued_prefill_tokens,
            running=load.running if load else 0,
            waiting=load.waiting if load else 0,
            kv_usage=load.kv_usage if load else 0.0,
            cache_ok=self.cache_ok,
            tier_costs=self.tier_costs,
        )

    @property
    def tier_costs(self) -> TierCosts | None:
        """The latest advertised tier figures: from the last load record, else from /kv/info."""
        load = self.load
        if load is not None and load.kv_tiers:
            if load is not self._costs_of:
                self._costs_of, self._costs = load, TierCosts.from_wire(load.kv_tiers)
            return self._costs
        return self.info.tier_costs if self.info else None

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "url": self.url,
            "healthy": self.healthy,
            "reachable": self.reachable,
            "routable": self.routable,
            "model": self.info.model if self.info else None,
            "role": self.info.role if self.info else None,
            "block_size": self.info.block_size if self.info else None,
            "blocks_indexed": self.blocks_indexed,
            "epoch": self.epoch,
            "seq": self.seq,
            "resyncs": self.resyncs,
            "mismatch": list(self.mismatch),
            "inflight": self.inflight,
            "queued_prefill_tokens": self.queued_prefill_tokens,
            "load": self.load.to_dict() if self.load else None,
            "kv_store": self.tier_costs.store or None if self.tier_costs else None,
        }
