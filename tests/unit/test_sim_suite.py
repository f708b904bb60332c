"""kvroute sim --suite (every workload and the KV pressure sweep) and the oracle_future reference."""

import json
import pathlib

import kvroute.loadgen
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim import SimConfig, main, simulate
from kvroute.loadgen.sim.oracle_future import FutureUses
from kvroute.loadgen.sim.suite import DEFAULT_TRACE, SUITE_POLICIES, suite_cases
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import block_hashes
from kvroute.router.contract.settings_values import build

SMALL = ["--suite", "--requests", "24", "--instances", "2", "--num-blocks", "256"]
ROWS = ["shared-prefix", "multi-turn", "doc-qa", "random", "hot-prefix", "mooncake",
        "pressure-16", "pressure-32", "pressure-48", "pressure-64", "pressure-96"]


def test_suite_table_has_every_workload_and_every_policy(tmp_path, capsys):
    out = tmp_path / "suite.json"
    assert main([*SMALL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    data = json.loads(out.read_text())
    rows = ROWS  # the Mooncake row too: its trace is in the package
    assert [case["case"] for case in data["cases"]] == rows and data["skipped"] == []
    assert data["config"]["instances"] == 2 and data["config"]["num_blocks"] == 256  # flags override the suite's
    for case in data["cases"]:
        assert list(case["results"]) == list(SUITE_POLICIES)
        assert case["results"]["kv_aware"]["requests"] <= 24
        assert set(case["relative_to_oracle"]) == set(SUITE_POLICIES)
        assert case["relative_to_oracle"]["oracle"]["ttft_p90"] == 1.0
    header = next(line for line in printed if line.lstrip().startswith("case"))
    for name in SUITE_POLICIES:
        assert name == "oracle" or f"{name} cached/o" in header and f"{name} p90/o" in header
    for row in rows:
        assert any(line.split()[0] == row for line in printed if line.strip())
    assert sorted(data["targets"]["met"] + data["targets"]["missed"]) == sorted(rows)
    assert any(line.startswith("kv_aware: p90 <= 1.25x") for line in printed)


def test_the_default_trace_is_package_data_and_replays():
    package = pathlib.Path(kvroute.loadgen.__file__).resolve().parent
    assert DEFAULT_TRACE.is_file() and DEFAULT_TRACE.is_relative_to(package)
    workload = make_workload(f"trace:{DEFAULT_TRACE}", seed=0)
    info = workload.info()
    assert info["requests"] == 3993 and round(info["mean_input_source"]) == 15325
    assert len(workload.requests()) == 3993


def test_suite_skips_a_missing_trace_with_a_line(tmp_path, capsys):
    missing = tmp_path / "no-trace.jsonl"
    assert main(["--suite", "--requests", "8", "--instances", "2", "--policy", "kv_aware,oracle",
                 "--suite-trace", str(missing), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "mooncake" not in [c["case"] for c in data["cases"]]
    assert f"mooncake: skipped, no trace file at {missing}" in captured.err
    cases, skipped = suite_cases(missing)
    assert len(cases) == len(ROWS) - 1 and len(skipped) == 1


def test_suite_refuses_its_own_workload_flags(capsys):
    for extra in (["--workload", "doc-qa"], ["--rate", "5"], ["--documents", "3"], ["--pd-sweep"]):
        assert main(["--suite", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--suite runs its own workloads" in err


def test_future_uses_know_each_blocks_next_request():
    a, b = tuple(range(100, 132)), tuple(range(200, 232))
    specs = [RequestSpec(0, a, 1), RequestSpec(1, b, 1), RequestSpec(2, a + b, 1, after=0, think_s=3.0)]
    future = FutureUses(specs, [(0.0, specs[0]), (1.0, specs[1])], block_size=16, seed=7)
    first_a = block_hashes(a, 16, 7)[0]
    assert future.next_use(first_a, 0.0) == 3.0  # the follow-up, at its parent's send time + think time
    assert future.next_use(first_a, 3.0) == float("inf")
    assert future.next_use(block_hashes(b, 16, 7)[0], 0.5) == 1.0
    assert future.next_use(12345, 0.0) == float("inf")


def test_oracle_future_beats_the_oracle_when_the_pools_are_full():
    specs = make_workload("doc-qa", seed=0, num_requests=600, documents=16, doc_tokens=320, question_tokens=24,
                          output_tokens=4, zipf=0.9).requests()
    config = build(SimConfig, instances=4, num_blocks=64, seed=0)  # 16 documents of 20 blocks in 4 x 64 blocks
    oracle = simulate(config, "oracle", specs, ArrivalConfig(rate=24.0)).summary()
    future = simulate(config, "oracle_future", specs, ArrivalConfig(rate=24.0)).summary()
    assert future["cached_token_ratio"] > oracle["cached_token_ratio"] + 0.01


def test_kv_aware_copies_a_hot_prefix_under_load_in_the_simulator(monkeypatch):
    from kvroute.router.decision.policies import POLICIES
    from kvroute.router.decision.policies.kv_aware import KvAwareConfig, KvAwarePolicy

    def variant(**params):  # kv_aware with the guard out of the way, so replication is what is tested
        class Variant(KvAwarePolicy):
            def __init__(self, config=None, **kw):
                super().__init__(KvAwareConfig(hot_factor=1000.0, **params), **kw)
        return Variant

    monkeypatch.setitem(POLICIES, "copies", variant())
    monkeypatch.setitem(POLICIES, "never_copies", variant(replicate_weight=0.0))
    specs = make_workload("shared-prefix", seed=0, num_requests=600, groups=1, prefix_tokens=1024,
                          question_tokens=32, output_tokens=16).requests()
    config, arrival = build(SimConfig, instances=4, num_blocks=512, seed=0), ArrivalConfig(rate=80.0)
    copies = simulate(config, "copies", specs, arrival)
    never = simulate(config, "never_copies", specs, arrival)
    assert len({r.instance for r in copies.records}) > len({r.instance for r in never.records})
    assert copies.summary()["ttft_p90_s"] < 0.75 * never.summary()["ttft_p90_s"]
