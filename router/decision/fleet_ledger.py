"""The fleet's admission ledger: what router replicas share so that admission holds over the fleet.

Each replica syncs with the ledger every `--admission-sync-s` (router/decision/fleet_share.py
`FleetShare` makes the request and applies the reply); one sync is one atomic step, here in
memory (the simulator, and the reference the tests hold the Redis script to) and in Redis
(router/service/admission_store.py, one Lua script). A sync carries, and the ledger keeps:

    rates    per tenant, requests admitted lately, fleet-wide: a count decaying with the
             admission half-life, to which each replica adds what it admitted since its last sync
             (the weighted shares of `over_share`, shares.py)
    demand   per tenant, requests arrived lately (admitted or refused), fleet-wide, the same way
             (which tenants want what share: shares.py `water_level`)
    bucket   per tenant with a `rate`: the fleet's token bucket (rate, burst). A replica leases
             tokens ahead (`take`), gives unused ones back (`give`), and is always charged what it
             spent beyond its lease (`owe`), bucket or not
    slots    per tenant with a `max_concurrency`: the slots each replica holds. A replica gets what
             it wants up to what the others leave, and never less than its requests in flight
    tags     per (band, tenant): the tenant's last fair-queue tag over the fleet; a replica adds
             the cost (1 / weight per entry) of what it tagged since its last sync, from the band's
             virtual time if that is later; `vtime` per band: the highest tag any replica served.
             A band no replica has a backlog in forgets its tenants' tags (as one queue does)
    heads    per replica and band: its queue head's tag; a sync answers the lowest of the others'
    load     per replica and instance: its router-side charges (queued prefill tokens, requests in
             flight); a sync answers the sum of the others'

A replica not heard of for its `ttl_s` is gone: its slots, heads and load are dropped.
Records cross processes (JSON in Redis): keyword-only msgspec Structs, validated when decoded.
"""

from __future__ import annotations

import math

import msgspec

from kvroute.router.decision.base import NO_PEER_LOAD, PeerLoad
from kvroute.router.decision.decay import decayed
from kvroute.router.decision.shares import FORGET


class TenantSync(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    admitted: float = 0.0  # requests admitted here since the last sync
    arrived: float = 0.0  # requests arrived here since the last sync (admitted or refused)
    rate: float | None = None  # the tenant's rate limit, fleet-wide (None: none)
    burst: float | None = None
    take: float = 0.0  # tokens asked for
    owe: float = 0.0  # tokens spent beyond the lease: charged whatever the bucket holds
    give: float = 0.0  # unused tokens given back
    slots_max: int | None = None  # the tenant's max_concurrency, fleet-wide (None: none)
    slots_want: int = 0
    slots_min: int = 0  # its requests in flight here: held whatever the others hold


class SyncRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    replica: str
    ttl_s: float
    halflife_s: float
    tenants: dict[str, TenantSync] = {}
    tags: dict[str, float] = {}  # "band:tenant" -> cost tagged here since the last sync
    served: dict[str, float] = {}  # band -> the highest tag served here
    heads: dict[str, float] = {}  # band -> this replica's queue head's tag (bands with a backlog)
    load: dict[str, PeerLoad] = {}  # instance -> what is charged to it here


class SyncReply(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int  # replicas alive, this one included
    rates: dict[str, float] = {}  # tenant -> decayed admitted count, fleet-wide (this sync's included)
    demand: dict[str, float] = {}  # tenant -> decayed arrived count, fleet-wide (this sync's included)
    tokens: dict[str, float] = {}  # tenant -> tokens granted (the owed included)
    left: dict[str, float] = {}  # tenant -> tokens left in its bucket
    slots: dict[str, int] = {}  # tenant -> slots this replica holds now
    free: dict[str, int] = {}  # tenant -> slots nobody holds
    tags: dict[str, float] = {}  # "band:tenant" -> the tenant's last tag, fleet-wide
    vtime: dict[str, float] = {}  # band -> the fleet's virtual time
    heads: dict[str, float] = {}  # band -> the lowest head tag of the other replicas
    load: dict[str, PeerLoad] = {}  # instance -> the other replicas' charges, together


def _add(table: dict[str, tuple[float, float]], tenant: str, n: float, now: float, halflife_s: float) -> None:
    value, since = table.get(tenant, (0.0, now))
    table[tenant] = (decayed(value, since, now, halflife_s) + n, now)


def _values(table: dict[str, tuple[float, float]], now: float, halflife_s: float) -> dict[str, float]:
    """The decayed counts now; those below FORGET (shares.py) are forgotten."""
    out = {}
    for tenant, (value, since) in list(table.items()):
        value = decayed(value, since, now, halflife_s)
        if value < FORGET:
            del table[tenant]
        else:
            out[tenant] = value
    return out


class FleetLedger:
    """The ledger in memory, on the caller's clock (seconds)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, float]] = {}  # replica -> (last sync, ttl)
        self.slots: dict[str, dict[str, int]] = {}  # replica -> tenant -> slots held
        self.heads: dict[str, dict[str, float]] = {}
        self.load: dict[str, dict[str, PeerLoad]] = {}
        self.rates: dict[str, tuple[float, float]] = {}  # tenant -> (admitted, as of)
        self.demand: dict[str, tuple[float, float]] = {}  # tenant -> (arrived, as of)
        self.buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, as of)
        self.tags: dict[str, float] = {}
        self.vtime: dict[str, float] = {}

    def sync(self, req: SyncRequest, now: float) -> SyncReply:
        self._purge(now)
        me = req.replica
        self.seen[me] = (now, req.ttl_s)
        others = [r for r in self.seen if r != me]
        tokens, left, held, free = {}, {}, {}, {}
        for name, t in req.tenants.items():
            if t.admitted:
                _add(self.rates, name, t.admitted, now, req.halflife_s)
            if t.arrived:
                _add(self.demand, name, t.arrived, now, req.halflife_s)
            if t.rate is not None:
                tokens[name] = self._lease_tokens(name, t, t.rate, now)
                left[name] = self.buckets[name][0]
            mine = self.slots.setdefault(me, {})
            if t.slots_max is None:
                mine.pop(name, None)
                continue
            taken = sum(self.slots.get(r, {}).get(name, 0) for r in others)
            mine[name] = held[name] = max(t.slots_min, min(t.slots_want, t.slots_max - taken))
            free[name] = max(0, t.slots_max - taken - held[name])
        self._tag(req)
        self.heads[me] = dict(req.heads)
        self.load[me] = dict(req.load)
        self._forget_idle_bands()
        return SyncReply(replicas=len(self.seen), rates=_values(self.rates, now, req.halflife_s),
                         demand=_values(self.demand, now, req.halflife_s), tokens=tokens, left=left,
                         slots=held, free=free, tags=dict(self.tags), vtime=dict(self.vtime),
                         heads=self._lowest_heads(others), load=self._others_load(others))

    def _purge(self, now: float) -> None:
        for replica, (last, ttl) in list(self.seen.items()):
            if now - last > ttl:
                for table in (self.seen, self.slots, self.heads, self.load):
                    table.pop(replica, None)

    def _lease_tokens(self, tenant: str, t: TenantSync, rate: float, now: float) -> float:
        """Refill the tenant's bucket to `now`, take back what is given, charge the owed and lease
        what is asked as far as the bucket holds it (never below 0, except by what is owed)."""
        burst = t.burst if t.burst is not None else max(1.0, rate)
        tokens, since = self.buckets.get(tenant, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - since) * rate + t.give)
        granted = max(t.owe, min(t.take, max(tokens, 0.0)))
        self.buckets[tenant] = (tokens - granted, now)
        return granted

    def _tag(self, req: SyncRequest) -> None:
        for key, cost in req.tags.items():
            band = key.partition(":")[0]
            self.tags[key] = max(self.tags.get(key, 0.0), self.vtime.get(band, 0.0)) + cost
        for band, tag in req.served.items():
            self.vtime[band] = max(self.vtime.get(band, 0.0), tag)

    def _forget_idle_bands(self) -> None:
        busy = {band for heads in self.heads.values() for band in heads}
        self.tags = {key: tag for key, tag in self.tags.items() if key.partition(":")[0] in busy}

    def _lowest_heads(self, others: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for replica in others:
            for band, tag in self.heads.get(replica, {}).items():
                out[band] = min(out.get(band, math.inf), tag)
        return out

    def _others_load(self, others: list[str]) -> dict[str, PeerLoad]:
        out: dict[str, PeerLoad] = {}
        for replica in others:
            for inst, mine in self.load.get(replica, {}).items():
                old = out.get(inst, NO_PEER_LOAD)
                out[inst] = PeerLoad(queued=old.queued + mine.queued, inflight=old.inflight + mine.inflight)
        return out
