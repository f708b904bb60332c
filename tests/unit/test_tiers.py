"""Block manager tiers without I/O: host LRU, one tier per block, copy plans, loads, the recovery choice."""

import pytest

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import RunnerInfo, SamplingParams
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.host_pool import HostPool
from kvroute.engine.kv.link_estimate import LinkEstimate
from kvroute.engine.kv.recovery import Recovery
from kvroute.engine.kv.tier_setup import TierSite, build_tiers
from kvroute.engine.kv.tiers import CacheTiers
from kvroute.router.contract.protocol import block_hashes
from kvroute.router.contract.tier_costs import Link, TierCosts, plan_runs

BS = 4
SEED = 77
INFO = RunnerInfo("m", 100, 4096, None, "float32", 2, 2, 64)
FAST = Link(1e12, 0.0)


def make_bm(num_blocks=4, host_blocks=8, store=None, write="through", budget=0):
    config = TierConfig(host_blocks=host_blocks, kv_store=store, kv_store_write=write, kv_load_budget_bytes=budget)
    return BlockManager(num_blocks, BS, build_tiers(config, TierSite(model="m", block_size=BS), INFO, 1000, 10_000.0))


def seq(tokens, store_hits=None):
    s = Sequence("r", list(tokens), SamplingParams(max_tokens=2), SEED)
    s.store_hits = store_hits
    return s


def run(bm, s):
    """Admit, compute the whole prompt, free (its full blocks stay cached)."""
    hits = bm.match_prefix(s)
    assert bm.can_allocate(s, hits)
    bm.allocate(s, hits)
    s.num_computed = len(s.token_ids)
    bm.commit_computed(s)
    bm.free(s)
    return hits


def by_tier(events):
    out = {}
    for ev in events:
        out.setdefault((ev.kind, ev.tier), []).extend(ev.blocks)
    return out


def test_host_pool_evicts_least_recently_inserted_and_checks_tokens_and_parent():
    pool = HostPool(2)
    a, _ = pool.insert(1, (1,), 0)
    pool.insert(2, (2,), 1)
    assert pool.lookup(2, 1, (2,)) is not None
    assert pool.lookup(2, 9, (2,)) is None and pool.lookup(2, 1, (3,)) is None  # parent, tokens
    _, evicted = pool.insert(3, (3,), 2)
    assert evicted.hash == 1 and evicted.slot == a.slot and pool.hashes() == [2, 3]
    assert pool.insert(3, (3,), 2) == (None, None)  # already here
    pool.take(2)  # held for a copy: not free, not findable
    assert pool.num_used == 2 and pool.hashes() == [3]
    pool.release([a.slot ^ 1])
    assert pool.num_used == 1


def test_evicted_blocks_go_to_the_host_oldest_first_and_come_back_as_copies():
    bm = make_bm(num_blocks=4, host_blocks=3)
    a = seq(range(10, 19))  # 2 full blocks + 1 token
    run(bm, a)
    ha = block_hashes(a.token_ids[:8], BS, SEED)
    bm.drain_events()
    bm.take_copy_plan()
    run(bm, seq(range(30, 43)))  # 3 full blocks + 1: evicts both of a's cached blocks
    events = by_tier(bm.drain_events())
    assert set(events[("stored", "host")]) == set(ha)
    assert set(events[("removed", "device")]) == set(ha)
    plan = bm.take_copy_plan()
    assert len(plan.d2h) == 2 and not plan.h2d
    assert bm.tiers.host.hashes() == [ha[1], ha[0]]  # the tail was freed (and evicted) first
    back = seq(list(range(10, 19)) + [5])
    hits = bm.match_prefix(back)
    assert len(hits.device) == 0 and [e.hash for e in hits.host] == ha and hits.runs == [("host", 2)]
    bm.allocate(back, hits)
    assert back.num_computed == 8 and back.pending_loads == 0  # within budget: copied before the next step
    plan = bm.take_copy_plan()
    assert len(plan.h2d) == 2 and {dev for _, dev in plan.h2d} == set(back.block_table[:2])
    events = by_tier(bm.drain_events())
    assert set(events[("removed", "host")]) >= set(ha) and set(events[("stored", "device")]) >= set(ha)
    assert not set(ha) & set(bm.tiers.host.hashes())  # in one tier at a time


def test_a_block_computed_again_leaves_the_host():
    bm = make_bm(num_blocks=4, host_blocks=8)
    run(bm, seq(range(10, 19)))
    run(bm, seq(range(30, 43)))
    ha = block_hashes(list(range(10, 18)), BS, SEED)
    assert set(ha) <= set(bm.tiers.host.hashes())
    bm.tiers.recovery.prefill.rate = 1e12  # recomputing is "free": the cost model refuses the host copy
    again = seq(list(range(10, 19)) + [1])
    hits = bm.match_prefix(again)
    assert hits.runs == [("host", 2)] and hits.num_loads == 0
    run(bm, again)
    assert not set(ha) & set(bm.tiers.host.hashes())
    assert bm.tiers.recovery.runs["recompute"] == 1


def test_load_budget_spreads_loads_over_batches_and_the_request_waits_for_them():
    bm = make_bm(num_blocks=8, host_blocks=8, budget=1000)  # 1 block (1000 bytes) per batch
    first = seq(range(10, 23))  # 3 full blocks
    run(bm, first)
    run(bm, seq(range(40, 69)))  # evicts them to the host
    bm.take_copy_plan()
    back = seq(list(range(10, 23)) + [2])
    hits = bm.match_prefix(back)
    bm.allocate(back, hits)
    assert back.pending_loads == 2  # one went into the current batch
    assert len(bm.take_copy_plan().h2d) == 1
    bm.drain_loads()
    assert back.pending_loads == 1
    assert len(bm.take_copy_plan().h2d) == 1
    bm.drain_loads()
    assert back.pending_loads == 0 and len(bm.take_copy_plan().h2d) == 1


def test_store_loads_wait_for_bytes_and_a_missing_entry_cuts_the_prefix():
    bm = make_bm(num_blocks=8, host_blocks=0, store="redis://127.0.0.1:1/0")
    tokens = list(range(10, 23)) + [1]
    hashes = block_hashes(tokens[:12], BS, SEED)
    s = seq(tokens, store_hits=frozenset(hashes))
    hits = bm.match_prefix(s)
    assert hits.runs == [("remote", 3)] and hits.num_loads == 3
    bm.allocate(s, hits)
    s.num_cached, s.cached_by_tier = s.num_computed, hits.tokens_by_tier(BS)
    assert s.num_computed == 12 and s.pending_loads == 3
    loads = bm.tiers.loads.fetches()
    assert [ld.block.hash for ld in loads] == hashes and bm.tiers.loads.fetches() == []
    bm.tiers.loads.arrived(loads[0], b"")
    bm.tiers.loads.arrived(loads[1], None)  # missing: blocks 1 and 2 are recomputed
    assert s.num_computed == 4 and s.block_hashes == hashes[:1] and s.pending_loads == 1
    assert s.num_cached == 4 and s.cached_by_tier == {"device": 0, "host": 0, "remote": 4}
    plan = bm.take_copy_plan()
    assert [dev for dev, _ in plan.writes] == s.block_table[:1] and s.pending_loads == 0
    bm.tiers.loads.arrived(loads[2], b"")  # late answer for a cancelled load: ignored
    assert s.pending_loads == 0


def test_write_through_reads_prompt_blocks_once_and_evict_mode_reads_leaving_blocks():
    bm = make_bm(num_blocks=4, host_blocks=0, store="file:///tmp", write="through")
    run(bm, seq(range(10, 19)))
    plan = bm.take_copy_plan()
    assert [b.hash for b in plan.reads] == block_hashes(list(range(10, 18)), BS, SEED)
    run(bm, seq(range(10, 19)))  # same prompt: known in the store, nothing new to write
    assert not bm.take_copy_plan().reads
    ev = make_bm(num_blocks=4, host_blocks=2, store="file:///tmp", write="evict")
    run(ev, seq(range(10, 19)))
    assert not ev.take_copy_plan().reads
    run(ev, seq(range(30, 43)))  # evicts a's 2 blocks to the host: still local, not written
    assert not ev.take_copy_plan().reads
    run(ev, seq(range(50, 63)))  # 3 more evictions into a full host: its oldest leave the last local tier
    plan = ev.take_copy_plan()
    assert len(plan.host_reads) == 3 and len(plan.d2h) == 3
    assert [s for s, _ in plan.host_reads] == [s for _, s in plan.d2h]  # read out before being overwritten


def test_freeing_a_request_cancels_its_loads_and_frees_their_host_slots():
    bm = make_bm(num_blocks=8, host_blocks=8, budget=1000)
    run(bm, seq(range(10, 23)))
    run(bm, seq(range(40, 69)))
    bm.take_copy_plan()
    back = seq(list(range(10, 23)) + [2])
    bm.allocate(back, bm.match_prefix(back))
    assert back.pending_loads == 2
    bm.free(back)
    assert back.pending_loads == 0 and len(bm.tiers.loads) == 0
    bm.take_copy_plan()
    host = bm.tiers.host
    assert host.num_used == len(host.entries)  # every slot of the cancelled loads is free again


def test_load_or_recompute_flips_where_the_cost_model_says():
    block_s = 16 / 10_000.0  # 16 tokens at 10k tokens/s: 1.6 ms of compute per block
    for bandwidth, loads in ((1e9, 1), (1e6, 0)):  # 1 MB block: 1 ms to load, or 1 s
        costs = TierCosts(1_000_000, {"h2d": Link(bandwidth, 0.0)}, has_host=True)
        assert plan_runs([("host", 10)], costs.load_time, block_s)[0] == loads
    # With latency, a run flips between loading and recomputing where load time crosses compute time.
    costs = TierCosts(1_000_000, {"h2d": Link(1e9, 0.006)}, has_host=True)  # 6 ms + 1 ms per block
    assert plan_runs([("host", 9)], costs.load_time, block_s)[0] == 0  # 15 ms to load > 14.4 ms to compute
    assert plan_runs([("host", 11)], costs.load_time, block_s)[0] == 1  # 17 ms < 17.6 ms
    assert plan_runs([("host", 20)], costs.load_time, block_s) == (1, pytest.approx(20 * block_s - 0.026))
    # A slow store run after a fast host run: load the host run only.
    both = TierCosts(1_000_000, {"h2d": Link(1e9, 0.0), "store_read": Link(1e6, 0.0)}, True, "s#ns")
    assert plan_runs([("host", 4), ("remote", 4)], both.load_time, block_s)[0] == 1


def test_recovery_choice_follows_measured_links():
    priors = {name: Link(1e9, 0.0) for name in ("h2d", "d2h", "store_read", "store_write")}
    rec = Recovery(priors, 10_000.0, 16, 1_000_000, has_host=True)
    assert rec.choose([("host", 8)]) == 1
    for _ in range(60):  # the link turns out 1000x slower than its prior
        rec.observe("h2d", 8_000_000, 8.0)
    assert rec.links["h2d"].time(8_000_000) == pytest.approx(8.0, rel=0.05)
    assert rec.choose([("host", 8)]) == 0


def test_link_estimate_fits_latency_and_bandwidth():
    est = LinkEstimate(Link(1e9, 0.0))
    for i in range(200):
        n = (1 + i % 7) * 1_000_000
        est.observe(n, 0.002 + n / 5e8)  # 2 ms + 500 MB/s
    assert est.link.latency_s == pytest.approx(0.002, rel=0.05)
    assert est.link.bandwidth_bps == pytest.approx(5e8, rel=0.05)
    same = LinkEstimate(Link(1e9, 0.001))
    for _ in range(200):  # one size only: still a sane, positive fit
        same.observe(1_000_000, 0.01)
    assert same.time(1_000_000) == pytest.approx(0.01, rel=0.1) and same.link.bandwidth_bps > 0


def test_bad_tier_settings_are_refused():
    with pytest.raises(ValueError, match="--host-blocks"):
        TierConfig(host_blocks=-1)
    with pytest.raises(ValueError, match="redis:// or file:///"):
        TierConfig(kv_store="s3://bucket")
    with pytest.raises(ValueError, match="--kv-store-write"):
        TierConfig(kv_store="file:///tmp", kv_store_write="sometimes")
    with pytest.raises(ValueError, match="--kv-host-link"):
        TierConfig(kv_host_link="carrier-pigeon")
    with pytest.raises(ValueError, match="--kv-store-write"):
        CacheTiers(Recovery({n: FAST for n in ("h2d", "d2h", "store_read", "store_write")}, 1.0, 4, 1, False),
                   store_write="never")


def test_blocks_about_to_be_evicted_are_copied_ahead_and_then_evicted_without_a_copy():
    bm = make_bm(num_blocks=4, host_blocks=8)
    a = seq(range(10, 23))  # 3 full blocks + 1 token: 4 blocks, 3 of them cached once freed
    run(bm, a)
    bm.take_copy_plan()
    ahead = bm.take_ahead_plan(max_fresh=2)  # 2 fresh per step: the device's LRU head is staged
    staged = [dev for dev, _ in ahead.d2h]
    assert staged == list(bm.free_cached)[:len(staged)] and len(staged) >= 2
    assert not bm.tiers.host.entries  # staged, not findable: the device copy is still the live one
    run(bm, seq(range(40, 47)))  # takes the plain block and evicts the first staged one
    pre = bm.take_copy_plan()
    assert not pre.d2h  # already copied ahead
    assert len(bm.tiers.host.entries) == 1
    reused = seq(list(range(10, 23)) + [1])  # hits the rest of a's blocks on the device
    hits = bm.match_prefix(reused)
    bm.allocate(reused, hits)
    assert not set(hits.device) & set(bm.tiers.prestager.staged)  # their staged copies are dropped
    assert [e.hash for e in hits.host] == block_hashes(a.token_ids[:12], BS, SEED)[2:]  # a's evicted tail
    bm.take_copy_plan()
    host = bm.tiers.host
    assert host.num_used == len(host.entries) + len(bm.tiers.prestager.staged)
