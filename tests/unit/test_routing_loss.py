"""The routing-loss split (router/decision/routing_loss.py) and its reports (loadgen, the simulator)."""

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build
from kvroute.router.contract.tier_costs import TierCosts, store_owner
from kvroute.router.decision.routing_loss import (
    CAUSES,
    LossSample,
    LossSplit,
    best_and_predicted,
    gap_by_cause,
    held_blocks,
    servable,
)
from kvroute.router.index.base import PrefixMatch


def test_an_engine_serves_whole_blocks_and_computes_the_last_token():
    assert servable(4, 64, 16) == 48  # all 4 blocks cached, the last token still computed: 3 blocks
    assert servable(4, 65, 16) == 64
    assert servable(9, 65, 16) == 64  # never more than the prompt holds
    assert servable(3, 0, 16) == servable(0, 100, 16) == 0


def test_best_is_over_the_candidates_and_predicted_is_the_choices():
    matches = {"a": PrefixMatch({"device": 5}), "b": PrefixMatch({"device": 2, "host": 1}),
               store_owner("s1"): PrefixMatch({"remote": 7})}
    held = [(i, held_blocks(i, matches, None)) for i in ("a", "b")]
    assert best_and_predicted(held, "b", 200, 16) == (80, 48)
    assert best_and_predicted(held, "d", 200, 16) == (80, 0)
    with_store = TierCosts(bytes_per_block=1024, links={}, store="s1")
    assert held_blocks("b", matches, with_store) == 7  # its shared store holds more of the prefix


def test_the_parts_add_up_to_the_prompt_request_by_request():
    total = LossSplit()
    for s in (LossSample(prompt_tokens=100, best=64, predicted=32, served=48),
              LossSample(prompt_tokens=50, best=32, predicted=32, served=0),
              LossSample(prompt_tokens=10, best=0, predicted=0, served=0)):
        total.add(s)
    shares = total.shares()
    assert shares["cached"] + sum(shares[f"lost_to_{c}"] for c in CAUSES) == pytest.approx(1.0)
    assert shares["lost_to_balancing"] == pytest.approx(32 / 160)
    assert shares["index_unserved"] == pytest.approx(32 / 160)  # 32 predicted on the second, none served
    assert shares["index_unpredicted"] == pytest.approx(16 / 160)
    assert shares["lost_to_index"] == pytest.approx((32 - 16) / 160)


def test_loadgen_splits_the_records_that_carry_the_routers_figures():
    records = [RequestRecord(index=0, status=200, prompt_tokens=100, cached_tokens=48, best_cached_tokens=64,
                             predicted_cached_tokens=32, ttft_s=0.1, e2e_s=0.2),
               RequestRecord(index=1, status=200, prompt_tokens=100, cached_tokens=0, ttft_s=0.1, e2e_s=0.2)]
    loss = summarize(records)["routing_loss"]
    assert loss["requests"] == 1 and loss["cached"] == pytest.approx(0.48)
    assert loss["lost_to_balancing"] == pytest.approx(0.32)
    assert summarize(records[1:])["routing_loss"] is None


def test_the_simulator_reports_the_split_and_it_explains_the_gap_to_another_run():
    specs = make_workload("doc-qa", seed=0, num_requests=300, documents=12, doc_tokens=512, question_tokens=32,
                          output_tokens=4, zipf=1.0).requests()
    config = build(SimConfig, instances=4, num_blocks=256, request_overhead_s=0.005)
    runs = {name: simulate(config, name, specs, ArrivalConfig(rate=20.0)).summary()
            for name in ("kv_aware", "round_robin")}
    rr, ka = runs["round_robin"]["routing_loss"], runs["kv_aware"]["routing_loss"]
    assert rr["lost_to_balancing"] > 0.2 > ka["lost_to_balancing"]  # round robin passes over cached instances
    for s in runs.values():  # the split is of the same requests as the cached share
        assert s["routing_loss"]["cached"] == pytest.approx(s["cached_token_ratio"])
    gap = gap_by_cause(rr, ka)
    assert sum(gap[c] for c in CAUSES) == pytest.approx(gap["gap"])
    ka_cached, rr_cached = (runs[p]["cached_token_ratio"] for p in ("kv_aware", "round_robin"))
    assert gap["gap"] == pytest.approx(ka_cached - rr_cached)
