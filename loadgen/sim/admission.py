"""Admission in the simulator: the router's decision and fair queue (router/decision/admission.py,
fair_queue.py) on the virtual clock, as router/service/admission_gate.py runs them on live traffic.

`arrive` decides a new request: True to dispatch it now; otherwise it is queued or refused
(a record with 429/503, its latency the time it waited). `poke` (a load report, tokens)
lets the queue's head go while its prediction fits; each queued request also has a timer
on the cluster's clock at which it is refused if it is still waiting. The prediction is the
router's: the decision on the simulator's groups, not recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.contract.protocol import block_hashes
from kvroute.router.decision import admission as adm
from kvroute.router.decision.base import RouteRequest
from kvroute.router.decision.fair_queue import FairQueue, QueueEntry, band_of
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.decision.route import Members, NoCandidates, RouteDecision
from kvroute.router.decision.tenants import DEFAULT_TENANT
from kvroute.router.index.memory import MemoryIndex


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdmissionSetup:
    """The admission config and the tenants: a request's tenant is its group up to the first ':'
    (loadgen/sim/tenant_mix.py names them so), with that tenant's (priority, weight)."""

    config: adm.AdmissionConfig
    tenants: tuple[tuple[str, int, float], ...] = ()  # (name, priority, weight)

    def tenant_of(self, spec: RequestSpec) -> tuple[str, int]:
        name = spec.group.partition(":")[0] if ":" in spec.group else DEFAULT_TENANT
        for tenant, priority, _ in self.tenants:
            if tenant == name:
                return name, priority
        return name, 0

    def weights(self) -> dict[str, float]:
        return {name: weight for name, _, weight in self.tenants}


class SimAdmission:
    def __init__(self, setup: AdmissionSetup, *, index: MemoryIndex, decision: RouteDecision,
                 members: Callable[[], Members[int]], block_size: int, seed_of: Callable[[RequestSpec], int],
                 dispatch: Callable[[RequestSpec, float], None], record: Callable[[RequestSpec, RequestRecord], None],
                 call_at: Callable[[float, Callable[[], None]], None], share: FleetShare | None = None) -> None:
        """`share`: the fleet's rates and virtual time (router/decision/fleet_share.py) for one of several
        router replicas sharing admission (loadgen/sim/replicas.py); None: this router's own."""
        self.config, self.index, self.decision, self.members = setup.config, index, decision, members
        self.block_size, self.seed_of = block_size, seed_of  # a spec's chain seed (its adapter's)
        self.dispatch, self.record, self.call_at, self.tenant_of = dispatch, record, call_at, setup.tenant_of
        self.weights: Mapping[str, float] = setup.weights()
        assert setup.config.slo_ttft_s is not None  # made only with an SLO (loadgen/sim/router.py)
        self.slo_s = setup.config.slo_ttft_s
        self.queue: FairQueue[RequestSpec] = FairQueue(setup.config.bands, share.tags if share is not None else None)
        self.rates: adm.Rates = share.rates if share is not None else adm.Rates(setup.config.drain_halflife_s)
        self.outcomes: dict[str, int] = {}
        self._busy = False

    def predict(self, spec: RequestSpec, now: float) -> adm.Prediction:
        tokens = spec.prompt_ids
        route = RouteRequest(num_tokens=len(tokens),
                             block_hashes=tuple(block_hashes(tokens, self.block_size, self.seed_of(spec))),
                             block_size=self.block_size, request_id=f"r{spec.index}", adapter=spec.adapter or None)
        matches = self.index.lookup_sync(route.block_hashes) if self.decision.policy.uses_index else {}
        try:
            routed = self.decision.choose(route, self.members(), matches, now)
        except NoCandidates:
            return adm.NO_PREDICTION
        return adm.predicted_ttft(routed.decision)

    def _ask(self, spec: RequestSpec, arrived: float, predicted: adm.Prediction) -> adm.Ask:
        tenant, priority = self.tenant_of(spec)
        return adm.Ask(tenant=tenant, band=band_of(priority, self.config.priority_edges),
                       weight=self.weights.get(tenant, 1.0), slo_s=self.slo_s, arrived=arrived,
                       predicted_s=predicted.ttft_s, prefill_s=predicted.prefill_s)

    def arrive(self, spec: RequestSpec, now: float) -> bool:
        """True: dispatch now; False: queued or refused."""
        ask = self._ask(spec, now, adm.NO_PREDICTION)
        verdict = adm.arriving(self.config, ask, self.queue, self.rates, self.weights, now)
        if verdict is None:
            ask = self._ask(spec, now, self.predict(spec, now))
            verdict = adm.on_arrival(self.config, ask, self.queue, self.rates, self.weights, now)
        if verdict.action == adm.ADMIT:
            self.queue.passed(ask.tenant, ask.band, ask.weight)
            self._admitted(ask.tenant, now, verdict.reason)
            return True
        if verdict.action == adm.REFUSE:
            self._refuse(spec, now, now, verdict)
            return False
        if verdict.displace is not None:
            victim = verdict.displace
            self.queue.remove(victim)
            self._refuse(victim.item, victim.arrived, now, adm.Verdict(action=adm.REFUSE, reason="displaced",
                                                                       status=503))
        entry = self.queue.push(tenant=ask.tenant, band=ask.band, weight=ask.weight, arrived=now, item=spec)
        expires = adm.expires_at(self.slo_s, now, verdict.threshold_s)
        self.call_at(expires, lambda: self._expire(entry, expires))
        return False

    def poke(self, now: float) -> None:
        """News from the fleet: the head goes while its prediction fits (or is refused, its deadline lost).
        Run as the cluster's next event at `now`, never inside the engine step that brought the news."""
        if self._busy or not len(self.queue):
            return
        self._busy = True
        self.call_at(now, lambda: self._release(now))

    def _release(self, now: float) -> None:
        try:
            while (head := self.queue.head()) is not None:
                in_turn = self.queue.in_turn(head.tenant, head.band, self.weights.get(head.tenant, 1.0), head)
                ask = self._ask(head.item, head.arrived, self.predict(head.item, now))
                verdict = adm.head_verdict(self.config, ask, self.queue, self.rates, self.weights, now,
                                           last_admitted=self.rates.last(head.tenant), in_turn=in_turn)
                if verdict.action == adm.WAIT:
                    return
                self.queue.remove(head, served=verdict.action == adm.ADMIT)
                if verdict.action == adm.ADMIT:
                    self._admitted(head.tenant, now, "probe" if verdict.reason == "probe" else "queued")
                    self.dispatch(head.item, head.arrived)
                else:
                    self._refuse(head.item, head.arrived, now, verdict)
        finally:
            self._busy = False

    def _expire(self, entry: QueueEntry, now: float) -> None:
        if self.queue.remove(entry):
            self._refuse(entry.item, entry.arrived, now, adm.Verdict(action=adm.REFUSE, reason="deadline",
                                                                     status=503))

    def _admitted(self, tenant: str, now: float, how: str) -> None:
        self.rates.add(tenant, now)
        self.outcomes[f"admitted_{how}"] = self.outcomes.get(f"admitted_{how}", 0) + 1

    def _refuse(self, spec: RequestSpec, arrived: float, now: float, verdict: adm.Verdict) -> None:
        self.outcomes[verdict.reason] = self.outcomes.get(verdict.reason, 0) + 1
        record = RequestRecord(index=spec.index, group=spec.group, send_s=arrived, planned_s=arrived,
                               prompt_tokens=len(spec.prompt_ids), e2e_s=now - arrived, status=verdict.status,
                               error=f"refused by admission ({verdict.reason})")
        self.record(spec, record)
