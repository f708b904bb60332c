"""Every rate limit and bucket holds its bound whatever the traffic (property and table tests).

Issue 36's audit planted a token bucket that refilled past its burst cap and the whole suite
passed. These tests state each limiter's contract over many traffic patterns instead of one
example: a tenant's token bucket, concurrency and Retry-After, and each router worker's share of
them (router/decision/tenants.py); the admitted-rate estimate that drains the admission queue
(router/decision/admission.py `Rates`); the router's --max-inflight (router/decision/route.py);
the engine's --max-waiting (engine/core/engine_core.py) and the per-batch budget of KV loads
(engine/kv/load_queue.py).
"""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.engine_core import CoreConfig, EngineCore
from kvroute.engine.core.kv_copies import CopyPlan, StoredBlock
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.engine.kv.load_queue import Load, LoadQueue
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.router.decision.admission import Rates
from kvroute.router.decision.base import RouteRequest
from kvroute.router.decision.policies import make_policy
from kvroute.router.decision.route import NoCandidates, RouteDecision, RouteSettings
from kvroute.router.decision.tenants import Limits, TenantSpec
from tests.support.properties import PROPERTY

EPS = 1e-9
rates = st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0, 10.0])
bursts = st.one_of(st.none(), st.sampled_from([1.0, 1.5, 2.0, 4.0, 7.0]))
gaps = st.one_of(st.just(0.0), st.floats(0.001, 0.5), st.floats(0.5, 30.0))


def bucket_size(spec: TenantSpec) -> float:
    return spec.burst or max(1.0, spec.rate)


def offer(limits: Limits, spec: TenantSpec, now: float) -> bool:
    """One request of `spec`'s tenant at `now`: admitted (and ended at once: only the rate counts)?"""
    if limits.check(spec, now) is not None:
        return False
    limits.take(spec, now)
    limits.finished(spec.name)
    return True


# -- a tenant's token bucket ---------------------------------------------------------------------


@PROPERTY
@given(rate=rates, burst=bursts, trace=st.lists(st.tuples(gaps, st.integers(1, 6)), min_size=1, max_size=40))
def test_no_window_admits_more_than_the_burst_plus_the_refill(rate, burst, trace):
    """Whatever the arrival pattern (idle stretches included), the requests admitted between any two
    instants t0 <= t1 number at most burst + rate x (t1 - t0): a bucket never holds more than its burst."""
    spec, limits, now, admitted = TenantSpec(name="t", rate=rate, burst=burst), Limits(), 0.0, []
    for gap, tries in trace:
        now += gap
        admitted += [now for _ in range(tries) if offer(limits, spec, now)]
    size = bucket_size(spec)
    for i, t0 in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= size + rate * (admitted[j] - t0) + EPS, (t0, admitted[j], j - i + 1)


@pytest.mark.parametrize("rate,burst", [(0.5, None), (1.0, None), (2.0, None), (10.0, None), (1.0, 3.0),
                                        (2.0, 4.0), (3.0, 1.5), (0.25, 2.0), (5.0, 1.0)])
@pytest.mark.parametrize("idle_s", [0.0, 1.0, 60.0, 3600.0])
def test_after_any_idle_time_a_full_bucket_admits_exactly_its_burst(rate, burst, idle_s):
    spec, limits = TenantSpec(name="t", rate=rate, burst=burst), Limits()
    assert offer(limits, spec, 0.0)  # the bucket is known, one token spent
    now = bucket_size(spec) / rate + idle_s  # long enough to refill whatever was spent
    n = 0
    while offer(limits, spec, now):
        n += 1
        assert n <= 100
    assert n == math.floor(bucket_size(spec))
    assert limits.check(spec, now) == "rate_limit"


@pytest.mark.parametrize("rate,burst", [(1.0, 4.0), (2.0, 5.0), (0.5, 3.0), (4.0, 8.0)])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_an_empty_bucket_gets_one_token_back_per_one_over_rate(rate, burst, k):
    spec, limits = TenantSpec(name="t", rate=rate, burst=burst), Limits()
    while offer(limits, spec, 0.0):
        pass
    now = k / rate + 1e-6
    n = 0
    while offer(limits, spec, now):
        n += 1
    assert n == min(k, math.floor(burst))


@PROPERTY
@given(rate=rates, burst=bursts, trace=st.lists(st.tuples(gaps, st.integers(1, 8)), min_size=1, max_size=25))
def test_retry_after_is_when_the_next_token_is_back(rate, burst, trace):
    """A refused request's Retry-After (at least 1 s) is the wait for the next token: asked again then
    it is admitted; when the wait is over 1 s, just before it, it is still refused."""
    spec, limits, now = TenantSpec(name="t", rate=rate, burst=burst), Limits(), 0.0
    for gap, tries in trace:
        now += gap
        for _ in range(tries):
            if offer(limits, spec, now):
                continue
            wait = limits.retry_after(spec, now)
            assert wait >= 1.0
            assert limits.check(spec, now + wait + 1e-6) is None
            if wait > 1.0 + 1e-3:
                assert limits.check(spec, now + wait - 1e-3) == "rate_limit"


@PROPERTY
@given(limit=st.integers(1, 5), ops=st.lists(st.sampled_from(["start", "start", "end"]), max_size=60))
def test_concurrency_refuses_exactly_at_the_limit(limit, ops):
    """Requests in flight never exceed max_concurrency, and a request is refused for concurrency
    exactly when `limit` of the tenant's requests are in flight (ends counted as they come)."""
    spec, limits, inflight = TenantSpec(name="t", max_concurrency=limit), Limits(), 0
    for op in ops:
        if op == "end":
            if inflight:
                limits.finished("t")
                inflight -= 1
            continue
        verdict = limits.check(spec, 0.0)
        assert verdict == ("concurrency" if inflight >= limit else None), inflight
        if verdict is None:
            limits.take(spec, 0.0)
            inflight += 1
    assert limits.inflight.get("t", 0) == inflight


def test_tenants_have_buckets_and_counts_of_their_own():
    a, b = TenantSpec(name="a", rate=1.0, max_concurrency=1), TenantSpec(name="b", rate=1.0, max_concurrency=1)
    limits = Limits()
    limits.take(a, 0.0)
    assert limits.check(a, 0.0) == "concurrency" and limits.check(b, 0.0) is None
    limits.finished("a")
    assert limits.check(a, 0.0) == "rate_limit" and limits.check(b, 0.0) is None


@PROPERTY
@given(rate=st.one_of(st.none(), st.floats(0.1, 100.0)), burst=st.one_of(st.none(), st.floats(1.0, 50.0)),
       concurrency=st.one_of(st.none(), st.integers(1, 40)), workers=st.integers(1, 8))
def test_each_worker_enforces_its_share(rate, burst, concurrency, workers):
    """Each of `workers` router processes takes 1/workers of the rate and the burst (at least one
    token) and of the concurrency (rounded down, at least one): together never more than the
    tenant's limit where one per worker fits in it."""
    spec = TenantSpec(name="t", rate=rate, burst=burst, max_concurrency=concurrency)
    share = spec.share(workers)
    if rate is None:
        assert share.rate is None and share.burst == spec.burst
    else:
        assert share.rate * workers == pytest.approx(rate)
        assert bucket_size(share) == pytest.approx(max(1.0, bucket_size(spec) / workers))
    if concurrency is None:
        assert share.max_concurrency is None
    else:
        assert share.max_concurrency == max(1, concurrency // workers)
        if concurrency >= workers:
            assert share.max_concurrency * workers <= concurrency


@pytest.mark.parametrize("burst", [0.001, 0.5, 0.999])
def test_a_bucket_smaller_than_one_request_is_refused_at_load(burst):
    """A burst below 1 never holds a whole token: the tenant's every request would get 429 forever."""
    with pytest.raises(ValueError, match="burst must be at least 1"):
        TenantSpec(name="t", rate=5.0, burst=burst)


# -- the admitted rate that drains the admission queue ---------------------------------------------


@pytest.mark.parametrize("per_s", [0.5, 2.0, 10.0, 50.0])
@pytest.mark.parametrize("halflife_s", [0.5, 2.0, 10.0])
def test_the_admitted_rate_estimate_converges_to_a_steady_rate_and_forgets(per_s, halflife_s):
    r, now = Rates(halflife_s), 0.0
    end = 20 * halflife_s + 20 / per_s
    while now < end:
        r.add("t", now)
        now += 1.0 / per_s
    assert r.rate("t", now) == pytest.approx(per_s, rel=0.1 + 0.5 / (per_s * halflife_s))
    assert r.rate("t", now + 10 * halflife_s) < 0.002 * r.rate("t", now)


# -- the router's --max-inflight -----------------------------------------------------------------


@PROPERTY
@given(n=st.integers(1, 5), limit=st.integers(1, 3), policy=st.sampled_from(["round_robin", "least_load", "kv_aware"]),
       ops=st.lists(st.one_of(st.just(-1), st.integers(0, 4)), max_size=40))
def test_max_inflight_is_never_exceeded_and_refuses_only_a_full_fleet(n, limit, policy, ops):
    """A decision never picks a member with `limit` requests in flight, and refuses (overloaded)
    exactly when every member has them. Ops: -1 sends a request, i ends one on instance i."""
    view = LoadView([f"e{i}" for i in range(n)])
    decision = RouteDecision(make_policy(policy), RouteSettings(max_inflight=limit))
    route = RouteRequest(num_tokens=32, block_hashes=(1, 2), block_size=16)
    for op in ops:
        if op >= 0:
            if op < n and view.inflight[op]:
                view.finished(op)
            continue
        full = all(c >= limit for c in view.inflight)
        try:
            routed = decision.decide(route, view.all(), {}, 0.0)
        except NoCandidates as e:
            assert full and e.overloaded
            continue
        assert not full and view.inflight[routed.member] < limit
        view.dispatched(routed.member, 0)


# -- the engine's --max-waiting and the KV load budget --------------------------------------------


@pytest.mark.parametrize("max_waiting", [0, 1, 2, 5])
def test_the_engine_queue_takes_exactly_max_waiting(max_waiting):
    core = EngineCore(CoreConfig(instance="e", max_batched_tokens=64, max_running=4, max_waiting=max_waiting,
                                 max_model_len=1024), BlockManager(64, 16), frozenset())
    taken = 0
    while not core.queue_full and taken < 10:
        core.add(Sequence(f"r{taken}", [5] * 20, SamplingParams(max_tokens=2), 1))
        taken += 1
    assert taken == max_waiting


@PROPERTY
@given(budget=st.integers(0, 5), batches=st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_a_copy_batch_loads_at_most_its_budget_and_every_load_goes(budget, batches):
    """Each batch moves at most max(1, budget) ready loads, oldest first, and all of them go in the end."""
    moved: list[int] = []
    queue = LoadQueue(lambda: budget, lambda load: moved.append(load.block_id), lambda *a: None)
    seq = Sequence("r", [5] * 16, SamplingParams(max_tokens=1), 1)
    block_id = 0
    for count in batches:
        loads = [Load(seq=seq, index=i, block_id=block_id + i, block=StoredBlock(block_id + i, (), None),
                      tier="host", slot=block_id + i) for i in range(count)]
        block_id += count
        queue.add(loads)
        before = len(moved)
        queue.drain(CopyPlan())
        assert len(moved) - before <= max(1, budget)
        queue.end_batch()
    while len(queue):
        before = len(moved)
        queue.drain(CopyPlan())
        assert 0 < len(moved) - before <= max(1, budget)
        queue.end_batch()
    assert moved == list(range(block_id)) and seq.pending_loads == 0
