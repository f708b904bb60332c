"""The routing policy interface.

The router filters instances down to the healthy candidates, looks up the prompt's
block chain in the index (only for policies with `uses_index`), and asks the policy
to pick one. Hooks let a policy learn from what happened; they do nothing by default.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Protocol

import msgspec

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.contract.tier_costs import TierCosts
from kvroute.router.index.base import PrefixMatch


class InstanceState(msgspec.Struct, frozen=True):
    """The router's view of one instance at decision time."""

    id: str
    inflight: int = 0  # requests the router has in flight there
    queued_prefill_tokens: int = 0  # prompt tokens sent there and not yet prefilled
    running: int = 0  # engine-reported running sequences
    waiting: int = 0  # engine-reported waiting requests
    kv_usage: float = 0.0  # engine-reported fraction of KV blocks in use
    cache_ok: bool = True  # False when its block size / seed / tokenizer mismatch: route on load only
    kv_free_blocks: int = -1  # engine-reported blocks holding nothing; -1: not reported
    kv_evictable: tuple[tuple[int, float], ...] = ()  # engine-reported (blocks, idle s), next evicted first
    kv_measured_at: float = 0.0  # when kv_evictable's idle times were measured, on the policy's clock
    # advertised tier links and store key (router/contract/tier_costs.py); None: none
    tier_costs: TierCosts | None = None
    adapters: frozenset[str] = frozenset()  # LoRA adapters resident there (engine-reported)
    adapter_slots: int = -1  # adapters it holds at once; -1: not reported (no adapter price)

    @classmethod
    def of(cls, id: str, inflight: int, queued_prefill_tokens: int, load: LoadRecord | None,
           measured_at: float = 0.0, cache_ok: bool = True, tier_costs: TierCosts | None = None) -> InstanceState:
        """The state from the router's own counts and the engine's last load record (None: none yet)."""
        if load is None:
            return cls(id, inflight=inflight, queued_prefill_tokens=queued_prefill_tokens, cache_ok=cache_ok,
                       tier_costs=tier_costs)
        return cls(id, inflight=inflight, queued_prefill_tokens=queued_prefill_tokens, running=load.running,
                   waiting=load.waiting, kv_usage=load.kv_usage, cache_ok=cache_ok, kv_free_blocks=load.kv_free_blocks,
                   kv_evictable=load.kv_evictable, kv_measured_at=measured_at, tier_costs=tier_costs,
                   adapters=frozenset(load.adapters), adapter_slots=load.adapter_slots)


class PeerLoad(msgspec.Struct, frozen=True, kw_only=True):
    """An instance's router-side charges, by the replicas that charged them: the queued prefill
    tokens and the requests in flight (shared admission's sync carries them, router/decision/fleet_ledger.py)."""

    queued: int = 0
    inflight: int = 0


NO_PEER_LOAD = PeerLoad()


def with_peer_charges(inflight: int, queued_prefill_tokens: int, peer_charges: PeerLoad,
                      load: LoadRecord | None, workers: int = 0) -> tuple[int, int]:
    """(in flight, queued prefill tokens) on an instance: this router's own charges plus the other
    replicas' (`peer_charges`: their queued tokens and in-flight requests, as shared admission last
    synced them). When others send it work too (peer replicas, or `workers` other workers of this
    router), the engine's own queued count is a floor: their prefills are in it. The router's
    `Instance.state()` (router/fleet/instance.py) and the simulator's (loadgen/sim/load_view.py)."""
    queued = queued_prefill_tokens + peer_charges.queued
    if (workers or peer_charges.inflight) and load is not None:
        queued = max(queued, load.queued_prefill_tokens)
    return inflight + peer_charges.inflight, queued


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True):
    num_tokens: int
    block_hashes: tuple[int, ...]
    block_size: int
    request_id: str = ""
    adapter: str | None = None  # the LoRA adapter it runs under (the cost model prices loading it)


COST_TERMS = ("wait_s", "prefill_s", "compute_s", "evict_s")  # the parts of a kv_cost cost (kv_aware.py)


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    costs: Mapping[str, float] = msgspec.field(default_factory=dict)  # per candidate, for /router/explain
    reason: str = ""
    uncached_tokens: int | None = None  # predicted prompt tokens to prefill on `instance`; None: not predicted
    terms: Mapping[str, tuple[float, ...]] = msgspec.field(default_factory=dict)  # per candidate, COST_TERMS
    # The reason, formatted only when asked (/router/explain): routing itself never builds the text.
    reason_fn: Callable[[], str] | None = None

    def explained(self) -> str:
        return self.reason or (self.reason_fn() if self.reason_fn is not None else "")


class Policy(Protocol):
    """Picks an instance for a request. `candidates` is never empty."""

    @property
    def uses_index(self) -> bool: ...

    def select(
        self,
        request: RouteRequest,
        candidates: Sequence[InstanceState],
        matches: Mapping[str, PrefixMatch],
    ) -> Decision: ...

    def on_routed(self, request: RouteRequest, instance: str) -> None: ...

    def on_first_token(self, request: RouteRequest, instance: str, ttft_s: float, uncached_tokens: int) -> None: ...

    def on_finished(self, request: RouteRequest, instance: str) -> None: ...

    def on_failed(self, request: RouteRequest, instance: str) -> None: ...

    def credit_detail(self, instance: str) -> dict: ...


class PolicyBase:
    """Default no-op hooks and the `rng` / `clock` injections; policies implement `select`."""

    uses_index: ClassVar[bool] = False
    config_class: ClassVar[type | None] = None  # frozen dataclass of the policy's parameters, if it has any

    def __init__(self, *, rng: random.Random | None = None, clock: Callable[[], float] | None = None) -> None:
        self.rng = rng or random.Random()
        self.clock = clock or time.monotonic

    def on_routed(self, request: RouteRequest, instance: str) -> None:
        pass

    def on_first_token(self, request: RouteRequest, instance: str, ttft_s: float, uncached_tokens: int) -> None:
        pass

    def on_finished(self, request: RouteRequest, instance: str) -> None:
        pass

    def on_failed(self, request: RouteRequest, instance: str) -> None:
        """The attempt on `instance` failed before the engine took the request (it is retried)."""

    def credit_detail(self, instance: str) -> dict:
        """For /router/explain: how the last `select` credited `instance`'s cache (nothing by default)."""
        return {}
