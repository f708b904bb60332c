"""kv_aware's cost under KV pressure: the eviction term, the reuse history, deliberate replication."""

import random

import pytest

from kvroute.router.decision.base import COST_TERMS
from kvroute.router.decision.policies import InstanceState, make_policy
from kvroute.router.decision.scoring.eviction import expected_loss
from kvroute.router.decision.scoring.replication import PrefixDemand
from kvroute.router.decision.scoring.reuse import ReuseHistory
from kvroute.router.index.base import PrefixMatch
from tests.support.clock import FakeClock
from tests.support.route_requests import BS, chain, req


def trained(**params):
    """kv_aware whose reuse history has seen a prefix asked for every second, and one-off blocks."""
    clock = FakeClock()
    p = make_policy("kv_aware", rng=random.Random(0), clock=clock, reuse_sample=1, **params)
    hot = chain(50, 64)
    for k in range(30):
        p.on_routed(req(hot), "x")
        for j in range(3):
            p.on_routed(req(chain(1000 + 3 * k + j, 4)), "x")
        clock.now += 1.0
    return p, clock


def pool(id, free, idle_s, clock, evictable=300):
    return InstanceState(id, kv_free_blocks=free, kv_evictable=((evictable, idle_s),), kv_measured_at=clock.now)


def test_reuse_history_tells_hot_blocks_from_blocks_used_once():
    p, clock = trained()
    assert p.reuse.reuse(0.5, clock.now) > 0.7  # idle for less than the hot prefix's 1 s gap
    assert p.reuse.reuse(5.0, clock.now) == 0.0  # nothing idle that long was ever asked for again
    assert ReuseHistory().reuse(1.0, 0.0) == 0.0  # no history, no known value


def test_a_pool_full_of_hot_blocks_loses_to_cold_blocks_at_equal_overlap():
    p, clock = trained()
    request = req(chain(7, 40))
    overlap = {"hot": PrefixMatch({"device": 8}), "cold": PrefixMatch({"device": 8})}
    d = p.select(request, [pool("hot", 0, 0.5, clock), pool("cold", 0, 5000.0, clock)], overlap)
    assert d.instance == "cold"
    evict = COST_TERMS.index("evict_s")
    # 32 uncached blocks evict 32 hot ones (reuse ~0.8 each, recomputed later) or 32 dead ones
    assert d.terms["hot"][evict] == pytest.approx(32 * 0.8 * BS / 10_000, rel=0.1)
    assert d.terms["cold"][evict] == 0.0
    assert d.costs["hot"] > d.costs["cold"] * 1.1  # beyond the near-tie tolerance
    assert all(sum(d.terms[i]) == pytest.approx(d.costs[i]) for i in d.costs)
    # free blocks evict nothing, whatever the LRU list holds
    d = p.select(request, [pool("hot", 0, 0.5, clock), pool("free", 100, 0.5, clock)], {})
    assert d.instance == "free" and d.terms["free"][evict] == 0.0
    # without the term (or without a reported profile) the two look alike
    p0, clock0 = trained(evict_weight=0)
    d = p0.select(request, [pool("hot", 0, 0.5, clock0), pool("cold", 0, 5000.0, clock0)], overlap)
    assert d.costs["hot"] == d.costs["cold"]
    d = p.select(request, [InstanceState("a"), InstanceState("b")], {})
    assert d.costs["a"] == d.costs["b"]


def test_expected_loss_counts_the_victims_after_the_blocks_ahead():
    reuse = {10.0: 1.0, 100.0: 0.5, 1000.0: 0.0}.__getitem__
    s = InstanceState("a", kv_free_blocks=4, kv_evictable=((10, 1000.0), (10, 100.0), (10, 10.0)), kv_measured_at=0.0)
    assert expected_loss(s, need=4, ahead=0, now=0.0, reuse=reuse) == 0.0  # fits in the free blocks
    assert expected_loss(s, need=14, ahead=0, now=0.0, reuse=reuse) == 0.0  # then the 10 dead ones
    assert expected_loss(s, need=10, ahead=10, now=0.0, reuse=reuse) == pytest.approx(4 * 0.0 + 6 * 0.5)
    assert expected_loss(s, need=10, ahead=24, now=0.0, reuse=reuse) == pytest.approx(10 * 1.0)
    # past the evictable blocks: blocks in use, each counted lost
    assert expected_loss(s, need=10, ahead=30, now=0.0, reuse=reuse) == pytest.approx(4 * 1.0 + 6)
    aged = InstanceState("a", kv_free_blocks=0, kv_evictable=((10, 90.0),), kv_measured_at=0.0)
    assert expected_loss(aged, 5, 0, now=10.0, reuse=reuse) == pytest.approx(5 * 0.5)  # 90 s + 10 s since measured
    assert expected_loss(InstanceState("a"), 50, 0, 0.0, reuse) == 0.0  # no profile reported


def test_prefix_demand_averages_over_time_not_over_requests():
    burst = PrefixDemand(halflife_s=10.0)
    burst.record(1, 0.0, 0.0)  # one request on an idle holder ...
    for j in range(20):  # ... then twenty at once 5 s later, each seeing the queue the ones before made
        burst.record(1, 5.0, 0.015 * j)
    count, wait = burst.peek(1, 5.0, 0.3)
    assert count == pytest.approx(1 * 0.5 ** 0.5 + 20) and wait == 0.0  # the burst added no time
    steady = PrefixDemand(halflife_s=10.0)
    for k in range(200):  # a request every 50 ms, each seeing a 40 ms longer wait
        steady.record(1, k * 0.05, 0.04)
    count, wait = steady.peek(1, 10.0, 0.04)
    assert wait == pytest.approx(0.04) and count > 100
    assert PrefixDemand(10.0).peek(2, 0.0, 0.5) == (0.0, 0.0)  # a prefix never seen: no evidence yet


def stream(p, clock, holder_running, others_running, seconds, rate=20.0):
    """Requests for one prefix held by `a`, at `rate`; the fleet's load stays as given."""
    prefix = chain(9, 64)
    cands = [InstanceState("a", inflight=holder_running, running=holder_running)]
    cands += [InstanceState(i, inflight=others_running, running=others_running) for i in "bcd"]
    decisions = []
    for k in range(int(seconds * rate)):
        r = req(prefix + chain(0, 0, k, 1), request_id=f"s{k}")
        d = p.select(r, cands, {"a": PrefixMatch({"device": 64})})
        p.on_routed(r, d.instance)
        decisions.append(d)
        clock.now += 1.0 / rate
    return decisions


def test_a_prefix_whose_holder_stays_loaded_is_copied_on_purpose():
    clock = FakeClock()
    p = make_policy("kv_aware", rng=random.Random(0), clock=clock)
    decisions = stream(p, clock, holder_running=10, others_running=5, seconds=10)
    copies = [k for k, d in enumerate(decisions) if "replicated a hot prefix" in d.explained()]
    assert copies and copies[0] > 20  # not at once: the wait must last, then it repays the copy
    assert all("guard" not in d.explained() for d in decisions)  # 10 inflight is not 2x the others' 5
    first = decisions[copies[0]]
    assert first.instance != "a" and min(first.costs, key=first.costs.get) == "a"  # cost alone would stay
    assert decisions[copies[0] + 1].instance == first.instance  # the copy is credited at once (pending blocks)


def test_no_copy_without_load_or_for_a_burst():
    clock = FakeClock()
    p = make_policy("kv_aware", rng=random.Random(0), clock=clock)
    assert all(d.instance == "a" for d in stream(p, clock, holder_running=5, others_running=5, seconds=10))
    clock = FakeClock()
    p = make_policy("kv_aware", rng=random.Random(0), clock=clock)
    cands = [InstanceState("a", queued_prefill_tokens=3000, inflight=3), *(InstanceState(i) for i in "bcd")]
    prefix = chain(9, 64)
    for k in range(30):  # thirty siblings at one instant behind a long queue
        r = req(prefix + chain(0, 0, k, 1), request_id=f"b{k}")
        d = p.select(r, cands, {"a": PrefixMatch({"device": 64})})
        p.on_routed(r, d.instance)
        assert "replicated" not in d.explained()
    off = make_policy("kv_aware", rng=random.Random(0), clock=FakeClock(), replicate_weight=0)
    assert all("replicated" not in d.explained() for d in stream(off, off.clock, 10, 5, seconds=10))


def test_a_near_tie_never_turns_a_hit_into_a_copy():
    p = make_policy("kv_aware", rng=random.Random(0), clock=FakeClock())
    for _ in range(5):
        p.on_routed(req(chain(3, 8)), "a")  # a was sent more lately: it would lose a tie
    request = req(chain(1, 65), num_tokens=65 * BS + 5)
    cands = [InstanceState("a", queued_prefill_tokens=2000, inflight=1), InstanceState("b")]
    d = p.select(request, cands, {"a": PrefixMatch({"device": 64})})
    assert d.costs["b"] < d.costs["a"] * 1.05  # within the tie tolerance ...
    assert d.instance == "a"  # ... but only candidates crediting the same blocks tie


def test_router_and_simulator_map_the_load_record_alike():
    import time

    from kvroute.loadgen.sim.load_view import LoadView
    from kvroute.router.contract.protocol import LoadRecord
    from kvroute.router.fleet.instance import Instance

    record = LoadRecord(instance="e0", running=1, waiting=2, kv_used_blocks=90, kv_total_blocks=100,
                        queued_prefill_tokens=0, ts=50.0, kv_free_blocks=10, kv_evictable=((60, 3.0), (20, 1.0)))
    view = LoadView(["e0"])
    view.polled(0, record)
    state = view.all().states([0])[0]  # the simulator: ts is on the virtual clock, the policy's clock
    assert (state.kv_free_blocks, state.kv_evictable, state.kv_measured_at) == (10, record.kv_evictable, 50.0)
    inst = Instance("http://127.0.0.1:1")
    inst.load = LoadRecord(instance="e0", running=1, waiting=2, kv_used_blocks=90, kv_total_blocks=100,
                           queued_prefill_tokens=0, ts=time.time() - 1.0, kv_free_blocks=10,
                           kv_evictable=record.kv_evictable)
    state = inst.state()  # the router: the record's age comes off the policy's monotonic clock
    assert (state.running, state.waiting, state.kv_free_blocks) == (1, 2, 10)
    assert state.kv_measured_at == pytest.approx(time.monotonic() - 1.0, abs=0.2)
    assert Instance("http://127.0.0.1:1").state().kv_free_blocks == -1  # no record yet: nothing known
