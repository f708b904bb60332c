"""The cost model's terms and bookkeeping pinned (router/decision/scoring/kv_cost.py): each term of
`score` on hand-made candidates, the near-tie rule, the decaying share, the queue remembered
from dispatch to first token, and the config it refuses."""

import random

import pytest

from kvroute.router.decision.base import InstanceState
from kvroute.router.decision.policies import make_policy
from kvroute.router.decision.scoring import kv_cost
from kvroute.router.decision.scoring.kv_cost import KvCostConfig
from kvroute.router.decision.scoring.rate import PrefillRate, RateConfig
from kvroute.router.index.base import PrefixMatch
from tests.support.clock import FakeClock
from tests.support.route_requests import BS, chain, req


def kv(**params):
    clock = FakeClock()
    return make_policy("kv_aware", rng=random.Random(0), clock=clock, **params), clock


def request(num_tokens=160, n_blocks=10, request_id=""):
    return req(chain(3, n_blocks), num_tokens, request_id)


def test_wait_is_the_queue_over_the_rate_plus_the_larger_of_engine_load_and_inflight():
    p, clock = kv(prefill_rate=1000, decode_weight_s=0.01, evict_weight=0)
    cands = [InstanceState("load", inflight=2, queued_prefill_tokens=500, running=3, waiting=2),
             InstanceState("inflight", inflight=7, running=3, waiting=2)]
    _, terms = p.score(request(), cands, {}, clock.now)
    assert terms["load"][0] == pytest.approx(0.5 + 0.05)
    assert terms["inflight"][0] == pytest.approx(0.07)


def test_own_prefill_and_compute_are_the_uncached_tokens_over_the_rate():
    p, clock = kv(prefill_rate=1000, compute_weight=0.5, evict_weight=0)
    costs, terms = p.score(request(), [InstanceState("a"), InstanceState("b")], {"a": 2.5}, clock.now)
    assert terms["a"][1:3] == pytest.approx((0.12, 0.06))  # 160 - 2.5 x 16 = 120 uncached
    assert terms["b"][1:3] == pytest.approx((0.16, 0.08))
    assert costs["a"] == pytest.approx(sum(terms["a"]))


def test_uncached_tokens_are_never_negative_nor_rounded_away():
    p, clock = kv(prefill_rate=1000, evict_weight=0)
    _, terms = p.score(request(), [InstanceState("over"), InstanceState("almost")],
                       {"over": 12.0, "almost": 9.99}, clock.now)
    assert terms["over"][1] == 0.0
    assert terms["almost"][1] == pytest.approx(0.16 / 1000)  # 0.16 of a token


def test_evictions_count_the_blocks_queued_ahead_and_a_partial_last_block():
    p, clock = kv(prefill_rate=1000, reuse_sample=1)
    p.reuse.curve = lambda now: (lambda idle: 0.5)  # every victim: even odds of being asked again
    full = dict(kv_free_blocks=1, kv_evictable=((100, 1.0),), kv_measured_at=clock.now)
    cands = [InstanceState("ahead", queued_prefill_tokens=17, **full), InstanceState("one", **full),
             InstanceState("fits", kv_free_blocks=50)]
    # 20 uncached tokens: 2 fresh blocks; 17 queued tokens: 2 blocks ahead; 1 free
    _, terms = p.score(req((), 20), cands, {}, clock.now)
    assert terms["ahead"][3] == pytest.approx(2 * 0.5 * BS / 1000)  # depths [1, 3)
    assert terms["one"][3] == pytest.approx(1 * 0.5 * BS / 1000)  # depths [0, 1)
    assert terms["fits"][3] == 0.0
    _, terms = p.score(req((), 5), cands[1:2], {}, clock.now)  # 1 fresh block, 1 free
    assert terms["one"][3] == 0.0
    _, terms = p.score(req((), 5), [InstanceState("o", **{**full, "kv_free_blocks": 0})], {}, clock.now)
    assert terms["o"][3] == pytest.approx(0.5 * BS / 1000)


def test_per_instance_rates_price_each_candidate_at_its_own_rate():
    p, clock = kv(prefill_rate=1000, per_instance_rate=True, min_rate_sample_tokens=64, rate_alpha=1.0,
                  evict_weight=0, compute_weight=0)
    p.on_first_token(request(), "fast", ttft_s=0.1, uncached_tokens=400)  # 4000 tokens/s
    p.on_first_token(request(), "slow", ttft_s=1.0, uncached_tokens=500)  # 500 tokens/s
    _, terms = p.score(request(), [InstanceState("fast"), InstanceState("slow")], {}, clock.now)
    assert terms["fast"][1] == pytest.approx(160 / 4000) and terms["slow"][1] == pytest.approx(160 / 500)


def test_a_cheaper_candidate_beyond_the_tolerance_is_no_tie():
    p, clock = kv(prefill_rate=1000, evict_weight=0, replicate_weight=0)
    cheap, dear = InstanceState("cheap"), InstanceState("dear", queued_prefill_tokens=100)  # +0.1 s of 0.32
    for _ in range(3):
        p.on_routed(req((), 160, "x"), "cheap")
    assert p.select(request(), [cheap, dear], {}).instance == "cheap"


def test_one_more_credited_block_is_no_tie():
    p, clock = kv(prefill_rate=1000, evict_weight=0, replicate_weight=0, tie_tolerance=0.2)
    for _ in range(3):
        p.on_routed(req((), 160, "x"), "hit")
    cands = [InstanceState("hit"), InstanceState("miss")]
    r = request(num_tokens=800, n_blocks=50)
    assert p.select(r, cands, {"hit": PrefixMatch({"device": 1})}).instance == "hit"


def test_a_tie_of_two_goes_to_the_one_sent_fewer_requests():
    p, clock = kv(evict_weight=0, replicate_weight=0)
    p.on_routed(req((), 160, "x"), "a")  # no blocks: no pending credit, only the share
    assert {p.select(request(), [InstanceState("a"), InstanceState("b")], {}).instance for _ in range(5)} == {"b"}


def test_the_share_decays_with_its_half_life():
    p, clock = kv(share_halflife_s=30.0)
    assert p._share("never", clock.now) == 0.0
    p.on_routed(request(request_id="x"), "a")
    assert p._share("a", clock.now) == 1.0
    assert p._share("a", clock.now + 30) == pytest.approx(0.5)
    assert p._share("a", clock.now + 60) == pytest.approx(0.25)


def _rate_after(tokens, ttft):
    rate = PrefillRate(RateConfig(initial=10_000, min_sample_tokens=64))
    rate.observe("a", tokens, ttft)
    return rate.get("a")


def test_the_queue_at_dispatch_joins_the_first_tokens_rate_sample():
    p, clock = kv(min_rate_sample_tokens=64)
    r = request(request_id="r1")
    p.select(r, [InstanceState("a", queued_prefill_tokens=1000), InstanceState("b", queued_prefill_tokens=5000)],
             {})
    p.on_routed(r, "a")
    assert p._dispatched["r1"] == 1000
    p.on_first_token(r, "a", ttft_s=0.5, uncached_tokens=100)
    assert p.rates.get("a") == pytest.approx(_rate_after(1100, 0.5)) and "r1" not in p._dispatched


def test_no_queue_is_known_for_a_request_never_routed_or_without_an_id():
    for r in (request(request_id="unseen"), request()):
        p, clock = kv(min_rate_sample_tokens=64)
        p.on_first_token(r, "a", ttft_s=0.5, uncached_tokens=100)
        assert p.rates.get("a") == pytest.approx(_rate_after(100, 0.5))


def test_the_queue_is_read_from_this_requests_own_decision():
    p, clock = kv()
    cands = [InstanceState("a", queued_prefill_tokens=700)]
    mine = request(request_id="r1")
    p.select(mine, cands, {})
    p.on_routed(request(request_id="r1"), "a")  # another object, the same request id
    assert p._dispatched["r1"] == 700
    p.select(request(request_id="r2"), cands, {})
    p.on_routed(request(request_id="r3"), "a")  # routed without its own select
    assert p._dispatched["r3"] == 0
    p.on_routed(request(request_id="r4"), "a")  # no select at all
    assert p._dispatched["r4"] == 0
    p.select(request(request_id="r5"), cands, {})
    p.on_routed(request(request_id="r5"), "elsewhere")  # not among the candidates
    assert p._dispatched["r5"] == 0


def test_finished_requests_forget_their_queue(monkeypatch):
    p, clock = kv()
    p.on_routed(request(request_id="r1"), "a")
    p.on_finished(request(request_id="r1"), "a")
    p.on_finished(request(request_id="never"), "a")
    assert "r1" not in p._dispatched


def test_the_dispatch_memory_keeps_the_newest(monkeypatch):
    monkeypatch.setattr(kv_cost, "_MAX_DISPATCHED", 2)
    p, clock = kv()
    for rid in ("r1", "r2", "r3"):
        p.on_routed(request(request_id=rid), "a")
    assert list(p._dispatched) == ["r2", "r3"]


def test_the_reason_names_the_cost_and_the_credit():
    p, clock = kv(prefill_rate=1000, evict_weight=0, replicate_weight=0)
    d = p.select(request(), [InstanceState("a")], {})
    assert d.explained() == "lowest cost 0.3200 s (0 cached blocks credited)"
    d = p.select(request(), [InstanceState("a")], {"a": PrefixMatch({"device": 10})})
    assert d.explained() == "lowest cost 0.0000 s (10 cached blocks credited)" and d.uncached_tokens == 0


def test_the_hot_spot_reason_gives_the_spills_extra_cost():
    p, clock = kv(prefill_rate=1000, evict_weight=0, replicate_weight=0, decode_weight_s=0.0,
                  hot_min_inflight=4, hot_factor=2.0, hot_tolerance_s=1.0)
    cands = [InstanceState("hot", inflight=8), InstanceState("cool", inflight=1)]
    d = p.select(request(), cands, {"hot": PrefixMatch({"device": 5})})  # 0.16 s vs 0.32 s
    assert d.instance == "cool"
    assert d.explained().endswith("spilled to cool (cost +0.1600 s)")


def test_the_policy_uses_the_rng_it_is_given():
    rng = random.Random(5)
    assert make_policy("kv_aware", rng=rng).rng is rng


def test_rate_and_reuse_settings_reach_their_parts():
    config = KvCostConfig(prefill_rate=1234, rate_alpha=0.3, min_prefill_rate=60, max_prefill_rate=1e6,
                          min_rate_sample_tokens=100, per_instance_rate=True, reuse_sample=3, reuse_window_s=50,
                          reuse_halflife_s=20)
    assert config.rate_config() == RateConfig(initial=1234, alpha=0.3, min_rate=60, max_rate=1e6,
                                              min_sample_tokens=100, per_instance=True)
    history = config.reuse_history()
    assert (history.sample, history.window_s, history.halflife_s) == (3, 50, 20)


@pytest.mark.parametrize("bad, words", [
    ({"tie_tolerance": 1.0}, "tie_tolerance must be in [0, 1) and share_halflife_s positive"),
    ({"share_halflife_s": 0}, "tie_tolerance must be in [0, 1) and share_halflife_s positive"),
    ({"evict_weight": -1}, "decode_weight_s, compute_weight, hot_tolerance_s, evict_weight, replicate_weight "
                           "cannot be negative"),
    ({"hot_factor": 0.99}, "hot_factor must be >= 1 and hot_min_inflight >= 1"),
    ({"hot_min_inflight": 0}, "hot_factor must be >= 1 and hot_min_inflight >= 1"),
    ({"replicate_halflife_s": 0}, "replicate_halflife_s must be positive"),
])
def test_bad_cost_settings_are_refused_by_name(bad, words):
    with pytest.raises(ValueError) as e:
        KvCostConfig(**bad)
    assert words in str(e.value)


def test_the_edges_of_the_cost_settings_are_accepted():
    config = KvCostConfig(tie_tolerance=0.99, share_halflife_s=0.5, device_credit=0.0, host_credit=0.0,
                          remote_credit=0.0, hot_factor=1.0, hot_min_inflight=1, replicate_halflife_s=0.5)
    assert (config.hot_factor, config.hot_min_inflight, config.device_credit) == (1.0, 1, 0.0)


def test_blocks_queued_ahead_are_whole_blocks_when_the_victims_span_entries():
    p, clock = kv(prefill_rate=1000, reuse_sample=1)
    p.reuse.curve = lambda now: (lambda idle: 1.0 / (1.0 + idle))
    full = InstanceState("a", queued_prefill_tokens=17, kv_free_blocks=1, kv_evictable=((2, 1.0), (100, 5.0)),
                         kv_measured_at=clock.now)
    _, terms = p.score(req((), 20), [full], {}, clock.now)
    # 2 blocks ahead, 1 free: depths [1, 3), one block idle 1 s and one idle 5 s
    assert terms["a"][3] == pytest.approx((1 / 2 + 1 / 6) * BS / 1000)
