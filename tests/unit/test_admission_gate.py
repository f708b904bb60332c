"""The router's admission gate on an event loop: queueing, release by news, displacement, cancel."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from kvroute.router.contract.errors import Overloaded
from kvroute.router.decision.admission import AdmissionConfig, Prediction
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.tenant_book import TenantBook


class Fleet:
    """What predictions say: the engines' wait, changed by the test."""

    def __init__(self, wait: float) -> None:
        self.wait = wait

    def predict(self):
        async def predicted():
            return Prediction(ttft_s=self.wait + 0.01, prefill_s=0.01)
        return predicted


def gate(slo=10.0, max_queue=8, clock=None) -> AdmissionGate:
    config = AdmissionConfig(slo_ttft_s=slo, margin=-0.5, max_queue=max_queue)
    kw = {"clock": clock} if clock else {}
    g = AdmissionGate(config, TenantBook(None), AdmissionMetrics(CollectorRegistry()), **kw)
    for tenant in ("a", "b"):
        g.rates.add(tenant, g.clock())  # admitted just now: no probe is due
    return g


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_queued_request_goes_when_news_says_it_fits():
    g, fleet = gate(), Fleet(wait=6.0)  # threshold 5 s: over it, within the 10 s budget
    ticket = g.ticket("a", 0, None)
    task = asyncio.ensure_future(g.enter(ticket, fleet.predict()))
    await settle()
    assert not task.done() and len(g.queue) == 1
    g.poke()  # news, but it still does not fit
    await settle()
    assert not task.done()
    fleet.wait = 1.0
    g.poke()
    await asyncio.wait_for(task, 5)
    assert len(g.queue) == 0 and ticket.dispatched and ticket.predicted_s == pytest.approx(1.01)
    g.release(ticket, None)
    assert g.limits.inflight == {}


async def test_an_urgent_request_displaces_queued_background_work_when_full():
    g, fleet = gate(max_queue=1), Fleet(wait=6.0)
    low = asyncio.ensure_future(g.enter(g.ticket("b", 5, None), fleet.predict()))
    await settle()
    high = asyncio.ensure_future(g.enter(g.ticket("a", -1, None), fleet.predict()))
    await settle()
    with pytest.raises(Overloaded) as refused:
        await asyncio.wait_for(low, 5)
    assert refused.value.code == "displaced" and not refused.value.too_many
    assert len(g.queue) == 1 and not high.done()
    fleet.wait = 0.0
    g.poke()
    await asyncio.wait_for(high, 5)


async def test_a_client_that_leaves_leaves_the_queue():
    g, fleet = gate(), Fleet(wait=6.0)
    task = asyncio.ensure_future(g.enter(g.ticket("a", 0, None), fleet.predict()))
    await settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(g.queue) == 0 and g.queue.depth() == {}


async def test_a_queued_request_is_refused_when_its_deadline_passes():
    g, fleet = gate(slo=0.05), Fleet(wait=0.035)  # over the 0.025 s threshold, never released
    with pytest.raises(Overloaded) as refused:
        await asyncio.wait_for(g.enter(g.ticket("a", 0, None), fleet.predict()), 5)
    assert refused.value.code == "deadline" and len(g.queue) == 0


async def test_with_workers_the_gate_takes_its_share_of_the_tenants_limits(tmp_path):
    path = tmp_path / "tenants.json"
    path.write_text('{"tenants": {"a": {"rate": 8, "max_concurrency": 4}}}')
    config = AdmissionConfig(slo_ttft_s=None)
    g = AdmissionGate(config, TenantBook(str(path)), AdmissionMetrics(CollectorRegistry()), workers=4)
    spec = g.ticket("a", 0, None).spec
    assert (spec.rate, spec.burst, spec.max_concurrency) == (2.0, 2.0, 1)
    assert g.ticket("a", 0, None).spec is spec  # kept, not rebuilt per request
    one = AdmissionGate(config, TenantBook(str(path)), AdmissionMetrics(CollectorRegistry()))
    assert one.ticket("a", 0, None).spec.rate == 8


async def test_without_an_slo_or_limits_the_gate_does_nothing():
    g = gate(slo=None)
    ticket = g.ticket("a", 0, None)

    async def never():
        raise AssertionError("no prediction without an SLO")
    await g.enter(ticket, never)
    assert not ticket.dispatched and len(g.queue) == 0


async def test_a_tenant_with_limits_and_no_slo_is_counted_not_queued():
    from kvroute.router.decision.tenants import TenantSpec

    g = gate(slo=None)
    g.book.tenants = {"a": TenantSpec(name="a", max_concurrency=1)}
    first = g.ticket("a", 0, None)
    g.reserve(first)
    await g.enter(first, Fleet(wait=99.0).predict())
    assert first.dispatched and len(g.queue) == 0
    with pytest.raises(Overloaded) as refused:
        g.reserve(g.ticket("a", 0, None))
    assert refused.value.too_many and refused.value.code == "concurrency"
    g.release(first, None)
    g.reserve(g.ticket("a", 0, None))  # room again
