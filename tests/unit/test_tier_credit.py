"""The router's credit by tier: time saved from advertised links, the fixed-weight fallback, shared stores."""

import random

import pytest

from kvroute.router.contract.tier_costs import Link, TierCosts, store_owner
from kvroute.router.decision.policies import InstanceState, make_policy
from kvroute.router.index.base import PrefixMatch
from tests.support.route_requests import BS, req

RATE = 10_000.0  # tokens/s: 1.6 ms of compute per block
STORE = "redis://10.0.0.5:6379/0#ns"
BLOCKS = tuple(range(1, 101))


def costs(h2d_bps=1e9, store_bps=None, has_host=True, store="", bytes_per_block=1_000_000):
    links = {"h2d": Link(h2d_bps, 0.0)}
    if store_bps:
        links["store_read"] = Link(store_bps, 0.0)
    return TierCosts(bytes_per_block, links, has_host, store)


def policy(**params):
    return make_policy("kv_aware", prefill_rate=RATE, rng=random.Random(0), **params)


def credits(p, candidates, matches):
    return p.credits(req(BLOCKS, len(BLOCKS) * BS + 3), candidates, matches)


def test_a_host_block_is_credited_by_compute_minus_load_time():
    p = policy()
    match = {"a": PrefixMatch({"device": 20, "host": 50})}
    fast = credits(p, [InstanceState("a", tier_costs=costs(h2d_bps=2.5e9))], match)["a"]  # 0.4 ms / block
    assert fast == pytest.approx(20 + 50 * (1.6 - 0.4) / 1.6)
    slow = credits(p, [InstanceState("a", tier_costs=costs(h2d_bps=1e8))], match)["a"]  # 10 ms / block: recompute
    assert slow == pytest.approx(20)
    fallback = credits(p, [InstanceState("a")], match)["a"]  # advertises nothing: host_credit 0.8
    assert fallback == pytest.approx(20 + 50 * 0.8)
    fixed = credits(policy(tier_credit="fixed", host_credit=0.75), [InstanceState("a", tier_costs=costs())], match)
    assert fixed["a"] == pytest.approx(20 + 50 * 0.75)


def test_a_shared_store_counts_for_every_instance_with_its_key():
    p = policy()
    matches = {"a": PrefixMatch({"device": 30}), store_owner(STORE): PrefixMatch({"remote": 80})}
    shared = costs(h2d_bps=1e10, store_bps=1e10, store=STORE)  # 0.2 ms per block to load
    other = costs(h2d_bps=1e10, store_bps=1e10, store="file:///mnt/kv#ns")
    got = credits(p, [InstanceState("a", tier_costs=shared), InstanceState("b", tier_costs=shared),
                      InstanceState("c", tier_costs=other), InstanceState("d")], matches)
    per_block = (1.6 - 0.2) / 1.6
    assert got["a"] == pytest.approx(30 + 50 * per_block)  # its own 30, then the store's next 50
    assert got["b"] == pytest.approx(80 * per_block)  # the store's whole prefix
    assert "c" not in got and "d" not in got  # another store, or none


def test_tier_aware_routing_sends_a_returning_session_to_the_idle_instance_with_the_store():
    matches = {"busy": PrefixMatch({"host": 100}), store_owner(STORE): PrefixMatch({"remote": 100})}
    fast_store = costs(h2d_bps=2.5e10, store_bps=2.5e10, store=STORE)  # loads almost free
    cands = [InstanceState("busy", queued_prefill_tokens=1200, tier_costs=fast_store),
             InstanceState("idle", tier_costs=fast_store)]
    request = req(BLOCKS, len(BLOCKS) * BS + 3)
    assert policy().select(request, cands, matches).instance == "idle"
    fixed = policy(tier_credit="fixed", host_credit=0.75, remote_credit=0.25)
    assert fixed.select(request, cands, matches).instance == "busy"  # 0.25 x the store's blocks looks poor


def test_credit_detail_explains_the_last_choice():
    p = policy()
    match = {"a": PrefixMatch({"device": 10, "host": 10})}
    credits(p, [InstanceState("a", tier_costs=costs(h2d_bps=2.5e9))], match)
    detail = p.credit_detail("a")
    assert detail["time_saved_s_by_tier"]["device"] == pytest.approx(10 * 0.0016)
    assert detail["time_saved_s_by_tier"]["host"] == pytest.approx(10 * 0.0012)
    assert p.credit_detail("nobody") == {}
    assert make_policy("round_robin").credit_detail("a") == {}


def test_advertised_tiers_parse_and_malformed_ones_fall_back():
    wire = {"bytes_per_block": 32768, "links": {"h2d": {"bandwidth_bps": 5e9, "latency_s": 1e-5},
                                                "store_read": {"bandwidth_bps": 1e9, "latency_s": 3e-4}},
            "host": {"blocks": 10, "used": 1}, "remote": {"store": STORE}}
    parsed = TierCosts.from_wire(wire)
    assert parsed.has_host and parsed.store == STORE
    assert parsed.load_time("host", 10) == pytest.approx(1e-5 + 327680 / 5e9)
    assert parsed.load_time("remote", 1) == pytest.approx(3e-4 + 32768 / 1e9 + 1e-5 + 32768 / 5e9)
    assert TierCosts.from_wire({"links": {"h2d": "fast"}}) is None and TierCosts.from_wire({}) is None
    assert TierCosts.from_wire({**wire, "host": None}).load_time("host", 1) is None
    with pytest.raises(ValueError, match="tier_credit"):
        policy(tier_credit="guess")
