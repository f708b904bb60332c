"""Admission over a fleet of router replicas: this replica's side of what they share.

Every router replica (and every `--workers` process) admits on its own event loop and never
waits on another: it decides from what it knows now, and syncs with the fleet's ledger
(fleet_ledger.py; in Redis, router/service/admission_store.py) every `sync_s` in the
background, one round trip that both reports and learns:

    weighted shares  `SharedRates`: `over_share` (shares.py) reads the fleet's admitted and
                     arrival rates (the last sync's, plus what this replica counted since),
                     the drain rate this replica's own (its queue drains at its own pace)
    fair queueing    `SharedTags`: the local queue tags entries from the fleet's virtual time
                     and each tenant's fleet-wide last tag, so a tenant's entries order behind
                     what it was served anywhere; an entry is `in_turn` while its tag is at most
                     `window` past the lowest head tag of the other replicas' queues, so a
                     replica whose queue holds only a heavy tenant's entries holds them back
                     while the others serve lighter ones, and the weights hold over the fleet
                     whichever replica the requests come to
    limits           `LeasedLimits` (leases.py): rate tokens and concurrency slots leased ahead
    load             each replica's router-side charges per instance (queued prefill, in flight),
                     which the others add to the engines' reports (the backlog threshold)

Staleness. What a replica knows of the others is at most one sync interval (plus a round trip)
old. It costs: a tenant's weighted share can drift by what the fleet admits in one interval; a
queue entry can wait up to one interval for a head the other replica already served; leases can
leave a replica refusing while another holds unused tokens (at most two intervals' arrivals);
the others' new charges on an instance show one interval late (the engines' own load reports
come every 100 ms anyway). At the default 50 ms, at 100 requests/s, that is 5 requests.

Lost ledger (`lost`): everything falls back to this replica's own view, the limits divided by
the replicas last known; the next sync that succeeds restores the shared view. Pure, the clock
an argument: the router service and the simulator (loadgen/sim/fleet.py) drive the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from kvroute.router.decision.admission import AdmissionConfig
from kvroute.router.decision.base import PeerLoad
from kvroute.router.decision.decay import decayed
from kvroute.router.decision.fair_queue import LocalTags
from kvroute.router.decision.fleet_ledger import SyncReply, SyncRequest, TenantSync
from kvroute.router.decision.leases import LeasedLimits
from kvroute.router.decision.shares import Rates

DEFAULT_WINDOW = 1.0  # virtual time a head may run ahead of the other replicas' heads: one weight-1 request


class FleetCounts:
    """One per-tenant count as the fleet has it: the last sync's decayed counts, plus what this
    replica counted since (not yet sent, or in the sync in flight)."""

    def __init__(self, halflife_s: float) -> None:
        self.halflife_s = halflife_s
        self._fleet: dict[str, float] = {}  # decayed counts as of `_fleet_at`, this replica's synced ones included
        self._fleet_at = 0.0
        self._pending: dict[str, float] = {}  # counted here since the last sync request
        self._sent: dict[str, float] = {}  # ... in the sync in flight
        self.others_at: dict[str, float] = {}  # tenant -> the last sync that showed other replicas' counts of it

    def add(self, tenant: str) -> None:
        self._pending[tenant] = self._pending.get(tenant, 0.0) + 1.0

    def rates(self, now: float) -> dict[str, float]:
        per_count = math.log(2) / self.halflife_s
        synced = decayed(per_count, self._fleet_at, now, self.halflife_s)  # one decay for every synced count
        out = {t: v * synced for t, v in self._fleet.items()}
        for extra in (self._sent, self._pending):
            for t, n in extra.items():
                out[t] = out.get(t, 0.0) + n * per_count
        return out

    def outgoing(self) -> dict[str, float]:
        self._sent, self._pending = self._pending, {}
        return self._sent

    def synced(self, fleet: Mapping[str, float], now: float) -> None:
        for t, v in fleet.items():  # grown by more than this replica sent: the others counted some
            before = decayed(self._fleet.get(t, 0.0), self._fleet_at, now, self.halflife_s)
            if v - before - self._sent.get(t, 0.0) > 0.5:
                self.others_at[t] = now
        self._fleet, self._fleet_at, self._sent = dict(fleet), now, {}

    def unsent(self) -> None:
        """The sync failed: what it carried goes with the next one."""
        for t, n in self._sent.items():
            self._pending[t] = self._pending.get(t, 0.0) + n
        self._sent = {}


class SharedRates(Rates):
    """This replica's admitted rates (the drain rate) and the fleet's admitted and arrival rates
    (`shares`, `demands`: weighted shares, shares.py)."""

    def __init__(self, halflife_s: float) -> None:
        super().__init__(halflife_s)
        self.shared = False
        self.fleet_admitted = FleetCounts(halflife_s)
        self.fleet_arrived = FleetCounts(halflife_s)

    def add(self, tenant: str, now: float) -> None:
        super().add(tenant, now)
        self.fleet_admitted.add(tenant)

    def arrived(self, tenant: str, now: float) -> None:
        super().arrived(tenant, now)
        self.fleet_arrived.add(tenant)

    def shares(self, now: float) -> dict[str, float]:
        return self.fleet_admitted.rates(now) if self.shared else self.rates(now)

    def arrived_since(self, since: float) -> set[str]:
        here = super().arrived_since(since)
        if not self.shared:
            return here
        others = self.fleet_arrived.others_at
        self.fleet_arrived.others_at = {t: at for t, at in others.items() if at > since}
        return here | set(self.fleet_arrived.others_at)

    def demands(self, now: float) -> dict[str, float]:
        return self.fleet_arrived.rates(now) if self.shared else super().demands(now)

    def outgoing(self) -> tuple[dict[str, float], dict[str, float]]:
        """(admitted, arrived) here since the last sync request."""
        return self.fleet_admitted.outgoing(), self.fleet_arrived.outgoing()

    def synced(self, admitted: Mapping[str, float], arrived: Mapping[str, float], now: float) -> None:
        self.shared = True
        self.fleet_admitted.synced(admitted, now)
        self.fleet_arrived.synced(arrived, now)

    def unsent(self) -> None:
        self.fleet_admitted.unsent()
        self.fleet_arrived.unsent()


class SharedTags(LocalTags):
    """The fair queue's tags from the fleet's virtual time (fair_queue.py `Tags`)."""

    def __init__(self, bands: int, window: float = DEFAULT_WINDOW) -> None:
        super().__init__(bands)
        self.window = window
        self.shared = False
        self.others: dict[int, float] = {}  # band -> the lowest head tag of the other replicas
        self._cost: dict[str, float] = {}  # "band:tenant" -> 1 / weight per entry tagged since the last request
        self._sent: dict[str, float] = {}

    def issued(self, band: int, tenant: str, tag: float, weight: float) -> None:
        super().issued(band, tenant, tag, weight)
        key = f"{band}:{tenant}"
        self._cost[key] = self._cost.get(key, 0.0) + 1.0 / weight

    def emptied(self, band: int) -> None:
        if not self.shared:  # else the fleet forgets, when no replica has a backlog in the band
            super().emptied(band)

    def withdrawn(self, band: int, tenant: str, cost: float) -> None:
        super().withdrawn(band, tenant, cost)
        key = f"{band}:{tenant}"
        self._cost[key] = self._cost.get(key, 0.0) - cost

    def in_turn(self, band: int, tag: float) -> bool:
        other = self.others.get(band) if self.shared else None
        return other is None or tag <= other + self.window

    def outgoing(self) -> tuple[dict[str, float], dict[str, float]]:
        """(the cost tagged per band and tenant since the last request, the highest tag served per band)."""
        self._sent, self._cost = self._cost, {}
        return self._sent, {str(b): v for b, v in enumerate(self.vtime) if v > 0}

    def synced(self, reply: SyncReply) -> None:
        """The fleet's tags, plus what was tagged here since the request left."""
        self.shared, self._sent = True, {}
        last = {}
        for key, tag in reply.tags.items():
            band, _, tenant = key.partition(":")
            last[(int(band), tenant)] = tag + self._cost.get(key, 0.0)
        self.last = last
        for band, v in reply.vtime.items():
            if int(band) < len(self.vtime):
                self.vtime[int(band)] = max(self.vtime[int(band)], v)
        self.others = {int(b): tag for b, tag in reply.heads.items()}

    def unsent(self) -> None:
        for key, cost in self._sent.items():
            self._cost[key] = self._cost.get(key, 0.0) + cost
        self._sent = {}

    def lost(self) -> None:
        self.unsent()
        self.shared, self.others = False, {}


class FleetShare:
    """This replica's shared admission state: rates, tags and limits, synced as one request."""

    def __init__(self, replica: str, config: AdmissionConfig, sync_s: float, replicas: int = 1,
                 window: float = DEFAULT_WINDOW) -> None:
        if sync_s <= 0:
            raise ValueError(f"the admission sync interval must be positive, got {sync_s}")
        self.replica, self.config, self.sync_s = replica, config, sync_s
        self.ttl_s = max(1.0, 20 * sync_s)  # a replica not heard of this long is gone
        self.rates = SharedRates(config.drain_halflife_s)
        self.tags = SharedTags(config.bands, window)
        self.limits = LeasedLimits(sync_s, replicas)
        self._asked: dict[str, TenantSync] = {}  # the asks of the sync in flight

    @property
    def shared(self) -> bool:
        return self.limits.shared

    @property
    def replicas(self) -> int:
        return self.limits.replicas

    def request(self, now: float, heads: Mapping[int, float],
                load: Mapping[str, PeerLoad]) -> SyncRequest:
        """What to send the ledger now: this replica's news since the last sync, and its asks."""
        self._asked = self.limits.asks(now)
        tenants = dict(self._asked)
        admitted, arrived = self.rates.outgoing()
        for name in admitted.keys() | arrived.keys():
            ask = tenants.get(name, TenantSync())
            tenants[name] = msgspec.structs.replace(ask, admitted=admitted.get(name, 0.0),
                                                    arrived=arrived.get(name, 0.0))
        costs, served = self.tags.outgoing()
        return SyncRequest(replica=self.replica, ttl_s=self.ttl_s, halflife_s=self.config.drain_halflife_s,
                           tenants=tenants, tags=costs, served=served,
                           heads={str(b): t for b, t in heads.items()}, load=dict(load))

    def apply(self, reply: SyncReply, now: float) -> None:
        self.limits.granted(self._asked, reply)
        self.rates.synced(reply.rates, reply.demand, now)
        self.tags.synced(reply)
        self._asked = {}

    def failed(self) -> None:
        """One sync failed: its news goes with the next one; what was leased stays."""
        self.rates.unsent()
        self.tags.unsent()
        self._asked = {}

    def lost(self) -> None:
        """The ledger is out of reach: local admission until a sync succeeds."""
        self.failed()
        self.limits.lost()
        self.rates.shared = False
        self.tags.lost()
