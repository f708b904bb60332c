"""loadgen/sim/oracle_popularity.py: oracle_future's victims priced by each block's popularity, not its next use."""

import math

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim import SimConfig, simulate
from kvroute.loadgen.sim.runner import build as build_sim
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import block_hashes, hash_seed
from kvroute.router.contract.settings_values import build

HOT, COLD = tuple(range(100, 116)), tuple(range(200, 216))  # one block each of 16 tokens


def test_a_victim_counts_its_chance_of_a_request_within_the_survival_time_from_its_rate():
    times = (0.0, 5.0, 10.0, 15.0, 20.0)  # 4 requests for the hot block, 1 for the cold one, in 20 s
    specs = [RequestSpec(i, HOT if i < 4 else COLD, 1, arrival_s=t) for i, t in enumerate(times)]
    setup = build_sim(build(SimConfig, instances=1, num_blocks=16, seed=0), "oracle_popularity", specs,
                      ArrivalConfig(rate=None))
    policy, seed = setup.router.policy, hash_seed(setup.cluster.instances[0].runner.info.model)
    hot, cold = block_hashes(HOT, 16, seed)[0], block_hashes(COLD, 16, seed)[0]
    assert policy.future.span_s == 20.0 and policy.future.requests_holding(hot) == 4
    assert policy.wanted(hot, 100.0, 10.0) == pytest.approx(1 - math.exp(-4 / 20 * 10))  # when does not matter
    assert policy.wanted(cold, 0.0, 10.0) == pytest.approx(1 - math.exp(-1 / 20 * 10))
    assert policy.wanted(12345, 0.0, 10.0) == 0.0  # a block no request holds


def test_it_runs_in_the_simulator_between_the_references():
    specs = make_workload("doc-qa", seed=0, num_requests=600, documents=16, doc_tokens=320, question_tokens=24,
                          output_tokens=4, zipf=0.9).requests()
    config = build(SimConfig, instances=4, num_blocks=64, seed=0)  # 16 documents of 20 blocks in 4 x 64 blocks
    got = {name: simulate(config, name, specs, ArrivalConfig(rate=24.0)).summary()
           for name in ("oracle", "oracle_popularity", "oracle_future")}
    assert all(s["requests"] == 600 and not s["errors"] for s in got.values())
    cached = {name: s["cached_token_ratio"] for name, s in got.items()}
    assert cached["oracle"] < cached["oracle_popularity"] < cached["oracle_future"], cached
