"""The pure admission decision and fair queue (router/decision/admission.py, fair_queue.py)."""

import math

import pytest

from kvroute.router.decision import admission as adm
from kvroute.router.decision import shares
from kvroute.router.decision.fair_queue import FairQueue, band_of
from kvroute.router.decision.tenants import Limits, TenantSpec

CFG = adm.AdmissionConfig(slo_ttft_s=0.5, margin=-0.5, max_queue=4)


def ask(predicted, tenant="a", band=1, weight=1.0, arrived=0.0, slo=0.5, prefill=0.0):
    return adm.Ask(tenant=tenant, band=band, weight=weight, slo_s=slo, arrived=arrived, predicted_s=predicted,
                   prefill_s=prefill)


def busy_rates(now=10.0, asked=None, **per_tenant):
    """n admitted per tenant over the last second; `asked`: arrivals per tenant over it (default: n)."""
    rates = adm.Rates(2.0)
    for tenant, n in per_tenant.items():
        for i in range(n):
            rates.add(tenant, now - 1.0 + i / n)
    for tenant, n in {**per_tenant, **(asked or {})}.items():
        for i in range(n):
            rates.arrived(tenant, now - 1.0 + i / n)
    return rates


def recent(now=0.0):
    """Rates with an admission just now (no probe due)."""
    rates = adm.Rates(2.0)
    for tenant in ("a", "b"):
        rates.add(tenant, now)
    return rates


def drain_order(queue):
    out = []
    while (head := queue.head()) is not None:
        queue.remove(head, served=True)
        out.append(head.tenant)
    return out


def test_fair_queue_serves_backlogged_tenants_by_weight():
    q = FairQueue(1)
    for i in range(30):
        q.push(tenant="a", band=0, weight=2.0, arrived=0.0, item=i)
        q.push(tenant="b", band=0, weight=1.0, arrived=0.0, item=i)
    first = drain_order(q)[:30]
    assert first.count("a") == 20 and first.count("b") == 10


def test_what_passes_unqueued_counts_in_the_share_and_what_leaves_unserved_does_not():
    q = FairQueue(1)
    q.push(tenant="keep", band=0, weight=1.0, arrived=0.0, item=0)  # a backlog, so the band remembers
    for _ in range(5):
        q.passed("a", 0, 1.0)  # a was admitted at once five times: it is behind b now
    assert q.push(tenant="b", band=0, weight=1.0, arrived=0.0, item="b").tag < \
        q.push(tenant="a", band=0, weight=1.0, arrived=0.0, item="a").tag
    gone = [q.push(tenant="c", band=0, weight=1.0, arrived=0.0, item=i) for i in range(3)]
    for entry in gone:
        q.remove(entry)  # refused, unserved: c's tag goes back
    assert q.push(tenant="c", band=0, weight=1.0, arrived=0.0, item="c").tag == gone[0].tag


def test_a_light_tenant_waits_behind_almost_nobody():
    q = FairQueue(1)
    for i in range(20):
        q.push(tenant="b", band=0, weight=1.0, arrived=0.0, item=i)
    assert q.ahead("a", 0, 1.0) <= 1 and q.ahead("b", 0, 1.0) == 20


def test_bands_are_strict():
    q = FairQueue(3)
    for i in range(5):
        q.push(tenant="low", band=2, weight=100.0, arrived=0.0, item=i)
    q.push(tenant="high", band=0, weight=1.0, arrived=1.0, item="h")
    q.push(tenant="mid", band=1, weight=1.0, arrived=1.0, item="m")
    assert drain_order(q)[:2] == ["high", "mid"]
    assert q.ahead("low", 2, 1.0) == 0
    assert band_of(-3, (0, 1)) == 0 and band_of(0, (0, 1)) == 1 and band_of(5, (0, 1)) == 2


def test_displacement_takes_the_newest_least_urgent_then_the_tenant_over_its_share():
    q = FairQueue(2)
    low = [q.push(tenant="b", band=1, weight=1.0, arrived=0.0, item=i) for i in range(2)]
    assert q.victim("a", 0, {}) is low[-1]
    q2 = FairQueue(1)
    hog = [q2.push(tenant="b", band=0, weight=1.0, arrived=0.0, item=i) for i in range(3)]
    q2.push(tenant="a", band=0, weight=1.0, arrived=0.0, item="a")
    assert q2.victim("a", 0, {}) is hog[-1]
    assert q2.victim("b", 0, {}) is None  # the hog does not displace others for itself


def test_admits_when_the_prediction_fits_and_nothing_is_queued():
    v = adm.on_arrival(CFG, ask(0.2), FairQueue(3), recent(), {}, now=0.0)
    assert v.action == adm.ADMIT and v.reason == "fits" and v.threshold_s == pytest.approx(0.25)


def test_queues_a_request_the_engines_cannot_take_yet_and_refuses_one_they_never_will():
    v = adm.on_arrival(CFG, ask(0.3), FairQueue(3), recent(), {}, now=0.0)
    assert v.action == adm.QUEUE and v.reason == "engines_busy" and v.wait_s == pytest.approx(0.05)
    v = adm.on_arrival(CFG, ask(0.9), FairQueue(3), recent(), {}, now=0.0)
    assert v.action == adm.REFUSE and v.status == 503 and v.reason == "saturated"
    assert v.retry_after_s >= 1.0


def test_deadline_math_counts_the_queue_at_the_drain_rate():
    q = FairQueue(3)
    rates = busy_rates(a=40)  # ~40 admitted in the last 2 s: some 14 req/s
    drain = sum(rates.rates(10.0).values())
    for i in range(int(drain * 0.1)):  # 0.1 s of queue: fits 0.1 + the engines' 0.25 < 0.5
        q.push(tenant="a", band=1, weight=1.0, arrived=10.0, item=i)
    assert adm.on_arrival(CFG, ask(0.1, arrived=10.0), q, rates, {}, now=10.0).action == adm.QUEUE
    for i in range(int(drain * 0.3)):  # 0.4 s of queue: cannot make it
        q.push(tenant="a", band=1, weight=1.0, arrived=10.0, item=i)
    v = adm.on_arrival(CFG, ask(0.1, arrived=10.0), q, rates, {}, now=10.0)
    assert v.action == adm.REFUSE and v.wait_s > 0.25


def test_the_tenant_over_its_share_gets_429_and_the_saturated_fleet_503():
    q = FairQueue(3)
    for i in range(50):
        q.push(tenant="b", band=1, weight=1.0, arrived=10.0, item=i)
    # a asked 20 and got 4: b, which got 36, takes more than its half of what the fleet admits
    hog = adm.on_arrival(CFG, ask(0.3, tenant="b", arrived=10.0), q, busy_rates(asked={"a": 20}, a=4, b=36), {},
                         now=10.0)
    assert hog.action == adm.REFUSE and hog.status == 429 and hog.reason == "over_share"
    # a got all the 4 it asked: b takes what nobody else wants, over no share (work-conserving)
    rest = adm.on_arrival(CFG, ask(0.3, tenant="b", arrived=10.0), q, busy_rates(a=4, b=36), {}, now=10.0)
    assert rest.status == 503 and rest.reason == "saturated"
    alone = adm.on_arrival(CFG, ask(0.3, tenant="b", arrived=10.0), q, busy_rates(b=40), {}, now=10.0)
    assert alone.status == 503 and alone.reason == "saturated"


def test_a_full_queue_displaces_lower_priority_or_refuses():
    q = FairQueue(3)
    for i in range(4):
        q.push(tenant="b", band=2, weight=1.0, arrived=0.0, item=i)
    urgent = adm.on_arrival(CFG, ask(0.3, band=0), q, recent(), {}, now=0.0)
    assert urgent.action == adm.QUEUE and urgent.displace is not None and urgent.displace.band == 2
    same = adm.on_arrival(CFG, ask(0.3, tenant="b", band=2), q, recent(), {}, now=0.0)
    assert same.action == adm.REFUSE and same.reason in ("queue_full", "saturated")


def test_the_head_goes_waits_or_loses_its_deadline():
    assert adm.on_head(CFG, ask(0.2, arrived=0.0), now=0.1).action == adm.ADMIT
    assert adm.on_head(CFG, ask(0.3, arrived=0.0), now=0.1, last_admitted=0.0).action == adm.WAIT  # 0.25 < 0.3 <= 0.4
    late = adm.on_head(CFG, ask(0.3, arrived=0.0), now=0.3, last_admitted=0.0)  # budget 0.2 < 0.3
    assert late.action == adm.REFUSE and late.reason == "deadline"
    assert adm.on_head(CFG, ask(None), now=0.0).action == adm.ADMIT  # a policy that predicts nothing
    # the threshold is never below the request's own prefill: a long prompt on an idle fleet goes
    fits = adm.on_arrival(CFG, ask(0.4, prefill=0.4), FairQueue(3), recent(), {}, now=0.0)
    assert fits.action == adm.ADMIT and fits.reason == "fits"
    assert adm.expires_at(0.5, 1.0) == pytest.approx(1.45)
    # queued past the point where its budget is below what the engines may hold: refused then
    assert adm.expires_at(0.5, 1.0, threshold_s=0.3) == pytest.approx(1.2)
    assert adm.expires_at(0.5, 1.0, threshold_s=0.01) == pytest.approx(1.45)


def test_rates_decay_and_share():
    rates = busy_rates(a=10, b=30)
    r = rates.rates(10.0)
    assert r["b"] > 2.5 * r["a"]
    assert shares.over_share("b", {}, r) and not shares.over_share("a", {}, r)
    assert not shares.over_share("b", {"b": 4.0}, r)  # weight 4 of 5: 75% is its share
    assert sum(rates.rates(100.0).values()) < 1e-3


def test_counts_decay_by_their_half_life_across_rescalings_and_never_backwards():
    counts = shares.Counts(halflife_s=2.0)
    counts.add("a", 0.0)
    counts.add("a", 0.0)
    assert counts.value("a", 2.0) == pytest.approx(1.0)  # one half-life: half of 2
    assert counts.value("a", 1.0) == pytest.approx(2.0 * 0.5 ** 0.5)  # reading changed nothing
    assert counts.value("a", -1.0) == pytest.approx(2.0)  # before the last event: no growth
    for k in range(1, 200):  # past many rescalings (every 32 half-lives), one event a second
        counts.add("b", float(k))
    # the sum of a geometric series of ratio 2^-(1/2), after 199 terms: its limit
    assert counts.value("b", 199.0) == pytest.approx(1.0 / (1.0 - 0.5 ** 0.5), rel=1e-6)
    later = counts.value("b", 199.0 + 80 * 2.0)  # read far ahead: nothing changes, nothing overflows
    assert later == pytest.approx(counts.value("b", 199.0) * 2.0 ** -80) and counts.value("b", 1e9) == 0.0
    assert "a" not in counts.rates(199.0)  # 2 x 2^-99.5: forgotten
    assert counts.rates(199.0)["b"] == pytest.approx(counts.value("b", 199.0) * math.log(2) / 2.0)


def test_tenant_limits_rate_and_concurrency():
    spec, limits = TenantSpec(name="a", rate=2.0, burst=2.0, max_concurrency=3), Limits()
    for _ in range(2):
        assert limits.check(spec, 0.0) is None
        limits.take(spec, 0.0)
    assert limits.check(spec, 0.0) == "rate_limit" and limits.retry_after(spec, 0.0) >= 1.0
    assert limits.check(spec, 0.5) is None
    limits.take(spec, 0.5)
    assert limits.check(spec, 10.0) == "concurrency"
    limits.finished("a")
    assert limits.check(spec, 10.0) is None


def test_each_router_worker_enforces_its_share_of_a_tenants_limits():
    spec = TenantSpec(name="a", rate=10.0, burst=4.0, max_concurrency=5)
    half = spec.share(2)
    assert (half.rate, half.burst, half.max_concurrency) == (5.0, 2.0, 2)  # 2 x 2 <= 5: never over the limit
    assert spec.share(1) is spec and TenantSpec(name="b").share(4) == TenantSpec(name="b")
    tiny = TenantSpec(name="c", rate=1.0, max_concurrency=1).share(4)
    assert (tiny.rate, tiny.burst, tiny.max_concurrency) == (0.25, 1.0, 1)  # at least one request, one token
    limits = Limits()
    for _ in range(2):
        assert limits.check(half, 0.0) is None
        limits.take(half, 0.0)
    assert limits.check(half, 0.0) == "concurrency"


def test_config_is_validated():
    with pytest.raises(ValueError):
        adm.AdmissionConfig(slo_ttft_s=0.0)
    with pytest.raises(ValueError):
        adm.AdmissionConfig(priority_edges=(1, 0))
    with pytest.raises(ValueError):
        TenantSpec(name="a b")
    assert adm.AdmissionConfig().slo_ttft_s is None  # off by default


def test_calibration_learns_how_far_observed_runs_from_predicted_and_forgets():
    cal = adm.Calibration(limit_s=0.5, alpha=0.5, halflife_s=5.0)
    for _ in range(20):
        cal.observe(0.1, 0.3, now=0.0)
    assert cal.bias_s(0.0) == pytest.approx(0.2, abs=1e-3)
    assert cal.corrected(adm.Prediction(ttft_s=0.1, prefill_s=0.05), 0.0).ttft_s == pytest.approx(0.3, abs=1e-3)
    assert cal.bias_s(5.0) == pytest.approx(0.1, abs=1e-3)  # nothing observed: it decays
    for _ in range(40):
        cal.observe(0.1, 60.0, now=10.0)  # a stall: each sample clamped, the bias at most the limit
    assert cal.bias_s(10.0) <= 0.5
    for _ in range(40):
        cal.observe(0.5, 0.0, now=10.0)
    assert cal.corrected(adm.Prediction(ttft_s=0.1, prefill_s=0.05), 10.0).ttft_s == pytest.approx(0.05)
    assert cal.corrected(adm.NO_PREDICTION, 10.0).ttft_s is None


def test_a_tenant_with_nothing_admitted_lately_gets_a_probe_through():
    rates = adm.Rates(2.0)
    never = adm.on_arrival(CFG, ask(0.9), FairQueue(3), rates, {}, now=0.0)
    assert never.action == adm.ADMIT and never.reason == "probe"  # nothing admitted ever: learn
    rates.add("a", 0.0)
    assert adm.on_arrival(CFG, ask(0.9), FairQueue(3), rates, {}, now=0.5).action == adm.REFUSE
    assert adm.on_arrival(CFG, ask(0.9, tenant="b"), FairQueue(3), rates, {}, now=0.5).reason == "probe"
    assert adm.on_arrival(CFG, ask(0.9), FairQueue(3), rates, {}, now=1.5).reason == "probe"
    assert adm.on_head(CFG, ask(0.9, arrived=1.4), now=1.5, last_admitted=0.0).reason == "probe"
