"""A tenant's rate and concurrency limits held over the fleet by leases, with `Limits`' interface.

With shared admission (router/decision/fleet_share.py), the tenant file's limits are the
fleet's: the ledger (fleet_ledger.py) keeps each tenant's token bucket and who holds its
concurrency slots, and this replica works from what it leased at its last sync, so a request
never waits on the ledger:

    rate          a request spends a leased token; with none left it may spend one ahead
                  (`debt`, 1 by default: the lease may go to -1) while the last sync left tokens
                  in the fleet's bucket (a quiet tenant's request, not a flood's), which the next
                  sync charges whatever the bucket holds then. Each sync asks for what the tenant's arrivals here
                  will take until the sync after next (`horizon`), and gives back a lease grown
                  past twice that. So the fleet spends at most `rate` x t + burst tokens, plus
                  (replicas x debt) ahead for at most one sync interval
    concurrency   a request takes a leased slot; with none free it may take one more while the
                  last sync saw a slot nobody held (claimed at the next sync). Each sync asks for
                  its requests in flight plus the arrivals of the horizon; the fleet holds at most
                  `max_concurrency`, plus (replicas - 1) for a sync interval when several replicas
                  take the last free slot at once

Without the ledger (`shared` False: not reached yet, or lost) it falls back to `Limits` with
each limit divided by the replicas last known (`TenantSpec.share`), the requests in flight
carried over. Pure, the clock an argument.
"""

from __future__ import annotations

import math

from kvroute.router.decision.decay import decayed
from kvroute.router.decision.fleet_ledger import SyncReply, TenantSync
from kvroute.router.decision.tenants import Limits, TenantSpec

DEMAND_HALFLIFE_S = 1.0  # of a tenant's arrival rate here, which sizes its leases


class LeasedLimits:
    def __init__(self, sync_s: float, replicas: int = 1, debt: float = 1.0) -> None:
        if sync_s <= 0 or replicas < 1 or debt < 0:
            raise ValueError("leases need a positive sync interval, at least one replica and a debt >= 0")
        self.horizon_s, self.debt = 2.0 * sync_s, debt
        self.shared = False
        self.replicas = replicas
        self.inflight: dict[str, int] = {}
        self._local = Limits()
        self._local.inflight = self.inflight  # one count whatever the mode
        self._shares: dict[TenantSpec, TenantSpec] = {}
        self._specs: dict[str, TenantSpec] = {}  # tenants with limits seen since they last held nothing
        self._tokens: dict[str, float] = {}
        self._slots: dict[str, int] = {}
        self._free: dict[str, int] = {}  # slots nobody held at the last sync
        self._left: dict[str, float] = {}  # tokens left in the fleet's bucket at the last sync
        self._demand: dict[str, tuple[float, float]] = {}  # tenant -> (decayed arrivals, as of)

    # -- Limits' interface (router/service/admission_gate.py, loadgen/sim/admission.py) --------------

    def check(self, spec: TenantSpec, now: float) -> str | None:
        """Why `spec`'s tenant may not take a request now ("rate_limit", "concurrency"), or None."""
        if not self.shared:
            return self._local.check(self._share(spec), now)
        name = spec.name
        if spec.max_concurrency is not None:
            room = self._slots.get(name, 0) + (1 if self._free.get(name, 1) > 0 else 0)  # never synced: free
            if self.inflight.get(name, 0) >= room:
                return "concurrency"
        if spec.rate is not None:
            tokens = self._tokens.get(name, 0.0)
            if tokens < 1.0 and (tokens < 1.0 - self.debt or self._left.get(name, 1.0) < 1.0):
                return "rate_limit"
        return None

    def take(self, spec: TenantSpec, now: float) -> None:
        self._arrived(spec, now)
        if not self.shared:
            return self._local.take(self._share(spec), now)
        if spec.rate is not None:
            self._tokens[spec.name] = self._tokens.get(spec.name, 0.0) - 1.0
        self.inflight[spec.name] = self.inflight.get(spec.name, 0) + 1

    def give_back(self, spec: TenantSpec, now: float) -> None:
        if not self.shared:
            return self._local.give_back(self._share(spec), now)
        if spec.rate is not None:
            self._tokens[spec.name] = self._tokens.get(spec.name, 0.0) + 1.0
        self.finished(spec.name)

    def finished(self, tenant: str) -> None:
        self._local.finished(tenant)

    def retry_after(self, spec: TenantSpec, now: float) -> float:
        if not self.shared:
            return self._local.retry_after(self._share(spec), now)
        if spec.rate is None:
            return 1.0
        return max(1.0, (1.0 - self._tokens.get(spec.name, 0.0)) / spec.rate)

    def refused(self, spec: TenantSpec, now: float) -> None:
        """A request refused by the limits: it counts in the arrivals that size the leases."""
        self._arrived(spec, now)

    # -- the sync -----------------------------------------------------------------------------------

    def asks(self, now: float) -> dict[str, TenantSync]:
        """What to ask the ledger for each tenant with limits (and give back what is not needed)."""
        out = {}
        for name, spec in list(self._specs.items()):
            need = self._arrival_rate(name, now) * self.horizon_s
            inflight = self.inflight.get(name, 0)
            tokens, slots = self._tokens.get(name, 0.0), self._slots.get(name, 0)
            if need < 0.05 and not inflight and tokens <= 0.0 and not slots:  # idle: nothing held, forgotten
                del self._specs[name]
                continue
            out[name] = self._ask(spec, need, inflight, tokens)
        return out

    def _ask(self, spec: TenantSpec, need: float, inflight: int, tokens: float) -> TenantSync:
        fields: dict = {}
        if spec.rate is not None:
            target = min(spec.bucket_size(), need)
            fields.update(rate=spec.rate, burst=spec.burst, take=max(0.0, target - tokens),
                          owe=max(0.0, -tokens), give=max(0.0, tokens - 2.0 * target))
        if spec.max_concurrency is not None:
            fields.update(slots_max=spec.max_concurrency, slots_min=inflight,
                          slots_want=min(spec.max_concurrency, inflight + math.ceil(need)))
        return TenantSync(**fields)

    def granted(self, asked: dict[str, TenantSync], reply: SyncReply) -> None:
        """The ledger's answer to `asked`: leases in, given-back tokens out; shared from now on."""
        if not self.shared:  # leases start afresh: what was counted locally stays local
            self._tokens, self._slots = {}, {}
        self.shared, self.replicas = True, max(1, reply.replicas)
        for name, ask in asked.items():
            if ask.rate is not None:
                self._tokens[name] = self._tokens.get(name, 0.0) + reply.tokens.get(name, 0.0) - ask.give
                self._left[name] = reply.left.get(name, 0.0)
            if ask.slots_max is not None:
                self._slots[name] = reply.slots.get(name, 0)
                self._free[name] = reply.free.get(name, 0)

    def lost(self) -> None:
        """The ledger is out of reach: local limits (each divided by the replicas last known) from now."""
        if self.shared:
            self.shared = False
            self._local = Limits()
            self._local.inflight = self.inflight
            self._shares.clear()

    # -- helpers --------------------------------------------------------------------------------------

    def _share(self, spec: TenantSpec) -> TenantSpec:
        shared = self._shares.get(spec)
        if shared is None:
            if len(self._shares) > 4096:  # specs of reloaded files, or of header-named tenants
                self._shares.clear()
            shared = self._shares[spec] = spec.share(self.replicas)
        return shared

    def _arrived(self, spec: TenantSpec, now: float) -> None:
        if spec.rate is None and spec.max_concurrency is None:
            return
        self._specs[spec.name] = spec
        value, since = self._demand.get(spec.name, (0.0, now))
        self._demand[spec.name] = (decayed(value, since, now, DEMAND_HALFLIFE_S) + 1.0, now)

    def _arrival_rate(self, tenant: str, now: float) -> float:
        value, since = self._demand.get(tenant, (0.0, now))
        value = decayed(value, since, now, DEMAND_HALFLIFE_S)
        if value < 1e-3:
            self._demand.pop(tenant, None)
        return value * math.log(2) / DEMAND_HALFLIFE_S
