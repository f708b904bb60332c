"""The router's record of one engine instance: identity, health, load, event position."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.contract.tier_costs import TierCosts
from kvroute.router.decision.base import NO_PEER_LOAD, InstanceState, PeerLoad, with_peer_charges
from kvroute.router.fleet.progress import moved
from kvroute.router.fleet.queued_prefill import QueuedPrefill

if TYPE_CHECKING:
    from kvroute.router.kvevents.follower import InstanceFeed


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
    max_model_len: int = 0  # 0: not advertised
    vocab_size: int = 0
    tier_costs: TierCosts | None = None  # advertised at start; /load refreshes the measured figures
    adapters: tuple[str, ...] = ()  # LoRA adapters it serves, by the names requests give as `model`
    model_path: str = ""  # the model as the engine loaded it (vLLM's `root`: what its image hashes name)
    key_rule: str = "seeded"  # how its blocks are keyed (router/contract/block_keys.py), set by its kind

    @classmethod
    def from_dict(cls, d: object) -> EngineInfo:
        if not isinstance(d, dict):  # JSON, but not an object (a list): refused like any malformed answer
            raise ValueError(f"malformed /kv/info: an object expected, got {type(d).__name__}")
        try:
            adapters = d.get("adapters") or []
            if not isinstance(adapters, list) or not all(isinstance(a, str) and a for a in adapters):
                raise ValueError("adapters must be a list of names")
            return cls(instance_id=str(d["instance_id"]), model=str(d["model"]), block_size=int(d["block_size"]),
                       hash_seed=int(d["hash_seed"]), tokenizer=str(d["tokenizer"]), role=str(d.get("role", "both")),
                       cluster_id=str(d.get("cluster_id", "")), max_model_len=int(d.get("max_model_len") or 0),
                       vocab_size=int(d.get("vocab_size") or 0), tier_costs=TierCosts.from_wire(d.get("kv_tiers")),
                       adapters=tuple(adapters))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed /kv/info: {e}") from None


_ROUTING_FIELDS = frozenset({"healthy", "reachable", "draining", "info", "removed", "stalled"})
_STATE_FIELDS = frozenset({"queued_prefill_tokens", "load", "mismatch", "info", "feed_stale",
                           "peer_charges"})  # what state() reads
_UNSET = object()
_ID_FIELDS = frozenset({"info", "url"})  # what `id` is made of: the engine's instance id, else the URL


class Generation:
    """One fleet's change counter: bumped whenever anything that decides routability changes on
    one of its instances (health, reachability, draining, its info: role, model) or its membership,
    so router/fleet/groups.py knows when to rebuild."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class Instance:
    id: str  # kept by __setattr__: the engine's instance id once `info` is known, else the URL
    generation: Generation

    def __init__(self, url: str, source: str = "static", peers: int = 0,
                 generation: Generation | None = None) -> None:
        """`generation`: the counter of the fleet it belongs to (None: one of its own)."""
        object.__setattr__(self, "generation", generation if generation is not None else Generation())
        self.groups: list = []  # the router/fleet/groups.py groups it is in (in-flight counts follow it)
        self._inflight = 0
        self.url = url.rstrip("/")  # sets `id` too: the engine's instance id once `info` is known, else the URL
        self.sources = {source}  # "static" (--engine), "registry", "admin": removed when none is left
        self.draining = False  # the engine said so (/load, /health, registry): no new requests
        self.removed = False
        self.info: EngineInfo | None = None
        self.healthy = False  # passes health checks (ejected after N failures)
        self.reachable = False  # last contact worked; a failure excludes it from scoring at once
        self.failures = 0  # consecutive failed probes
        self.request_failures = 0  # consecutive failed requests
        self.ejections = 0  # consecutive ejections for failed requests (backoff)
        self.ejected_until = 0.0
        self.successes = 0
        self.down_since: float | None = None
        self.mismatch: list[str] = []
        self.silent_miss: dict | None = None  # its engine and the index disagree (router/fleet/silent_miss.py)
        self.queued_prefill_tokens = 0
        self.load: LoadRecord | None = None
        self.load_seen = 0.0  # time.monotonic() when the last load record arrived (its HTTP server is alive)
        self.progress_seen = 0.0  # time.monotonic() when a load record last showed it moving (router/fleet/progress.py)
        self.stalled = False  # holds work and has not moved for --first-byte-timeout-s: out until it moves
        self.epoch: int | None = None
        self.seq = 0
        self.needs_resync = True
        self.blocks_indexed = 0
        self.last_event_time: float | None = None
        self.resyncs = 0
        self.last_error: str | None = None  # why the last contact failed; None once it works again
        self.kind = "auto"  # engine kind (router/fleet/kinds): set from --engine-kind, resolved at discovery
        self.kind_state: dict = {}  # what the kind learned at discovery (engine block size, KV blocks, ...)
        self.engine_feed = True  # the engine serves kvroute's /kv/events and /kv/snapshot
        self.kv_feed: InstanceFeed | None = None  # when its events come over ZeroMQ
        self.feed_stale: str | None = None  # why its event feed is down: its index entries are not credited
        self._state: InstanceState | None = None
        self.peers = peers  # other router workers sending requests here (router/service/workers.py)
        # the other router replicas' charges here (queued prefill tokens, in flight), as shared
        # admission last heard (router/service/fleet_admission.py); (0, 0) without it
        self.peer_charges: PeerLoad = NO_PEER_LOAD
        self.nonstreamed = QueuedPrefill()  # non-streamed requests whose prefill may still be queued
        self._costs_of: LoadRecord | None = None  # the load record `_costs` was parsed from
        self._costs: TierCosts | None = None

    def __setattr__(self, name: str, value) -> None:
        if name in _ROUTING_FIELDS and self.__dict__.get(name, _UNSET) != value:
            self.generation.bump()
        if name in _STATE_FIELDS:
            self.__dict__["_state"] = None
        object.__setattr__(self, name, value)
        if name in _ID_FIELDS:  # the id is read several times per request: kept, not recomputed
            info = self.__dict__.get("info")
            self.__dict__["id"] = info.instance_id if info else self.__dict__.get("url", "")

    @property
    def inflight(self) -> int:
        return self._inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        fields = self.__dict__  # not through __setattr__: neither field is a routing or id field
        fields["_inflight"] = value
        fields["_state"] = None
        for group in self.groups:
            group.load.set(self, value)

    def charge(self, requests: int, prefill_tokens: int) -> None:
        """Router-side load changes by `requests` in flight and `prefill_tokens` queued (negative:
        less), as `inflight += requests; queued_prefill_tokens += prefill_tokens` would change it, in
        one step (neither is a routing or id field: nothing else to bump)."""
        fields = self.__dict__
        fields["queued_prefill_tokens"] += prefill_tokens
        fields["_state"] = None
        if requests:
            value = fields["_inflight"] = fields["_inflight"] + requests
            for group in self.groups:
                group.load.set(self, value)

    @property
    def follows_engine_feed(self) -> bool:
        """Its events come from /kv/events (or the Redis stream), not from ZeroMQ."""
        return self.engine_feed and self.kv_feed is None

    @property
    def without_kv_events(self) -> str | None:
        """Why the router sees nothing of this discovered engine's cache (it routes it on load alone):
        a vLLM or SGLang engine with no --kv-event-source. None when its KV events come."""
        if self.info is None or self.engine_feed or self.kv_feed is not None:
            return None
        return f"a {self.kind} engine without --kv-event-source: no KV events, routed on load alone"

    @property
    def routable(self) -> bool:
        return self.info is not None and self.healthy and self.reachable and not self.draining and not self.stalled

    def observe_load(self, load: LoadRecord) -> str | None:
        """Take a load record (polled or sent with events); returns the new role if it changed."""
        now = time.monotonic()
        if moved(self.load, load):
            self.progress_seen = now
        self.load = load
        self.load_seen = now
        self.draining = load.state == "draining"
        if load.role and self.info is not None and load.role != self.info.role:
            self.info = dataclasses.replace(self.info, role=load.role)
            return load.role
        return None

    @property
    def cache_ok(self) -> bool:
        """Its index entries can be credited: a compatible engine whose event feed is up."""
        return not self.mismatch and self.feed_stale is None

    def mark_failure(self, eject_after: int, request: bool = False, ejection_s: float = 0.0,
                     exclude: bool = True) -> bool:
        """One failed contact; returns True when this ejects the instance.

        Probe failures (health, load, events) and request failures (timeouts, 5xx, broken
        streams) are counted apart; `exclude=False` (an HTTP 5xx: the engine is up) counts
        without excluding it at once. An engine that answers /health but not requests is
        still ejected after `eject_after` failed requests in a row, and then stays out for
        `ejection_s`, doubled for each consecutive ejection (up to 16x), whatever its
        health checks say, so it cannot take a request every health interval.
        """
        now = time.monotonic()
        if exclude:
            self.reachable = False
            self.successes = 0
        if request:
            self.request_failures += 1
        else:
            self.failures += 1
        if self.down_since is None and exclude:
            self.down_since = now
        if self.healthy and max(self.failures, self.request_failures) >= eject_after:
            self.healthy = False
            if request:
                self.ejections += 1
                self.ejected_until = now + ejection_s * 2 ** min(self.ejections - 1, 4)
            return True
        return False

    def mark_success(self, readmit_after: int) -> bool:
        """One good probe; returns True when this readmits an ejected instance (resync it)."""
        self.failures = 0
        self.successes += 1
        self.reachable = True
        self.down_since = None
        if not self.healthy and self.successes >= readmit_after and time.monotonic() >= self.ejected_until:
            self.healthy = True
            self.needs_resync = True
            return True
        return False

    def request_ok(self) -> None:
        """A request got its answer: the request-failure streak (and ejection backoff) ends."""
        if self.request_failures or self.ejections:
            self.request_failures = 0
            self.ejections = 0

    def state(self) -> InstanceState:
        """For the policy; kept until something it is made of changes (a request sent or done, a load
        record, a compatibility check), so a decision does not rebuild every candidate's."""
        state = self._state
        if state is None:  # the policy's clock is time.monotonic: the load record's age is taken off it
            load = self.load
            measured_at = time.monotonic() - max(time.time() - load.ts, 0.0) if load else 0.0
            inflight, queued = with_peer_charges(self._inflight, self.queued_prefill_tokens, self.peer_charges,
                                                 load, self.peers)
            state = InstanceState.of(id=self.id, inflight=inflight, queued_prefill_tokens=queued,
                                     load=load, measured_at=measured_at, cache_ok=self.cache_ok,
                                     tier_costs=self.tier_costs)
            self.__dict__["_state"] = state
        return state

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
            "draining": self.draining,
            "stalled": self.stalled,
            "sources": sorted(self.sources),
            "routable": self.routable,
            "model": self.info.model if self.info else None,
            "role": self.info.role if self.info else None,
            "block_size": self.info.block_size if self.info else None,
            "blocks_indexed": self.blocks_indexed,
            "epoch": self.epoch,
            "seq": self.seq,
            "resyncs": self.resyncs,
            "failures": self.failures,
            "request_failures": self.request_failures,
            "mismatch": list(self.mismatch),
            "silent_miss": self.silent_miss,
            "feed_stale": self.feed_stale,
            "last_error": self.last_error,
            "inflight": self.inflight,
            "queued_prefill_tokens": self.queued_prefill_tokens,
            "peer_charges": {"queued_prefill_tokens": self.peer_charges.queued, "inflight": self.peer_charges.inflight},
            "load": self.load.to_dict() if self.load else None,
            "kind": self.kind,
            "engine": dict(self.kind_state),
            "kv_events": self.kv_feed.to_dict() if self.kv_feed is not None else None,
            "without_kv_events": self.without_kv_events,
            "kv_store": self.tier_costs.store or None if self.tier_costs else None,
        }
