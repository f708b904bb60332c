"""Spreading a workload over LoRA adapters: loadgen's assignment, the bodies it sends, bench's engine flags,
and the simulator, which keys and schedules each adapter as the engine does."""

import dataclasses
import json

import orjson
import pytest

from kvroute.loadgen import bench
from kvroute.loadgen.adapters import assign, engine_args, parse_adapters, with_adapters
from kvroute.loadgen.client import request_body
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build


def specs(n=60, groups=6):
    return make_workload("shared-prefix", seed=3, num_requests=n, groups=groups, prefix_tokens=64,
                         question_tokens=16, output_tokens=2).requests()


def test_group_assignment_keeps_each_group_on_one_adapter_and_spreads_the_groups():
    out = assign(specs(), ("a", "b", "c"), "group", seed=1)
    by_group = {}
    for s in out:
        by_group.setdefault(s.group, set()).add(s.adapter)
    assert all(len(v) == 1 for v in by_group.values())
    assert sorted(a for v in by_group.values() for a in v) == ["a", "a", "b", "b", "c", "c"]
    assert assign(specs(), ("a", "b", "c"), "group", seed=1) == out  # seeded
    assert [s.prompt_ids for s in out] == [s.prompt_ids for s in specs()]  # nothing else changes


def test_request_assignment_is_round_robin_and_bad_values_are_refused():
    out = assign(specs(), ("a", "b"), "request")
    assert [s.adapter for s in out[:4]] == ["a", "b", "a", "b"]
    assert assign(specs(), (), "group") == specs()
    with pytest.raises(ValueError, match="--adapter-assign"):
        assign(specs(), ("a",), "tenant")
    for bad in ("a,,b", "a,a", ","):
        with pytest.raises(ValueError, match="distinct"):
            parse_adapters(bad)
    assert parse_adapters(" x, y ") == ("x", "y") and parse_adapters(None) == ()


def test_the_body_names_the_adapter_as_its_model():
    spec = dataclasses.replace(specs()[0], adapter="sql")
    assert orjson.loads(request_body(spec, "kvroute-tiny"))["model"] == "sql"
    assert orjson.loads(request_body(specs()[0], "kvroute-tiny"))["model"] == "kvroute-tiny"
    wrapped = with_adapters(make_workload("random", num_requests=3), ("a",))
    assert wrapped.info()["adapters"] == ["a"] and {s.adapter for s in wrapped.requests()} == {"a"}


def test_bench_gives_every_engine_the_adapters(tmp_path):
    assert engine_args(("a", "b"), "sim", str(tmp_path)) == ("--lora-modules", "a", "b", "--max-loras", "2")
    args = engine_args(("a",), "torch", str(tmp_path), max_loras=1)
    assert args[:2] == ("--lora-modules", f"a={tmp_path}/adapters/a") and args[-2:] == ("--max-loras", "1")
    assert json.loads((tmp_path / "adapters" / "a" / "adapter_config.json").read_text())["r"] == 8
    out = str(tmp_path / "bench")  # a fresh --out (tmp_path holds the adapters written above)
    parsed, policies, _ = bench.parse(["--adapters", "a,b,c", "--quick", "--out", out])
    spec = dict(bench.cluster_specs(parsed, policies))["kv_aware"]
    assert spec.engine_args[-6:] == ("--lora-modules", "a", "b", "c", "--max-loras", "3")
    with pytest.raises(ValueError, match="--max-loras needs --adapters"):
        bench.parse(["--max-loras", "2", "--out", out])


def test_the_simulator_keys_adapters_apart_and_charges_their_loads():
    config = build(SimConfig, instances=2, num_blocks=256, adapters=("a", "b", "c"), max_loras=1,
                   cost_model="a100-llama2-7b")
    one_group = specs(n=30, groups=1)
    result = simulate(config, "kv_aware", assign(one_group, ("a", "b", "c"), "request"))
    firsts = {}
    for r in sorted(result.records, key=lambda r: r.index):
        firsts.setdefault(r.index % 3, r.cached_tokens)
    assert firsts == {0: 0, 1: 0, 2: 0}  # each adapter's first request finds nothing: the prefix is another's
    plain = simulate(dataclasses.replace(config, adapters=()), "kv_aware", one_group)
    assert sum(r.cached_tokens for r in result.records) < sum(r.cached_tokens for r in plain.records)
    with pytest.raises(ValueError, match="do not serve"):
        simulate(dataclasses.replace(config, adapters=("a",)), "kv_aware", assign(one_group, ("a", "b"), "request"))
