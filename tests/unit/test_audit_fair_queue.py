"""The admission queue's order, displacement and deadlines hold for any queue, not one example.

router/decision/fair_queue.py: bands are strict; within a band, tenants with a backlog are served
in proportion to their weights (start-time fair queueing: between any two instants while both
have a backlog, served_i / w_i and served_j / w_j differ by at most 1 / w_i + 1 / w_j, however
long one of them was alone before); a new request displaces the newest entry of the least urgent
band below it, else, in its own band, the newest entry of the tenant furthest over its weighted
share if that is not itself. router/decision/admission.py `expires_at`: a queued request is
refused once its budget is below what the engines may hold; the refusal made before tokenizing
never refuses what the full decision would not, and a queued request's wait counts its own turn.
"""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.router.decision.admission import (
    ADMIT,
    EXPIRE_SHARE,
    REFUSE,
    AdmissionConfig,
    Ask,
    Rates,
    before_prediction,
    expires_at,
    on_arrival,
)
from kvroute.router.decision.fair_queue import FairQueue, band_of
from tests.support.properties import PROPERTY

weights = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])


def serve(q: FairQueue, n: int) -> list[str]:
    out = []
    for _ in range(n):
        head = q.head()
        if head is None:
            break
        q.remove(head, served=True)
        out.append(head.tenant)
    return out


def check_fair(order: list[str], w: dict[str, float]) -> None:
    """Every prefix of `order` (all tenants backlogged throughout) serves them by weight."""
    served = dict.fromkeys(w, 0)
    for tenant in order:
        served[tenant] += 1
        for i in w:
            for j in w:
                assert served[i] / w[i] - served[j] / w[j] <= 1 / w[i] + 1 / w[j] + 1e-9, (served, i, j)


@PROPERTY
@given(w=st.dictionaries(st.sampled_from("abcd"), weights, min_size=2, max_size=4), alone=st.integers(0, 30),
       late=st.sampled_from("abcd"))
def test_backlogged_tenants_share_by_weight_however_long_one_was_alone(w, alone, late):
    """One tenant is served alone for a while; then every tenant has a backlog: from then on each
    gets its weighted share (a latecomer gets no credit for the time it was away, and no penalty)."""
    first = next(t for t in w if t != late) if late in w else next(iter(w))
    q = FairQueue(1)
    for i in range(alone + 40):
        q.push(tenant=first, band=0, weight=w[first], arrived=0.0, item=i)
    serve(q, alone)
    for tenant in w:
        if tenant != first:
            for i in range(40):
                q.push(tenant=tenant, band=0, weight=w[tenant], arrived=1.0, item=i)
    check_fair(serve(q, 40), w)


@PROPERTY
@given(pushes=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), min_size=1, max_size=30))
def test_bands_are_strict(pushes):
    q = FairQueue(3)
    for i, (tenant, band) in enumerate(pushes):
        q.push(tenant=tenant, band=band, weight=1.0, arrived=float(i), item=i)
    bands = []
    while (head := q.head()) is not None:
        q.remove(head, served=True)
        bands.append(head.band)
    assert bands == sorted(bands)


def newest(q: FairQueue, band: int, tenant: str | None = None):
    """The entry served last among those of `band` (and `tenant`)."""
    entries = [e for e in q.entries() if e.band == band and (tenant is None or e.tenant == tenant)]
    return max(entries, key=lambda e: e.key()) if entries else None


@PROPERTY
@given(pushes=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), max_size=25),
       served=st.integers(0, 10), tenant=st.sampled_from("abc"), band=st.integers(0, 2),
       w=st.fixed_dictionaries({t: weights for t in "abc"}))
def test_a_full_queue_displaces_the_newest_of_the_least_urgent_or_of_the_tenant_most_over_its_share(
        pushes, served, tenant, band, w):
    q = FairQueue(3)
    for i, (t, b) in enumerate(pushes):
        q.push(tenant=t, band=b, weight=w[t], arrived=float(i), item=i)
    serve(q, served)
    victim = q.victim(tenant, band, w)
    below = [b for b in range(band + 1, 3) if newest(q, b) is not None]
    if below:
        assert victim is newest(q, below[-1])
        return
    counts = {t: sum(1 for e in q.entries() if e.band == band and e.tenant == t) for t in "abc"}
    if not any(counts.values()):
        assert victim is None
        return
    counts[tenant] += 1
    worst = max(counts[t] / w[t] for t in counts)
    if victim is None:
        assert counts[tenant] / w[tenant] == worst
    else:
        assert victim.band == band and victim.tenant != tenant
        assert counts[victim.tenant] / w[victim.tenant] == worst
        assert victim is newest(q, band, victim.tenant)


@PROPERTY
@given(pushes=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), max_size=25), served=st.integers(0, 10),
       tenant=st.sampled_from("abcd"), band=st.integers(0, 2), w=weights)
def test_ahead_counts_the_entries_a_new_request_would_wait_behind(pushes, served, tenant, band, w):
    """`ahead` is what a request pushed now waits behind when the queue drains, entries with exactly
    its tag (queued first, served first) included."""
    q = FairQueue(3)
    for i, (t, b) in enumerate(pushes):
        q.push(tenant=t, band=b, weight=1.0, arrived=float(i), item=i)
    serve(q, served)
    ahead = q.ahead(tenant, band, w)
    mine = q.push(tenant=tenant, band=band, weight=w, arrived=99.0, item="new")
    behind = 0
    while (head := q.head()) is not mine:
        q.remove(head, served=True)
        behind += 1
    assert ahead == behind


@PROPERTY
@given(slo=st.floats(0.05, 30.0), share=st.floats(0.0, 1.5), arrived=st.floats(0.0, 1e4))
def test_a_queued_request_expires_once_its_budget_is_below_what_the_engines_may_hold(slo, share, arrived):
    """At `expires_at` the budget left (SLO less the time waited) is the engines' threshold, or a
    tenth of the SLO when the threshold is smaller: never later than the threshold allows, never
    with less than that tenth left."""
    threshold = slo * share
    at = expires_at(slo, arrived, threshold)
    budget = slo - (at - arrived)
    assert budget == pytest.approx(max(threshold, EXPIRE_SHARE * slo), rel=1e-6, abs=1e-9)
    assert budget >= threshold - 1e-9


@pytest.mark.parametrize("edges", [(0,), (0, 1), (-5, 0, 3), (1, 2, 3, 10)])
def test_a_priority_is_in_the_band_of_the_edges_at_or_below_it(edges):
    for priority in range(-8, 13):
        band = band_of(priority, edges)
        assert band == sum(1 for e in edges if e <= priority)
        assert 0 <= band <= len(edges)


@PROPERTY
@given(queued=st.integers(0, 40), admitted=st.integers(0, 60), slo=st.floats(0.1, 20.0),
       margin=st.floats(-0.9, 1.0), predicted=st.floats(0.0, 30.0), waited=st.floats(0.0, 1.0))
def test_the_cheap_refusal_refuses_only_what_the_full_decision_refuses(queued, admitted, slo, margin, predicted,
                                                                      waited):
    """Before tokenizing, `before_prediction` refuses by the queue alone; whatever the prediction then
    says, `on_arrival` refuses it too. A queued request's wait counts its own turn: (ahead + 1) / drain."""
    config = AdmissionConfig(slo_ttft_s=slo, margin=margin)
    queue, rates, now = FairQueue(config.bands), Rates(config.drain_halflife_s), 100.0
    for i in range(queued):
        queue.push(tenant=f"t{i % 3}", band=1, weight=1.0, arrived=now, item=i)
    for i in range(admitted):
        rates.add(f"t{i % 3}", now - 2.0 * i / max(admitted, 1))
    ask = Ask(tenant="new", band=1, weight=1.0, slo_s=slo, arrived=now - waited, predicted_s=predicted)
    cheap = before_prediction(config, dataclasses.replace(ask, predicted_s=None), queue, rates, {}, now)
    full = on_arrival(config, ask, queue, rates, {}, now)
    if cheap is not None:
        assert cheap.action == REFUSE and full.action == REFUSE, (cheap.reason, full.action)
    ahead = queue.ahead("new", 1, 1.0)
    if ahead and full.action != ADMIT:
        drain = max(sum(rates.rates(now).values()), config.min_drain_rps)
        assert full.wait_s >= (ahead + 1) / drain - 1e-9
