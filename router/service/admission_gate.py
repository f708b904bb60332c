"""The router's admission gate: the pure decision (router/decision/admission.py) on live traffic.

`reserve` takes the request's tenant slot (a place in its concurrency limit, a token of its
rate) before the request is tokenized, or refuses it at once; the slot is the request's until
`release`, so no interleaving of arrivals admits more than the tenant's limits, whatever the
prompts' lengths. `enter` predicts the request's TTFT (the routing decision without recording
it), then admits it, refuses it (raises `Overloaded`: 429 or 503 with Retry-After) or queues it.
A queued request waits on a future; `poke` (a load report, a first token, a finish) wakes the
queue's head, which predicts again and goes, waits, or is refused because its deadline can no
longer be met. A client that leaves while queued leaves the queue. `release` ends the request
(router/service/charges.py calls it, once, whatever happened): its tenant's place, the rate
token too if it was never admitted, and predicted vs observed TTFT.

With `share` (router/decision/fleet_share.py `FleetShare`: `--redis` and several router
replicas or workers), the limits are the fleet's (leased), the weighted shares the fleet's
rates, and the queue tags from the fleet's virtual time; router/service/fleet_admission.py syncs
it in the background and pokes the gate when the fleet's queues moved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

from kvroute.router.contract.errors import Overloaded
from kvroute.router.decision import admission as adm
from kvroute.router.decision.fair_queue import FairQueue, QueueEntry, band_of
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.decision.leases import LeasedLimits
from kvroute.router.decision.tenants import Limits, TenantSpec, spec_of
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.tenant_book import TenantBook

Predict = Callable[[], Awaitable[adm.Prediction]]


async def no_prediction() -> adm.Prediction:
    """For requests admission cannot predict (disaggregated serving): the limits alone apply."""
    return adm.NO_PREDICTION


@dataclasses.dataclass(eq=False, kw_only=True, slots=True)
class Ticket:
    spec: TenantSpec
    band: int
    slo_s: float | None
    arrived: float
    predicted_s: float | None = None  # at dispatch
    dispatched: float = 0.0  # time.perf_counter() at dispatch (the traces' clock)
    queued: bool = False
    held: bool = False  # its tenant's slot is taken (`reserve`) and not given back yet (`release`)


class AdmissionGate:
    def __init__(self, config: adm.AdmissionConfig, book: TenantBook, metrics: AdmissionMetrics,
                 clock: Callable[[], float] = time.monotonic, workers: int = 1,
                 share: FleetShare | None = None) -> None:
        """`workers`: router processes sharing the port; each enforces its share of a tenant's limits,
        unless they share admission (`share`: the fleet's limits, rates and virtual time)."""
        self.config, self.book, self.metrics, self.clock = config, book, metrics, clock
        self.workers = 1 if share is not None else workers
        self.share = share
        self._shares: dict[TenantSpec, TenantSpec] = {}
        self.queue: FairQueue[Ticket] = FairQueue(config.bands, share.tags if share is not None else None)
        self.rates: adm.Rates = share.rates if share is not None else adm.Rates(config.drain_halflife_s)
        self.limits: Limits | LeasedLimits = share.limits if share is not None else Limits()
        # at most a tenth of the default SLO (or 50 ms): a correction, never a lock-out
        self.calibration = adm.Calibration(limit_s=0.1 * (config.slo_ttft_s or 0.5))
        self._waiters: dict[QueueEntry, asyncio.Future] = {}
        self._busy = self._again = False

    def ticket(self, tenant: str, priority: int, slo_s: float | None) -> Ticket:
        spec = spec_of(self.book.tenants, tenant)
        if self.workers > 1:
            shared = self._shares.get(spec)
            if shared is None:
                if len(self._shares) > 4096:  # specs of reloaded files, or of header-named tenants
                    self._shares.clear()
                shared = self._shares[spec] = spec.share(self.workers)
            spec = shared
        return Ticket(spec=spec, band=band_of(spec.priority_for(priority), self.config.priority_edges),
                      slo_s=spec.slo_for(slo_s, self.config.slo_ttft_s), arrived=self.clock())

    def gated(self, ticket: Ticket) -> bool:
        spec = ticket.spec
        return ticket.slo_s is not None or spec.rate is not None or spec.max_concurrency is not None

    def _ask(self, ticket: Ticket, predicted: adm.Prediction) -> adm.Ask:
        predicted = self.calibration.corrected(predicted, self.clock())
        return adm.Ask(tenant=ticket.spec.name, band=ticket.band, weight=ticket.spec.weight,
                       slo_s=ticket.slo_s or float("inf"), arrived=ticket.arrived, predicted_s=predicted.ttft_s,
                       prefill_s=predicted.prefill_s)

    def weights(self) -> dict[str, float]:
        return {name: spec.weight for name, spec in self.book.tenants.items()}

    def reserve(self, ticket: Ticket) -> None:
        """Take the tenant's slot before the request is tokenized and predicted, or refuse it
        (Overloaded) when the tenant's limits or the queue alone say so. Checked and taken in one
        step, so no other request comes in between; held until `release`."""
        if ticket.held or not self.gated(ticket):
            return
        now = self.clock()
        limited = self.limits.check(ticket.spec, now)
        if limited is not None:
            self.limits.refused(ticket.spec, now)
            raise self._refused(ticket, limited, 429, self.limits.retry_after(ticket.spec, now))
        if ticket.slo_s is not None:
            verdict = adm.arriving(self.config, self._ask(ticket, adm.NO_PREDICTION), self.queue, self.rates,
                                   self.weights(), now)
            if verdict is not None:
                raise self._refused(ticket, verdict.reason, verdict.status, verdict.retry_after_s)
        self.limits.take(ticket.spec, now)
        ticket.held = True

    async def enter(self, ticket: Ticket, predict: Predict) -> None:
        """Return when `ticket` is admitted; Overloaded when it is refused (`reserve` first, if not
        reserved already). `release` ends it either way."""
        if not self.gated(ticket):
            return
        self.reserve(ticket)
        if ticket.slo_s is None:  # limits only: checked by precheck, counted here
            return self._admit(ticket, adm.NO_PREDICTION, self.clock())
        predicted = await predict()
        now = self.clock()
        verdict = adm.on_arrival(self.config, self._ask(ticket, predicted), self.queue, self.rates,
                                 self.weights(), now)
        if verdict.action == adm.ADMIT:
            self.queue.passed(ticket.spec.name, ticket.band, ticket.spec.weight)
            return self._admit(ticket, predicted, now, verdict.reason)
        if verdict.action == adm.REFUSE:
            raise self._refused(ticket, verdict.reason, verdict.status, verdict.retry_after_s)
        if verdict.displace is not None:
            self._displace(verdict.displace)
        await self._wait(ticket, predict, adm.expires_at(ticket.slo_s, ticket.arrived, verdict.threshold_s))

    def explain(self, ticket: Ticket, predicted: adm.Prediction) -> dict:
        """What `enter` would decide now, for POST /router/explain (nothing recorded)."""
        out = {"tenant": ticket.spec.name, "band": ticket.band, "slo_ttft_s": ticket.slo_s,
               "predicted_ttft_s": predicted.ttft_s, "predicted_prefill_s": predicted.prefill_s,
               "calibration_bias_s": self.calibration.bias_s(self.clock()), "queued": len(self.queue)}
        if not self.gated(ticket):
            return {**out, "action": adm.ADMIT, "reason": "no SLO and no limits for this tenant"}
        limited = self.limits.check(ticket.spec, self.clock())
        if limited is not None:
            return {**out, "action": adm.REFUSE, "reason": limited, "status": 429}
        if ticket.slo_s is None:
            return {**out, "action": adm.ADMIT, "reason": "within the tenant's limits"}
        v = adm.on_arrival(self.config, self._ask(ticket, predicted), self.queue, self.rates, self.weights(),
                           self.clock())
        return {**out, "action": v.action, "reason": v.reason, "status": v.status or None,
                "retry_after_s": v.retry_after_s or None, "estimated_wait_s": v.wait_s, "budget_s": v.budget_s,
                "threshold_s": v.threshold_s, "why": v.explained()}

    async def _wait(self, ticket: Ticket, predict: Predict, expires: float) -> None:
        entry = self.queue.push(tenant=ticket.spec.name, band=ticket.band, weight=ticket.spec.weight,
                                arrived=ticket.arrived, item=ticket)
        ticket.queued = True
        self.metrics.depth(ticket.spec.name, ticket.band, +1)
        first = True
        try:
            while True:
                future = self._waiters[entry] = asyncio.get_running_loop().create_future()
                if first and self.queue.head() is entry:
                    future.set_result(None)
                first = False
                left = expires - self.clock()
                done, _ = await asyncio.wait((future,), timeout=max(0.0, left))
                if not done:
                    raise self._leave(entry, self._refused(ticket, "deadline", 503, 1.0))
                future.result()  # a displacement raises here
                if self.queue.head() is not entry:
                    continue
                if await self._try_head(ticket, entry, predict):
                    return
        finally:
            self._waiters.pop(entry, None)
            if self.queue.remove(entry):  # cancelled, or refused
                self._left(ticket)
                self.poke()

    async def _try_head(self, ticket: Ticket, entry: QueueEntry, predict: Predict) -> bool:
        """The head predicts again: True when admitted; Overloaded when its deadline is lost."""
        self._busy = True
        try:
            while True:
                self._again = False
                predicted = await predict()
                now = self.clock()
                in_turn = self.queue.in_turn(ticket.spec.name, ticket.band, ticket.spec.weight, entry)
                verdict = adm.head_verdict(self.config, self._ask(ticket, predicted), self.queue, self.rates,
                                           self.weights(), now, last_admitted=self.rates.last(ticket.spec.name),
                                           in_turn=in_turn)
                if verdict.action == adm.REFUSE:
                    raise self._leave(entry, self._refused(ticket, verdict.reason, verdict.status,
                                                           verdict.retry_after_s))
                if verdict.action == adm.ADMIT:
                    self.queue.remove(entry, served=True)
                    self._admit(ticket, predicted, now, verdict.reason)
                    self._left(ticket)
                    return True
                if not self._again:
                    return False
        finally:
            self._busy = False
            if self.queue.head() is not entry:
                self.poke()

    def _leave(self, entry: QueueEntry, error: Overloaded) -> Overloaded:
        if self.queue.remove(entry):
            self._left(entry.item)
        return error

    def _left(self, ticket: Ticket) -> None:
        ticket.queued = False
        self.metrics.depth(ticket.spec.name, ticket.band, -1)
        self.metrics.waited(ticket.spec.name, ticket.band, self.clock() - ticket.arrived)

    def _displace(self, victim: QueueEntry) -> None:
        ticket = victim.item
        future = self._waiters.get(victim)
        self.queue.remove(victim)
        self._left(ticket)
        error = self._refused(ticket, "displaced", 503, 1.0)
        if future is not None and not future.done():
            future.set_exception(error)

    def poke(self) -> None:
        """News from the fleet (a load report, a first token, a finish): wake the queue's head."""
        if self._busy:
            self._again = True
            return
        head = self.queue.head()
        if head is not None:
            future = self._waiters.get(head)
            if future is not None and not future.done():
                future.set_result(None)

    def _admit(self, ticket: Ticket, predicted: adm.Prediction, now: float, reason: str = "fits") -> None:
        ticket.predicted_s, ticket.dispatched = predicted.ttft_s, time.perf_counter()
        self.rates.add(ticket.spec.name, now)
        how = "probe" if reason == "probe" else "queued" if ticket.queued else "fits"
        self.metrics.decided(ticket.spec.name, ticket.band, "admitted", how)
        if predicted.ttft_s is not None:
            self.metrics.predicted(ticket.spec.name, predicted.ttft_s)

    def _refused(self, ticket: Ticket, reason: str, status: int, retry_after_s: float) -> Overloaded:
        self.metrics.decided(ticket.spec.name, ticket.band, "refused", reason)
        message = {"rate_limit": "is over its request rate", "concurrency": "has its most requests in flight",
                   "over_share": "is over its share of a saturated fleet",
                   "deadline": "cannot be served within its TTFT SLO",
                   "displaced": "was displaced by more urgent work", "queue_full": "finds the admission queue full",
                   "saturated": "cannot be served within its TTFT SLO: the fleet is saturated"}[reason]
        return Overloaded(f"tenant {ticket.spec.name}'s request {message} ({reason})", retry_after=retry_after_s,
                          too_many=status == 429, code=reason)

    def release(self, ticket: Ticket, first_token: float | None) -> None:
        """A request ended, admitted or not: its tenant's slot is given back (the rate token too when
        it was never admitted). `first_token` is its trace's (time.perf_counter()) or None."""
        if not ticket.held:
            return
        ticket.held = False
        if not ticket.dispatched:
            self.limits.give_back(ticket.spec, self.clock())
            return self.poke()
        self.limits.finished(ticket.spec.name)
        if first_token is not None and ticket.predicted_s is not None:
            self.metrics.observed(ticket.spec.name, first_token - ticket.dispatched)
            self.calibration.observe(ticket.predicted_s, first_token - ticket.dispatched, self.clock())
        self.poke()
