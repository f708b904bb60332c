"""Both drivers of the admission queue admit in the queue's own fair order.

The fair queue (router/decision/fair_queue.py) orders waiting requests by virtual time, which moves
only when an entry is removed as served; the router's gate (router/service/admission_gate.py) and
the simulator's admission (loadgen/sim/admission.py) must remove each head they admit that way, or
a tenant that arrives later jumps the whole backlog of one that waited. Here tenant a queues six
requests, three are admitted, tenant b queues three, then all go: each driver's admission order
must be the one the queue itself gives when it is served directly.
"""

import asyncio

from prometheus_client import CollectorRegistry

from kvroute.loadgen.sim.admission import AdmissionSetup, SimAdmission
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.decision.admission import AdmissionConfig, Prediction
from kvroute.router.decision.base import Decision, PolicyBase
from kvroute.router.decision.fair_queue import FairQueue
from kvroute.router.decision.route import RouteDecision
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.tenant_book import TenantBook

CONFIG = AdmissionConfig(slo_ttft_s=100.0, margin=-0.5)  # the engines may hold 50 s of predicted TTFT
FITS, BUSY = 1.0, 60.0  # predicted TTFT: within the threshold, or over it and within the SLO
FIRST, ADMITTED_FIRST, SECOND = 6, 3, 3
# as many admitted of each tenant just before: neither is light nor over its share (shares.py), so
# only the queue orders them
BALANCED = 20


class Fleet:
    """Predictions: the next `fits` of them fit, the rest see busy engines."""

    def __init__(self) -> None:
        self.fits = 0

    def ttft(self) -> float:
        if self.fits:
            self.fits -= 1
            return FITS
        return BUSY


def expected_order() -> list[str]:
    q = FairQueue(CONFIG.bands)
    order = []

    def serve(n: int) -> None:
        for _ in range(n):
            head = q.head()
            q.remove(head, served=True)
            order.append(head.tenant)

    for i in range(FIRST):
        q.push(tenant="a", band=1, weight=1.0, arrived=0.0, item=i)
    serve(ADMITTED_FIRST)
    for i in range(SECOND):
        q.push(tenant="b", band=1, weight=1.0, arrived=0.0, item=i)
    serve(FIRST + SECOND - ADMITTED_FIRST)
    return order


async def test_the_routers_gate_admits_in_the_queues_fair_order():
    gate, fleet, order = AdmissionGate(CONFIG, TenantBook(None), AdmissionMetrics(CollectorRegistry())), Fleet(), []
    for tenant in ("a", "b"):
        for _ in range(BALANCED):  # admitted just now: no probe is due
            gate.rates.add(tenant, gate.clock())

    async def predict() -> Prediction:
        return Prediction(ttft_s=fleet.ttft(), prefill_s=0.01)

    async def request(tenant: str) -> None:
        await gate.enter(gate.ticket(tenant, 0, None), predict)
        order.append(tenant)

    async def settle(until) -> None:
        for _ in range(200):
            if until():
                return
            await asyncio.sleep(0)
        raise AssertionError("the gate did not settle")

    tasks = [asyncio.ensure_future(request("a")) for _ in range(FIRST)]
    await settle(lambda: len(gate.queue) == FIRST)
    fleet.fits = ADMITTED_FIRST
    gate.poke()
    await settle(lambda: len(order) == ADMITTED_FIRST and not fleet.fits)
    tasks += [asyncio.ensure_future(request("b")) for _ in range(SECOND)]
    await settle(lambda: len(gate.queue) == FIRST - ADMITTED_FIRST + SECOND)
    fleet.fits = 100
    gate.poke()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == expected_order()


class Predicting(PolicyBase):
    """A policy whose every choice predicts the fleet's TTFT (the simulator's admission reads its terms)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__()
        self.fleet = fleet

    def select(self, request, candidates, matches) -> Decision:
        chosen = candidates[0].id
        return Decision(instance=chosen, terms={chosen: (self.fleet.ttft() - 0.01, 0.01, 0.0, 0.0)})


def test_the_simulators_admission_admits_in_the_queues_fair_order():
    fleet, order, calls = Fleet(), [], []
    setup = AdmissionSetup(config=CONFIG, tenants=(("a", 0, 1.0), ("b", 0, 1.0)))
    sim = SimAdmission(setup, index=MemoryIndex(), decision=RouteDecision(Predicting(fleet)),
                       members=LoadView(["e0"]).all, block_size=16, seed_of=lambda spec: 1,
                       dispatch=lambda spec, arrived: order.append(spec.group[0]),
                       record=lambda spec, record: order.append(f"refused {spec.group}"),
                       call_at=lambda at, fn: calls.append((at, fn)))
    for tenant in ("a", "b"):
        for _ in range(BALANCED):  # admitted just now: no probe is due
            sim.rates.add(tenant, 0.0)

    def run_due(now: float) -> None:
        due = [fn for at, fn in calls if at <= now]
        calls[:] = [(at, fn) for at, fn in calls if at > now]
        for fn in due:
            fn()

    def arrive(tenant: str, i: int) -> None:
        spec = RequestSpec(index=i, prompt_ids=tuple(range(5, 40)), max_tokens=2, group=f"{tenant}:g")
        assert not sim.arrive(spec, 0.0)  # queued

    for i in range(FIRST):
        arrive("a", i)
    fleet.fits = ADMITTED_FIRST
    sim.poke(0.0)
    run_due(0.0)
    assert order == ["a"] * ADMITTED_FIRST
    for i in range(SECOND):
        arrive("b", FIRST + i)
    fleet.fits = 100
    sim.poke(0.0)
    run_due(0.0)
    assert order == expected_order()
