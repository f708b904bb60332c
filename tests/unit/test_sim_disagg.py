"""kvroute sim with prefill/decode disaggregation (loadgen/sim/disagg.py) and the P:D sweep."""

import json
import random

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim import SimConfig, main, simulate
from kvroute.loadgen.sim.pd_sweep import pd_sweep
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build

TIMING_KEYS = {"sim_wall_s", "engine_step_us_mean", "decision_us_mean", "decision_us_p50", "decision_us_p99",
               "decision_us_max"}


def prefixed_specs(n, prefix=256, suffix=64, max_tokens=5, seed=0):
    """Prompts of `prefix` shared tokens then `suffix` tokens of their own."""
    rng = random.Random(seed)
    head = tuple(rng.randrange(5, 8000) for _ in range(prefix))
    return [RequestSpec(index=i, prompt_ids=head + tuple(rng.randrange(5, 8000) for _ in range(suffix)),
                        max_tokens=max_tokens) for i in range(n)]


def without_timing(summary):
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


def test_colocated_ignores_the_disaggregation_knobs():
    specs = make_workload("shared-prefix", seed=0, num_requests=200, groups=4, prefix_tokens=128,
                          question_tokens=16, output_tokens=4).requests()
    arrival = ArrivalConfig(rate=200.0)
    base = simulate(build(SimConfig, instances=4, seed=1), "kv_aware", specs, arrival)
    knobs = simulate(build(SimConfig, instances=4, seed=1, prefill_instances=0, kv_link="loopback", pd_min_uncached=1),
                     "kv_aware", specs, arrival)
    assert [r.to_dict() for r in base.records] == [r.to_dict() for r in knobs.records]
    assert without_timing(base.summary()) == without_timing(knobs.summary())
    assert base.disagg is None and "disagg" not in base.summary()


@pytest.mark.parametrize("policy", ["kv_aware", "round_robin", "oracle"])
def test_disaggregated_requests_all_finish_and_prefills_stop_at_one_token(policy):
    specs = prefixed_specs(120, prefix=32, suffix=268, max_tokens=6)
    config = build(SimConfig, instances=4, prefill_instances=2, pd_min_uncached=0, seed=2)
    result = simulate(config, policy, specs, ArrivalConfig(rate=300.0))
    assert [r.index for r in result.records] == list(range(120))
    assert all(r.ok and r.output_tokens == 6 and len(r.itl_s) == 5 for r in result.records)
    assert {r.instance for r in result.records} <= {"sim-0", "sim-1"}  # the prefill instance is recorded
    stats = result.disagg
    assert stats["transfers"] == 120 and stats["whole_on_decode"] == 0
    assert stats["prefill_decode_tokens"] == 0  # no prefill instance ever scheduled a decode token


def test_ttft_is_the_prefills_and_the_pull_delays_the_second_token():
    specs = prefixed_specs(60, prefix=32, suffix=268, max_tokens=4)
    arrival = ArrivalConfig(rate=50.0)
    runs = {link: simulate(build(SimConfig, instances=3, prefill_instances=1, pd_min_uncached=0, kv_link=link, seed=3),
                           "round_robin", specs, arrival) for link in ("nvlink", "loopback")}
    fast, slow = runs["nvlink"].records, runs["loopback"].records
    for a, b in zip(fast, slow):
        assert a.ttft_s == pytest.approx(b.ttft_s, abs=1e-12)  # the link never moves the first token
        assert b.itl_s[0] >= 2e-3  # loopback's 2 ms pull latency sits before token 2
    assert sum(r.itl_s[0] for r in slow) > sum(r.itl_s[0] for r in fast) + 60 * 1.5e-3
    assert sum(r.e2e_s for r in slow) > sum(r.e2e_s for r in fast) + 60 * 1.5e-3


def test_a_decode_instance_pulls_only_the_blocks_it_lacks():
    n, prefix, suffix = 20, 256, 64  # 16 shared blocks + 4 own
    config = build(SimConfig, instances=2, prefill_instances=1, pd_min_uncached=0, seed=4)
    shared = simulate(config, "kv_aware", prefixed_specs(n, prefix, suffix), ArrivalConfig(rate=5.0)).disagg
    assert shared["transfers"] == n
    assert shared["kv_blocks_local"] == 16 * (n - 1)  # every request after the first finds the prefix there
    assert shared["kv_blocks_pulled"] == 20 + 4 * (n - 1)
    distinct = simulate(config, "kv_aware", prefixed_specs(n, 0, prefix + suffix), ArrivalConfig(rate=5.0)).disagg
    assert distinct["kv_blocks_local"] == 0 and distinct["kv_blocks_pulled"] == 20 * n


def test_short_uncached_prompts_run_whole_on_a_decode_instance():
    specs = prefixed_specs(40, prefix=32, suffix=100, max_tokens=3)
    config = build(SimConfig, instances=4, prefill_instances=1, pd_min_uncached=10**6, seed=5)
    result = simulate(config, "kv_aware", specs, ArrivalConfig(rate=100.0))
    assert all(r.ok and r.output_tokens == 3 for r in result.records)
    assert {r.instance for r in result.records} <= {"sim-1", "sim-2", "sim-3"}
    assert result.disagg["transfers"] == 0 and result.disagg["whole_on_decode"] == 40


def test_tight_kv_pools_wait_for_pulls_instead_of_failing():
    # 64 blocks: a prefill holds at most 3 finished prompts for pulls, a decode admits ~3 at a time.
    specs = prefixed_specs(40, prefix=32, suffix=268, max_tokens=20)
    config = build(SimConfig, instances=2, prefill_instances=1, pd_min_uncached=0, num_blocks=64, seed=6)
    result = simulate(config, "kv_aware", specs, ArrivalConfig(rate=1000.0))
    assert all(r.ok and r.output_tokens == 20 for r in result.records), result.summary()["error_kinds"]
    assert result.disagg["transfers"] == 40


def test_sweep_has_every_split_and_picks_the_most_goodput():
    specs = prefixed_specs(80, prefix=32, suffix=300, max_tokens=8)
    out = pd_sweep(build(SimConfig, instances=3, pd_min_uncached=0, seed=7), "kv_aware", specs,
                   ArrivalConfig(rate=200.0), slo_ttft_s=0.2, slo_tpot_s=0.01)
    assert [r["config"] for r in out["rows"]] == ["colocated", "1P:2D", "2P:1D"]
    assert [r["prefill_instances"] for r in out["rows"]] == [0, 1, 2]
    best = max(out["rows"], key=lambda r: (r["goodput"], r["goodput_rps_per_instance"]))
    assert out["best"] == best["config"]
    assert len({r["goodput"] for r in out["rows"]}) > 1  # the SLOs separate the configurations
    assert out["rows"][0]["kv_blocks_pulled"] is None and out["rows"][1]["kv_blocks_pulled"] > 0


def test_cli_sweep_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    rc = main(["--instances", "3", "--workload", "random", "--requests", "40", "--input-tokens", "400",
               "--output-tokens", "4", "--rate", "50", "--slo-ttft", "1", "--slo-tpot", "0.05", "--pd-sweep",
               "--json", "--out", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert [r["config"] for r in printed["pd_sweep"]["rows"]] == ["colocated", "1P:2D", "2P:1D"]
    assert printed["pd_sweep"]["best"] in {"colocated", "1P:2D", "2P:1D"}
    assert main(["--instances", "3", "--workload", "random", "--requests", "20", "--rate", "50", "--pd-sweep"]) == 0
    assert "best: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--prefill-instances", "4"], "--prefill-instances"),
    (["--kv-link", "carrier-pigeon"], "--kv-link"),
    (["--pd-min-uncached", "-1"], "--pd-min-uncached"),
    (["--pd-sweep", "--policy", "kv_aware,round_robin"], "--pd-sweep"),
])
def test_cli_bad_disaggregation_arguments(argv, words, capsys):
    assert main(["--instances", "4", "--workload", "random", "--requests", "5", "--rate", "5", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert words in lines[-1] and (len(lines) == 1 or len(lines) == 2 and lines[0].startswith("usage: "))
