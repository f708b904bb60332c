"""kv_aware's credits pinned (router/decision/policies/kv_aware.py): device blocks at device_credit,
pending blocks against indexed ones, what /router/explain shows per candidate, and the settings
it refuses."""

import random

import pytest

from kvroute.router.contract.tier_costs import Link, TierCosts
from kvroute.router.decision.policies import InstanceState, make_policy
from kvroute.router.decision.policies.kv_aware import KvAwareConfig
from kvroute.router.index.base import PrefixMatch
from tests.support.clock import FakeClock
from tests.support.route_requests import BS, chain, req

BLOCKS = chain(9, 20)


def policy(**params):
    return make_policy("kv_aware", prefill_rate=10_000.0, rng=random.Random(0), clock=FakeClock(), **params)


def credits(p, candidates, matches, blocks=BLOCKS):
    return p.credits(req(blocks, len(blocks) * BS + 3), candidates, matches)


def test_device_blocks_count_device_credit_each():
    p = policy(device_credit=0.5)
    assert credits(p, [InstanceState("a")], {"a": PrefixMatch({"device": 10})}) == {"a": 5.0}


def test_no_credit_for_an_incompatible_cache_or_nothing_cached():
    p = policy()
    matches = {"a": PrefixMatch({"device": 10}), "b": PrefixMatch({"device": 10})}
    assert credits(p, [InstanceState("a", cache_ok=False), InstanceState("b"), InstanceState("c")], matches) == {
        "b": 10.0}


def test_pending_blocks_count_as_device_blocks_and_the_larger_credit_wins():
    p = policy(device_credit=0.5)
    r = req(BLOCKS, len(BLOCKS) * BS + 3, "r1")
    p.on_routed(r, "a")  # 20 blocks pending on a
    got = credits(p, [InstanceState("a"), InstanceState("b")], {"a": PrefixMatch({"device": 4}),
                                                                 "b": PrefixMatch({"device": 4})})
    assert got == {"a": 10.0, "b": 2.0}
    assert credits(p, [InstanceState("a")], {"a": PrefixMatch({"device": 4})}, blocks=chain(9, 4))["a"] == 2.0


def test_the_explained_credit_gives_each_tiers_time_saved():
    p = policy()
    cands = [InstanceState("a"), InstanceState("b")]
    credits(p, cands, {"a": PrefixMatch({"device": 10, "host": 5})})
    detail = p.credit_detail("a")
    assert detail["credited_blocks"] == pytest.approx(10 + 5 * 0.8)
    assert detail["time_saved_s_by_tier"]["device"] == pytest.approx(10 * BS / 10_000.0)
    assert p.credit_detail("b") == {} and p.credit_detail("nobody") == {}


def test_fixed_tier_credit_uses_the_configured_fractions():
    p = policy(tier_credit="fixed", host_credit=0.25, remote_credit=0.1)
    got = credits(p, [InstanceState("a")], {"a": PrefixMatch({"device": 2, "host": 4, "remote": 10})})
    assert got["a"] == pytest.approx(2 + 4 * 0.25 + 10 * 0.1)
    assert p.credit_detail("a")["credited_blocks"] == pytest.approx(2 + 4 * 0.25 + 10 * 0.1)


@pytest.mark.parametrize("bad, words", [
    ({"tier_credit": "guessed"}, "tier_credit must be one of measured, fixed, got 'guessed'"),
    ({"pending_ttl_s": 0}, "pending_ttl_s must be positive and pending_capacity at least 1, got 0 and 200000"),
    ({"pending_capacity": 0}, "pending_ttl_s must be positive and pending_capacity at least 1, got 2.0 and 0"),
    ({"tie_tolerance": 1.5}, "tie_tolerance must be in [0, 1)"),
])
def test_bad_kv_aware_settings_are_refused_by_name(bad, words):
    with pytest.raises(ValueError) as e:
        KvAwareConfig(**bad)
    assert words in str(e.value)


def test_the_smallest_pending_settings_are_accepted():
    config = KvAwareConfig(pending_ttl_s=0.001, pending_capacity=1, tier_credit="fixed")
    assert (config.pending_capacity, config.tier_credit) == (1, "fixed")
    p = make_policy("kv_aware", pending_ttl_s=3.5, pending_capacity=7)
    assert (p.config.pending_ttl_s, p.config.pending_capacity) == (3.5, 7) and p.uses_index


def test_a_fresh_policy_explains_no_credit_and_keeps_its_rng():
    rng = random.Random(3)
    p = make_policy("kv_aware", rng=rng)
    assert p.credit_detail("a") == {} and p.rng is rng


def test_fixed_tier_credit_is_explained_as_fixed_even_for_an_instance_that_advertises_links():
    p = policy(tier_credit="fixed", host_credit=0.25)
    fast = TierCosts(1_000_000, {"h2d": Link(1e12, 0.0)}, True, "")  # measured: a host block is worth ~1
    got = credits(p, [InstanceState("a", tier_costs=fast)], {"a": PrefixMatch({"device": 2, "host": 4})})
    assert got["a"] == pytest.approx(2 + 4 * 0.25)
    assert p.credit_detail("a")["credited_blocks"] == pytest.approx(2 + 4 * 0.25)


def test_per_instance_rates_price_a_host_block_at_that_instances_compute():
    p = policy(per_instance_rate=True, rate_alpha=1.0, min_rate_sample_tokens=64, min_prefill_rate=50)
    p.on_first_token(req((), 0), "slow", ttft_s=1.0, uncached_tokens=1600)  # 10 ms a block
    p.on_first_token(req((), 0), "fast", ttft_s=0.1, uncached_tokens=16000)  # 0.1 ms a block
    link = TierCosts(5_000_000, {"h2d": Link(1e9, 0.0)}, True, "")  # 5 ms to load a block
    got = credits(p, [InstanceState("slow", tier_costs=link), InstanceState("fast", tier_costs=link)],
                  {"slow": PrefixMatch({"host": 4}), "fast": PrefixMatch({"host": 4})})
    assert got["slow"] == pytest.approx(4 * (10 - 5) / 10)  # loading saves half of each block's compute
    assert "fast" not in got  # loading costs more than computing there
