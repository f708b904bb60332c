"""kvroute/benchmarks/eviction_regret.py: each simulated eviction checked against the workload's future."""

import math

import pytest

from kvroute.benchmarks import eviction_regret
from kvroute.benchmarks.eviction_regret import Regret, gap_bucket, ratios, run_policy
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.oracle_future import FutureUses
from kvroute.loadgen.sim.runner import simulate
from kvroute.loadgen.sim.suite import SUITE_CONFIG, capped, suite_cases
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import block_hashes

BS = 4


def test_previous_use_is_the_last_planned_request_strictly_before_now():
    a, b = RequestSpec(index=0, prompt_ids=(1, 2, 3, 4), max_tokens=1), RequestSpec(
        index=1, prompt_ids=(1, 2, 3, 4, 5, 6, 7, 8), max_tokens=1)
    future = FutureUses([a, b], [(1.0, a), (3.0, b)], BS, seed=7)
    head, tail = block_hashes(b.prompt_ids, BS, 7)
    assert future.previous_use(head, 3.0) == 1.0  # b's own request at 3.0 does not count
    assert future.previous_use(head, 3.5) == 3.0 and future.previous_use(head, 1.0) == -math.inf
    assert future.previous_use(tail, 3.0) == -math.inf and future.previous_use(12345, 9.0) == -math.inf
    assert future.next_use(head, 1.0) == 3.0  # the other direction, for the evictions


def test_gap_buckets_split_at_their_edges():
    assert [gap_bucket(g) for g in (math.inf, 0.0, 9.99, 10.0, 59.0, 60.0, 119.0, 120.0, 1e6)] == \
        ["new", "<10", "<10", "<30", "<60", "<120", "<120", ">=120", ">=120"]


def test_every_eviction_is_regretted_or_dead_and_every_request_lands_in_one_bucket():
    cases, _ = suite_cases(None)
    case = capped(next(c for c in cases if c.name == "pressure-96"), 260)  # fills the fleet's 8,192 blocks
    got = run_policy(case, "kv_aware")
    assert got.evictions > 0 and got.regretted + got.dead == got.evictions
    assert got.regretted > 0 and got.regret_gap_p50_s is not None and got.regret_gap_p50_s > 0
    assert sum(b["requests"] for b in got.by_gap.values()) == 260
    assert got.by_gap["new"]["cached_tokens"] == 0  # a prompt never requested before cannot be cached
    assert sum(i["requests"] for i in got.per_instance.values()) == 260
    assert sum(i["evictions"] for i in got.per_instance.values()) == got.evictions
    specs = make_workload(case.workload, seed=SUITE_CONFIG.seed, **case.knobs).requests()
    alone = simulate(SUITE_CONFIG, "kv_aware", specs, ArrivalConfig(rate=case.rate)).summary()
    assert got.cached_token_ratio == pytest.approx(alone["cached_token_ratio"])  # the same run as the suite's


def regret(policy, seed, cached):
    return Regret(policy=policy, seed=seed, cached_token_ratio=cached, evictions=0, regretted=0, dead=0,
                  regret_gap_p50_s=None, by_gap={}, per_instance={})


def test_ratios_to_the_reference_per_seed_and_their_median():
    runs = [regret("kv_aware", 0, 0.8), regret("oracle_future", 0, 1.0), regret("kv_aware", 1, 0.45),
            regret("oracle_future", 1, 0.5), regret("kv_aware", 2, 0.6), regret("oracle_future", 2, 0.6)]
    got = ratios(runs, "oracle_future")
    assert list(got) == ["kv_aware"]
    assert got["kv_aware"]["per_seed"] == pytest.approx({0: 0.8, 1: 0.9, 2: 1.0})
    assert got["kv_aware"]["median"] == pytest.approx(0.9)


def test_bad_arguments_get_one_line_and_exit_2(capsys):
    assert eviction_regret.main(["--case", "nope"]) == 2
    assert "no case nope" in capsys.readouterr().err
    assert eviction_regret.main(["--seeds", "x"]) == 2
    assert "--seeds takes integers" in capsys.readouterr().err
    assert eviction_regret.main(["--policies", "kv_aware,nope"]) == 2  # before any simulation runs
    assert "no policy nope" in capsys.readouterr().err
