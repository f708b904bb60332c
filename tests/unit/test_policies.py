import math
import random
from collections import Counter

import pytest

from kvroute.router.decision.policies import POLICIES, InstanceState, make_policy, policy_params
from kvroute.router.decision.scoring.recent import RecentBlocks
from kvroute.router.index.base import PrefixMatch
from tests.support.clock import FakeClock
from tests.support.route_requests import BS, chain, req


def insts(*ids, **fields):
    return [InstanceState(i, **fields) for i in ids]


def bump(cands, decision):
    """The router's bookkeeping after a dispatch: one more inflight, its uncached tokens queued."""
    return [
        InstanceState(
            c.id,
            inflight=c.inflight + 1,
            queued_prefill_tokens=c.queued_prefill_tokens + (decision.uncached_tokens or 0),
            running=c.running,
            waiting=c.waiting,
            cache_ok=c.cache_ok,
        )
        if c.id == decision.instance
        else c
        for c in cands
    ]


def route(policy, request, cands, matches=None):
    d = policy.select(request, cands, matches or {})
    policy.on_routed(request, d.instance)
    return d


# registry


def test_registry_lists_all_seven():
    assert set(POLICIES) == {
        "round_robin", "random", "least_load", "power_of_two", "prefix_hash", "kv_aware", "approx_kv"
    }
    for name in POLICIES:
        policy = make_policy(name, rng=random.Random(0))
        assert policy.select(req(chain(1, 2)), insts("a"), {}).instance == "a"


def test_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        make_policy("fastest")
    for name in POLICIES:
        assert name in str(e.value)


def test_bad_parameters_are_value_errors():
    with pytest.raises(ValueError, match="hot_factr"):
        make_policy("kv_aware", hot_factr=3)
    with pytest.raises(ValueError, match="load_factor"):
        make_policy("prefix_hash", load_factor=0.5)
    with pytest.raises(ValueError, match="host_credit"):
        make_policy("kv_aware", host_credit=1.5)
    assert "learned_ttl_s" in policy_params("approx_kv")
    assert make_policy("kv_aware", pending_ttl_s=5).config.pending_ttl_s == 5


# load-only policies


def test_round_robin_exact_rotation_and_skips_unhealthy():
    p = make_policy("round_robin")
    order = [route(p, req(()), insts("c", "a", "b")).instance for _ in range(6)]
    assert order == ["a", "b", "c", "a", "b", "c"]
    assert [route(p, req(()), insts("a", "c")).instance for _ in range(3)] == ["a", "c", "a"]
    assert [route(p, req(()), insts("b", "c", "a")).instance for _ in range(3)] == ["b", "c", "a"]


def test_round_robin_select_alone_does_not_advance():
    p = make_policy("round_robin")
    assert [p.select(req(()), insts("a", "b"), {}).instance for _ in range(3)] == ["a", "a", "a"]


def test_random_covers_all_and_is_reproducible():
    cands = insts("a", "b", "c", "d")
    p1, p2 = make_policy("random", rng=random.Random(7)), make_policy("random", rng=random.Random(7))
    seq1 = [p1.select(req(()), cands, {}).instance for _ in range(200)]
    seq2 = [p2.select(req(()), cands, {}).instance for _ in range(200)]
    assert seq1 == seq2
    assert set(seq1) == {"a", "b", "c", "d"}
    assert min(Counter(seq1).values()) > 25


def test_least_load_picks_min_with_engine_queue_as_tiebreak():
    p = make_policy("least_load", rng=random.Random(0))
    cands = [InstanceState("a", inflight=3), InstanceState("b", inflight=1, running=5), InstanceState("c", inflight=1)]
    for _ in range(20):
        d = p.select(req(()), cands, {})
        assert d.instance == "c"
    assert d.costs == {"a": 3.0, "b": 1.0, "c": 1.0}


def test_power_of_two_never_picks_the_more_loaded():
    p = make_policy("power_of_two", rng=random.Random(3))
    cands = [InstanceState(f"i{k}", inflight=k) for k in range(5)]
    picks = Counter(p.select(req(()), cands, {}).instance for _ in range(500))
    assert "i4" not in picks
    assert {"i0", "i1", "i2", "i3"} <= set(picks)
    pair = [InstanceState("x", inflight=2), InstanceState("y", inflight=9)]
    assert all(p.select(req(()), pair, {}).instance == "x" for _ in range(50))


# prefix_hash


def test_prefix_hash_same_prefix_same_instance_and_replicas_agree():
    cands = insts(*[f"e{k}" for k in range(8)])
    p1, p2 = make_policy("prefix_hash"), make_policy("prefix_hash")
    first = p1.select(req(chain(5, 4, 1, 3)), cands, {}).instance
    for tail in range(2, 20):
        assert p1.select(req(chain(5, 4, tail, 3)), cands, {}).instance == first
        assert p2.select(req(chain(5, 4, tail, 3)), list(reversed(cands)), {}).instance == first


def test_prefix_hash_spreads_different_prefixes_and_moves_only_ejected_keys():
    ids = [f"e{k}" for k in range(8)]
    p = make_policy("prefix_hash")
    owners = {k: p.select(req(chain(k, 4)), insts(*ids), {}).instance for k in range(400)}
    counts = Counter(owners.values())
    assert set(counts) == set(ids) and min(counts.values()) >= 20
    after = {k: p.select(req(chain(k, 4)), insts(*[i for i in ids if i != "e3"]), {}).instance for k in range(400)}
    assert all(after[k] == owners[k] for k in owners if owners[k] != "e3")
    assert "e3" not in after.values()


def test_prefix_hash_bounded_load_under_a_flood():
    cands = insts(*[f"e{k}" for k in range(8)])
    p = make_policy("prefix_hash", load_factor=1.25)
    owner = p.select(req(chain(9, 6)), cands, {}).instance
    for n in range(100):
        d = p.select(req(chain(9, 6, n, 1)), cands, {})
        if n == 0:
            assert d.instance == owner and "ring owner of the prefix" in d.explained()
        cands = bump(cands, d)
    loads = {c.id: c.inflight for c in cands}
    assert max(loads.values()) <= math.ceil(1.25 * 100 / 8)
    assert loads[owner] == max(loads.values())
    assert "walked on to" in d.explained()


def test_prefix_hash_without_a_full_block_goes_to_least_load():
    p = make_policy("prefix_hash", rng=random.Random(0))
    cands = [InstanceState("a", inflight=4), InstanceState("b", inflight=0), InstanceState("c", inflight=2)]
    d = p.select(req((), 7), cands, {})
    assert d.instance == "b" and "least load" in d.explained()


# kv_aware


def kv(**params):
    return make_policy("kv_aware", rng=random.Random(0), clock=FakeClock(), **params)


def test_kv_aware_prefers_longest_prefix():
    p = kv()
    m = {"a": PrefixMatch({"device": 2}), "b": PrefixMatch({"device": 6}), "c": PrefixMatch({"device": 4})}
    d = p.select(req(chain(1, 8)), insts("a", "b", "c", "d"), m)
    assert d.instance == "b"
    assert d.costs["b"] < d.costs["c"] < d.costs["a"] < d.costs["d"]
    assert d.uncached_tokens == 8 * BS + 5 - 6 * BS


def test_kv_aware_prefers_less_loaded_when_gain_is_small():
    p = kv()
    cands = [InstanceState("a", queued_prefill_tokens=20_000, inflight=3), InstanceState("b")]
    d = p.select(req(chain(1, 8)), cands, {"a": PrefixMatch({"device": 2})})
    assert d.instance == "b"
    cands = [InstanceState("a", queued_prefill_tokens=200, inflight=1), InstanceState("b")]
    assert p.select(req(chain(1, 8)), cands, {"a": PrefixMatch({"device": 8})}).instance == "a"


def test_kv_aware_tier_credit_ordering():
    p = kv()
    m = {"d": PrefixMatch({"device": 10}), "h": PrefixMatch({"host": 10}), "r": PrefixMatch({"remote": 10})}
    d = p.select(req(chain(1, 12)), insts("d", "h", "r", "none"), m)
    assert d.instance == "d"
    assert d.costs["d"] < d.costs["h"] < d.costs["r"] < d.costs["none"]


def test_kv_aware_cache_not_ok_gets_no_credit():
    p = kv()
    cands = [InstanceState("a", cache_ok=False), InstanceState("b")]
    blocks = chain(1, 8)
    p.on_routed(req(blocks), "a")  # pending on a, too
    d = p.select(req(blocks), cands, {"a": PrefixMatch({"device": 8})})
    assert d.costs["a"] == d.costs["b"]
    assert d.uncached_tokens == 8 * BS + 5


def hot_fleet():
    return [
        InstanceState("a", inflight=8, running=8),
        InstanceState("b", inflight=1, running=1),
        InstanceState("c", inflight=2, running=2),
    ]


def test_kv_aware_hot_spot_guard_spills_and_spill_target_gets_pending_hits():
    p = kv()
    prefix = chain(7, 64)
    m = {"a": PrefixMatch({"device": 64})}
    first = req(prefix + chain(0, 0, 1, 1))
    d = p.select(first, hot_fleet(), m)
    assert min(d.costs, key=d.costs.get) == "a"
    assert d.instance == "b" and "hot-spot guard" in d.explained()
    p.on_routed(first, d.instance)
    sibling = req(prefix + chain(0, 0, 2, 1))
    d2 = p.select(sibling, hot_fleet(), m)
    assert d2.costs["c"] - d2.costs["b"] > 1.5 * 64 * BS / 10_000  # b is credited the 64 pending blocks
    assert d2.uncached_tokens is not None


def test_kv_aware_guard_quiet_when_not_hot_or_spill_too_costly():
    m = {"a": PrefixMatch({"device": 64})}
    cool = [InstanceState("a", inflight=3, running=3), InstanceState("b"), InstanceState("c")]
    d = kv().select(req(chain(7, 64)), cool, m)
    assert d.instance == "a" and "guard" not in d.explained()
    d = kv(hot_tolerance_s=0.05).select(req(chain(7, 64)), hot_fleet(), m)
    assert d.instance == "a" and "guard" not in d.explained()


def test_kv_aware_pending_blocks_keep_a_burst_together():
    prefix = chain(3, 32)
    clock = FakeClock()
    p = make_policy("kv_aware", rng=random.Random(1), clock=clock)
    cands = insts("a", "b", "c", "d")
    chosen = []
    for k in range(4):  # hot_min_inflight: the guard stays quiet up to 4 inflight
        d = route(p, req(prefix + chain(0, 0, k, 2)), cands)
        chosen.append(d.instance)
        cands = bump(cands, d)
    assert len(set(chosen)) == 1
    d = p.select(req(prefix + chain(0, 0, 9, 2)), cands, {})
    assert min(d.costs, key=d.costs.get) == chosen[0]  # still the cheapest, through pending blocks
    assert d.instance != chosen[0] and "hot-spot guard" in d.explained()

    clock.now += 10  # pending expired: nothing ties siblings together any more
    p2 = make_policy("kv_aware", rng=random.Random(1), clock=clock, pending_ttl_s=0.001)
    cands, chosen = insts("a", "b", "c", "d"), []
    for k in range(4):
        d = route(p2, req(prefix + chain(0, 0, k, 2)), cands)
        chosen.append(d.instance)
        clock.now += 1
        cands = bump(cands, d)
    assert len(set(chosen)) == 4


def test_kv_aware_learns_prefill_rate_toward_observed():
    p = kv(prefill_rate=10_000)
    r = req(chain(1, 8), num_tokens=1000, request_id="r1")
    cands = [InstanceState("a", queued_prefill_tokens=1000)]
    before = p.select(r, cands, {}).costs["a"]
    p.on_routed(r, "a")
    p.on_first_token(r, "a", ttft_s=1.0, uncached_tokens=1000)  # (1000 queued + 1000) tokens in 1 s
    assert p.rates.get("a") == pytest.approx(10_000 * (2_000 / 10_000) ** 0.2)  # geometric: log-space EWMA
    for _ in range(60):
        p.on_first_token(req((), request_id=""), "a", ttft_s=0.5, uncached_tokens=1000)
    assert p.rates.get("a") == pytest.approx(2_000, rel=0.01)
    assert p.select(r, cands, {}).costs["a"] > 4 * before
    p.on_first_token(req(()), "a", ttft_s=1.0, uncached_tokens=10)  # too small a sample: ignored
    assert p.rates.get("a") == pytest.approx(2_000, rel=0.01)
    assert p.rates.get("b") == pytest.approx(2_000, rel=0.01)  # unobserved: the fleet's mean, not the prior


def test_kv_aware_select_has_no_side_effects():
    p = kv()
    blocks = chain(4, 16)
    for _ in range(3):
        d = p.select(req(blocks), insts("a", "b"), {})
        assert d.costs["a"] == d.costs["b"]


def test_kv_aware_select_64_candidates_512_blocks():
    rng = random.Random(0)
    p = kv()
    blocks = chain(2, 512)
    cands = [
        InstanceState(f"e{k}", inflight=rng.randrange(8), queued_prefill_tokens=rng.randrange(5000)) for k in range(64)
    ]
    tiers = ("device", "host", "remote")
    m = {f"e{k}": PrefixMatch({tiers[k % 3]: rng.randrange(1, 512)}) for k in range(0, 64, 2)}
    for k in range(8):
        p.on_routed(req(blocks[: 64 * (k + 1)]), f"e{k}")
    d = p.select(req(blocks), cands, m)
    assert len(d.costs) == 64 and d.instance in d.costs
    assert d.costs[d.instance] == min(d.costs.values()) or "guard" in d.explained()


# approx_kv


def test_approx_kv_sticks_then_forgets_after_ttl():
    clock = FakeClock()
    p = make_policy("approx_kv", rng=random.Random(0), clock=clock, learned_ttl_s=120)
    assert p.uses_index is False
    cands = insts("a", "b", "c")
    prefix = chain(8, 20)
    first = route(p, req(prefix + chain(0, 0, 1, 1)), cands).instance
    elsewhere = {i: PrefixMatch({"device": 20}) for i in ("a", "b", "c") if i != first}
    for k in range(2, 6):
        clock.now += 10
        d = route(p, req(prefix + chain(0, 0, k, 1)), cands, elsewhere)  # matches are ignored
        assert d.instance == first
    clock.now += 121
    d = p.select(req(prefix), cands, {})
    assert len(set(d.costs.values())) == 1


def test_approx_kv_cache_not_ok_gets_no_credit():
    p = make_policy("approx_kv", rng=random.Random(0), clock=FakeClock())
    p.on_routed(req(chain(8, 20)), "a")
    d = p.select(req(chain(8, 20)), [InstanceState("a", cache_ok=False), InstanceState("b")], {})
    assert d.costs["a"] == d.costs["b"]


# recent.py


def test_recent_blocks_counts_consecutive_prefix_per_instance():
    r = RecentBlocks(ttl_s=10, capacity=1000)
    r.record("a", [1, 2, 3, 4], now=0)
    r.record("b", [1, 2, 9], now=5)
    assert r.match([1, 2, 3, 4, 5], now=6) == {"a": 4, "b": 2}
    assert r.match([7, 1], now=6) == {}
    assert r.match([1, 2, 3], now=12) == {"b": 2}  # a's entries expired
    assert r.match([1, 2], now=20) == {}


def test_recent_blocks_long_chains_and_many_instances():
    r = RecentBlocks(ttl_s=10, capacity=100_000)
    chain_ = list(range(512))
    for k in range(64):
        r.record(f"e{k}", chain_[: 8 * (k + 1)], now=k * 0.1)
    assert r.match(chain_, now=7) == {f"e{k}": 8 * (k + 1) for k in range(64)}
    assert r.match(chain_, now=10.35) == {f"e{k}": 8 * (k + 1) for k in range(4, 64)}
    r.record("e0", chain_[:3], now=11)  # a shorter sibling refreshes only its own blocks
    assert r.match(chain_, now=12)["e0"] == 3


def test_recent_blocks_match_a_brute_force_reference():
    """Random records and expiries, under a capacity, of chains that share prefixes (as chained hashes
    do): `match`'s binary search agrees with walking every block."""
    rng = random.Random(3)
    r = RecentBlocks(ttl_s=1.0, capacity=60)
    trunks = [list(range(k * 1000, k * 1000 + 30)) for k in range(3)]
    chains, now = [], 0.0
    for _ in range(400):
        now += rng.random() * 0.2
        if chains and rng.random() < 0.5:
            blocks = rng.choice(chains)
        else:
            blocks = rng.choice(trunks)[: rng.randrange(1, 30)] + [rng.randrange(10**6, 2 * 10**6)]
            chains.append(blocks)
        r.record(rng.choice("abcd"), blocks, now)
        query = rng.choice(chains) if rng.random() < 0.5 else rng.choice(trunks)[: rng.randrange(1, 30)]
        r.match([-1], now)  # purge first: the reference reads the table as match will
        expected = {}
        for inst in "abcd":
            held = 0
            for h in query:
                entry = r._table.get(h)
                if entry is None or entry.get(inst, 0.0) <= now:
                    break
                held += 1
            if held:
                expected[inst] = held
        assert r.match(query, now) == expected


class _RecentReference:
    """RecentBlocks as first written: one private dict per block, touched block by block. The
    shared-entry version must keep the same table, in the same order, through any sequence of calls."""

    def __init__(self, ttl_s, capacity, purge_per_call):
        self.ttl_s, self.capacity, self.purge_per_call, self.table = ttl_s, capacity, purge_per_call, {}

    def purge(self, now):
        for _ in range(self.purge_per_call):
            if not self.table:
                return
            h = next(iter(self.table))
            if max(self.table[h].values()) > now:
                return
            del self.table[h]

    def record(self, instance, blocks, now):
        self.purge(now)
        for h in reversed(blocks):
            entry = self.table.pop(h, {})
            entry[instance] = now + self.ttl_s
            self.table[h] = entry
        while len(self.table) > self.capacity:
            del self.table[next(iter(self.table))]

    def withdraw(self, instance, blocks):
        for h in blocks:
            if h in self.table and self.table[h].pop(instance, None) is not None and not self.table[h]:
                del self.table[h]

    def forget(self, instance):
        for h in list(self.table):
            if self.table[h].pop(instance, None) is not None and not self.table[h]:
                del self.table[h]


def test_recent_blocks_shared_entries_keep_the_block_by_block_table():
    """Records of new, partly known, holed (after withdraw) and repeating chains, withdraws, forgets
    and purges, under a small capacity: the table, its order and every entry equal the reference's,
    and a change through one block never shows through another that shared its entry."""
    rng = random.Random(11)
    r, ref = RecentBlocks(ttl_s=1.0, capacity=50, purge_per_call=5), _RecentReference(1.0, 50, 5)
    trunks = [list(range(k * 1000, k * 1000 + 25)) for k in range(3)]
    chains, now = [], 0.0
    for step in range(3000):
        now += rng.random() * 0.05
        roll, inst = rng.random(), rng.choice("abc")
        if roll < 0.1 and chains:
            blocks = rng.choice(chains)
            cut = rng.randrange(len(blocks))
            r.withdraw(inst, blocks[cut:])  # leaves a hole where another chain shares blocks[:cut]
            ref.withdraw(inst, blocks[cut:])
        elif roll < 0.12:
            r.forget(inst)
            ref.forget(inst)
        else:
            if chains and rng.random() < 0.4:
                blocks = rng.choice(chains)
            else:
                blocks = rng.choice(trunks)[: rng.randrange(0, 25)] + [rng.randrange(10**6, 2 * 10**6)]
                if rng.random() < 0.05:
                    blocks = blocks + blocks[:2]  # a block twice in one chain
                chains.append(blocks)
            r.record(inst, blocks, now)
            ref.record(inst, blocks, now)
        r.match([-1], now)
        ref.purge(now)
        assert list(r._table.items()) == list(ref.table.items()), step


def test_recent_blocks_bounded_by_capacity_and_purges_expired():
    r = RecentBlocks(ttl_s=1, capacity=100, purge_per_call=10)
    r.record("a", range(1000), now=0)
    assert len(r) == 100
    assert r.match(range(1000), now=0.5) == {"a": 100}  # the leading blocks are kept
    r.match([5], now=2)
    assert len(r) == 90  # at most purge_per_call expired entries per call
    for _ in range(20):
        r.match([5], now=2)
    assert len(r) == 0
    r.record("a", [1], now=3)
    r.forget("a")
    assert len(r) == 0


def test_kv_aware_fleet_rate_by_default_and_per_instance_on_request():
    pooled = kv(prefill_rate=10_000, min_rate_sample_tokens=64)
    pooled.on_first_token(req(()), "a", ttft_s=0.1, uncached_tokens=4000)  # 40k tok/s seen on a
    assert pooled.rates.get("b") == pooled.rates.get("a") > 10_000  # one rate for the fleet
    split = kv(prefill_rate=10_000, min_rate_sample_tokens=64, per_instance_rate=True)
    split.on_first_token(req(()), "a", ttft_s=0.1, uncached_tokens=4000)
    split.on_first_token(req(()), "b", ttft_s=1.0, uncached_tokens=4000)
    assert split.rates.get("a") > split.rates.get("b")  # each instance keeps its own


def test_kv_aware_near_ties_go_to_the_least_recently_loaded():
    p = kv()
    cands = [InstanceState(x) for x in ("a", "b", "c")]
    seen = []
    for i in range(6):  # six new prefixes on an idle fleet: two each, not a pile on one
        r = req(chain(100 + i, 8), num_tokens=128, request_id=f"n{i}")
        d = p.select(r, cands, {})
        p.on_routed(r, d.instance)
        seen.append(d.instance)
    assert sorted(seen) == ["a", "a", "b", "b", "c", "c"]


def test_a_failed_attempt_withdraws_its_pending_credit():
    p = kv(tie_tolerance=0.0)
    cands = insts("a", "b")
    r = req(chain(7, 20), request_id="r1")
    first = route(p, r, cands)
    p.on_failed(r, first.instance)  # the engine never took it: no blocks are coming there
    again = req(chain(7, 20), request_id="r2")
    assert p.credits(again, cands, {}).get(first.instance, 0.0) == 0.0
    other = req(chain(8, 20), request_id="r3")
    routed = route(p, other, cands)
    assert p.credits(req(chain(8, 20), request_id="r4"), cands, {}).get(routed.instance, 0.0) == 20.0
