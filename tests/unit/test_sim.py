"""kvroute sim: the discrete-event cluster simulator (real policies, index, scheduler; virtual clock)."""

import json
import random

import pytest

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim import SimConfig, main, simulate
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.loadgen.sim.report import COLUMNS
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build
from kvroute.router.decision.base import RouteRequest
from kvroute.router.decision.policies import make_policy
from kvroute.router.decision.route import RouteDecision, RouteSettings
from kvroute.router.index.base import PrefixMatch

TIMING_KEYS = {"sim_wall_s", "engine_step_us_mean", "decision_us_mean", "decision_us_p50", "decision_us_p99",
               "decision_us_max"}


def shared_prefix(n, groups=4, prefix=128, question=16, output=4, seed=0):
    return make_workload("shared-prefix", seed=seed, num_requests=n, groups=groups, prefix_tokens=prefix,
                         question_tokens=question, output_tokens=output).requests()


def local_specs(n, prompt_tokens=40, max_tokens=3, seed=0):
    """A tiny generator on the RequestSpec interface alone: every prompt shares its first 32 tokens."""
    rng = random.Random(seed)
    head = tuple(rng.randrange(5, 8000) for _ in range(32))
    return [RequestSpec(index=i, prompt_ids=head + tuple(rng.randrange(5, 8000) for _ in range(prompt_tokens - 32)),
                        max_tokens=max_tokens) for i in range(n)]


def without_timing(summary):
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


def test_same_seed_same_summary():
    specs = shared_prefix(300)
    config = build(SimConfig, instances=6, seed=3, fast_candidates=2)
    first = simulate(config, "kv_aware", specs, ArrivalConfig(rate=200.0)).summary()
    second = simulate(config, "kv_aware", specs, ArrivalConfig(rate=200.0)).summary()
    assert without_timing(first) == without_timing(second)
    assert first["requests"] == 300 and first["cached_token_ratio"] > 0.5


@pytest.mark.parametrize("policy", ["kv_aware", "round_robin", "oracle"])
def test_every_request_finishes_or_fails(policy):
    specs = local_specs(200)
    too_long = RequestSpec(index=200, prompt_ids=tuple(range(5, 4105)), max_tokens=4)
    specs.append(too_long)
    config = build(SimConfig, instances=2, max_waiting=3, max_running=2, seed=1)
    result = simulate(config, policy, specs, ArrivalConfig(rate=5000.0))
    assert [r.index for r in result.records] == list(range(201))
    ok = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    assert failed and ok  # the queue limit turned some away; the rest ran
    assert all(r.error and r.e2e_s is not None for r in failed)
    assert result.records[200].status == 400
    assert {r.status for r in failed} <= {400, 429}
    assert all(r.output_tokens == 3 and r.ttft_s is not None and len(r.itl_s) == 2 for r in ok)
    summary = result.summary()
    assert summary["completed"] + summary["errors"] == summary["requests"] == 201


def test_multi_turn_follow_ups_are_all_sent():
    specs = make_workload("multi-turn", seed=0, num_requests=24, turns=3, question_tokens=16, answer_tokens=8,
                          output_tokens=3, think_time=0.5).requests()
    result = simulate(build(SimConfig, instances=3), "kv_aware", specs, ArrivalConfig(rate=20.0))
    by_index = {r.index: r for r in result.records}
    assert len(by_index) == 24 and all(r.ok for r in by_index.values())
    for s in specs:
        if s.after is not None:
            before = by_index[s.after]
            assert by_index[s.index].send_s == pytest.approx(before.send_s + before.e2e_s + 0.5)
    assert result.summary()["cached_token_ratio"] > 0.3  # later turns hit their session's earlier turns


@pytest.mark.parametrize("groups, num_blocks", [(6, 4096), (8, 64)])  # ample cache; 2 groups' worth each
def test_oracle_caches_at_least_as_much_as_kv_aware(groups, num_blocks):
    specs = shared_prefix(400, groups=groups, prefix=256, question=16)
    config = build(SimConfig, instances=4, seed=2, num_blocks=num_blocks)
    arrival = ArrivalConfig(rate=10.0)
    oracle = simulate(config, "oracle", specs, arrival).summary()
    kv_aware = simulate(config, "kv_aware", specs, arrival).summary()
    assert oracle["cached_token_ratio"] >= kv_aware["cached_token_ratio"] > 0.5
    assert oracle["ttft_p90_s"] <= kv_aware["ttft_p90_s"]


def test_the_oracle_predicts_the_ttft_each_request_gets(monkeypatch):
    """The oracle's choice is the lowest TTFT on arrival, and its prediction is what the request then gets:
    a higher p90 than round_robin's (the README's doc-qa example) comes from its objective, not from a
    wrong prediction (docs/loadgen.md, the oracle and the tail)."""
    from kvroute.loadgen.sim.oracle import OraclePolicy

    predicted, select = {}, OraclePolicy.select

    def recording(self, request, candidates, matches):
        decision = select(self, request, candidates, matches)
        predicted[request.request_id] = self.predicted_ttft(request)[0][self.position[decision.instance]]
        return decision

    monkeypatch.setattr(OraclePolicy, "select", recording)
    specs = make_workload("doc-qa", seed=0, num_requests=800).requests()
    result = simulate(SimConfig(instances=16), "oracle", specs, ArrivalConfig(rate=200.0))
    errors = sorted(abs(r.ttft_s - predicted[f"r{r.index}"]) for r in result.records)
    assert len(errors) == 800 and errors[len(errors) // 2] < 1e-5 and errors[int(0.75 * len(errors))] < 1e-4


def test_the_table_says_why_the_oracle_p90_is_above_another(capsys):
    argv = ["--instances", "8", "--policy", "round_robin,oracle", "--workload", "doc-qa", "--requests", "1600",
            "--rate", "100"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rr, oracle, note = lines[2:5]
    headers = ["policy", *(h for h, *_ in COLUMNS)]  # a row's cells hold no spaces: one word per column
    p90, used = headers.index("ttft p90 ms"), headers.index("instances used")
    assert float(oracle.split()[p90]) > float(rr.split()[p90])
    assert note.startswith("note: the oracle's TTFT p90") and "above round_robin's" in note
    assert f"served from {oracle.split()[used]} of 8 instances" in note and "(an even share: 12.5%)" in note
    assert main([*argv, "--policy", "oracle,round_robin", "--rate", "400"]) == 0
    assert "note:" not in capsys.readouterr().out  # under heavier load round_robin's p90 is the worse one


def test_event_delay_lowers_the_hit_ratio():
    # A group recurs every ~3 s, longer than kv_aware's pending credit (2 s): only the index remembers it.
    specs = shared_prefix(600, groups=150, prefix=512, question=16, output=2)
    arrival = ArrivalConfig(rate=50.0)
    fresh = simulate(build(SimConfig, instances=4, seed=4), "kv_aware", specs, arrival).summary()
    stale = simulate(build(SimConfig, instances=4, seed=4, event_delay_s=30.0), "kv_aware", specs, arrival).summary()
    assert stale["cached_token_ratio"] < fresh["cached_token_ratio"] - 0.05


def test_fast_path_matches_full_candidates_in_spirit():
    specs = shared_prefix(600, groups=8)
    arrival = ArrivalConfig(rate=400.0)
    full = simulate(build(SimConfig, instances=32, seed=5), "kv_aware", specs, arrival).summary()
    fast = simulate(build(SimConfig, instances=32, seed=5, fast_candidates=4), "kv_aware", specs, arrival).summary()
    assert fast["candidates_mean"] < full["candidates_mean"] == 32
    assert fast["cached_token_ratio"] > 0.9 * full["cached_token_ratio"]


def test_load_view_fast_candidates():
    view = LoadView([f"i{k}" for k in range(10)])
    decision = RouteDecision(make_policy("kv_aware"), RouteSettings(fast_candidates=3, recent_ttl_s=1.0))
    for i in (0, 1, 2, 3):
        view.dispatched(i, 100)
    route = RouteRequest(num_tokens=16, block_hashes=(77,), block_size=16, request_id="r")
    view.dispatched(4, 0)
    decision.routed(route, "i4", now=0.0)  # a recent sender of block 77
    view.first_token(0, 100)
    got = decision.choose(route, view.all(), {"i9": PrefixMatch({"device": 1})}, now=0.5).candidates
    assert [view.ids[i] for i in got] == ["i9", "i4", "i5", "i6", "i7"]  # holder, recent sender, 3 idle ones
    assert [view.ids[i] for i in decision.choose(route, view.all(), {}, now=1.5).candidates] == ["i5", "i6", "i7"]
    states = {c.id: c for c in view.all().states(view.all().members)}
    assert (states["i0"].inflight, states["i0"].queued_prefill_tokens) == (1, 0)
    assert states["i1"].queued_prefill_tokens == 100


def test_step_time_is_the_cost_models():
    rng = random.Random(0)
    bm = BlockManager(256, 16)
    sched = Scheduler(SchedulerConfig(max_batched_tokens=300), bm, frozenset())
    for i in range(12):
        prompt = [rng.randrange(5, 8000) for _ in range(rng.randrange(10, 200))]
        sched.add(Sequence(str(i), prompt, SamplingParams(max_tokens=5, ignore_eos=True), hash_seed=1))
    for _ in range(20):
        step = sched.schedule()
        for cm in COST_MODELS.values():
            assert cm.scheduled_time(step) == cm.step_time(step.works())
        sched.postprocess(step, [7 if s.num_computed + n == len(s) else None
                                 for s, n in zip(step.seqs, step.num_tokens)])


def test_cli_runs_and_compares_with_the_oracle(tmp_path, capsys):
    out = tmp_path / "sim.json"
    records = tmp_path / "records.jsonl"
    rc = main(["--instances", "4", "--policy", "kv_aware,round_robin,oracle", "--workload", "shared-prefix",
               "--requests", "120", "--groups", "3", "--prefix-tokens", "64", "--question-tokens", "8",
               "--output-tokens", "3", "--rate", "50", "--json", "--out", str(out), "--records", str(records)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert set(printed["results"]) == {"kv_aware", "round_robin", "oracle"}
    assert printed["relative_to_oracle"]["oracle"] == {"cached_token_ratio": 1.0, "ttft_p90": 1.0}
    assert printed["results"]["kv_aware"]["index_entries"] > 0
    assert len(records.read_text().splitlines()) == 360


@pytest.mark.parametrize("argv, words", [
    (["--instances", "0", "--workload", "shared-prefix", "--rate", "5"], "--instances"),
    (["--policy", "nope", "--workload", "shared-prefix", "--rate", "5"], "unknown policy"),
    (["--workload", "nope", "--rate", "5"], "unknown workload"),
    (["--workload", "shared-prefix", "--turns", "3", "--rate", "5"], "--turns"),
    (["--workload", "shared-prefix", "--rate", "-1", "--requests", "5"], "--rate"),
    (["--workload", "shared-prefix", "--requests", "5"], "--rate"),
    (["--workload", "shared-prefix", "--rate", "5", "--cost-model", "h100"], "--cost-model"),
    (["--rate", "5"], "--workload"),
    (["--workload", "shared-prefix", "--rate", "5", "--instances", "x"], "--instances"),
    (["--workload", "shared-prefix", "--rate", "5", "--out", "/nonexistent/dir/x.json"], "--out"),
])
def test_cli_bad_arguments_one_line(argv, words, capsys):
    """One line saying what is wrong; after a short usage line when the parser found it."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("kvroute sim: ") and words in lines[-1]
    assert len(lines) == 1 or len(lines) == 2 and lines[0].startswith("usage: kvroute sim [options]")


def test_request_overhead_shifts_ttft_and_e2e_only():
    specs = shared_prefix(100)
    base = simulate(build(SimConfig, instances=4, seed=1), "kv_aware", specs, ArrivalConfig(rate=100.0))
    late = simulate(build(SimConfig, instances=4, seed=1, request_overhead_s=0.005), "kv_aware", specs,
                    ArrivalConfig(rate=100.0))
    for a, b in zip(base.records, late.records):
        assert b.ttft_s == pytest.approx(a.ttft_s + 0.005) and b.e2e_s == pytest.approx(a.e2e_s + 0.005)
        assert b.instance == a.instance and b.cached_tokens == a.cached_tokens


def test_tiers_on_the_virtual_clock_recover_a_session_storm_by_loading():
    specs = make_workload("session-storm", seed=1, sessions=8, context_tokens=1024, min_context_tokens=768,
                          idle_requests=16, idle_tokens=512, burst=8, burst_spread=0.5).requests()
    base = dict(instances=2, num_blocks=128, poll_interval_s=0.0)
    runs = {name: simulate(build(SimConfig, **base, **extra), "kv_aware", specs, ArrivalConfig())
            for name, extra in {"device": {}, "host": {"host_blocks": 1024},
                                "store": {"kv_store": "redis://sim"}}.items()}
    storm = {}
    for name, result in runs.items():
        returns = [r for r in result.records if r.group.startswith("return-")]
        assert len(returns) == 8 and all(r.ok for r in result.records)
        storm[name] = sorted(r.ttft_s for r in returns)[6]
    assert runs["device"].summary()["cached_tokens_by_tier"]["host"] == 0
    host = runs["host"].summary()
    assert host["cached_tokens_by_tier"]["host"] > 0 and host["tiers"]["recoveries"]["load_host"] > 0
    store = runs["store"].summary()
    assert store["cached_tokens_by_tier"]["remote"] > 0 and store["tiers"]["store_blocks"] > 0
    assert storm["host"] < storm["device"] and storm["store"] < storm["device"]


def test_cli_tier_flags_and_policy_args(capsys):
    argv = ["--instances", "2", "--workload", "session-storm", "--sessions", "4", "--burst", "4",
            "--idle-requests", "8", "--idle-tokens", "512", "--context-tokens", "512", "--min-context-tokens", "256",
            "--num-blocks", "64", "--host-blocks", "512", "--kv-store", "file:///nowhere", "--json"]
    assert main(argv + ["--policy-arg", "tier_credit=fixed", "--policy-arg", "remote_credit=0.25"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["policy_args"] == [["tier_credit", "fixed"], ["remote_credit", 0.25]]
    assert out["results"]["kv_aware"]["tiers"]["recoveries"]
    assert main(argv + ["--policy", "round_robin", "--policy-arg", "tier_credit=fixed"]) == 2
    assert "takes none of --policy-arg tier_credit" in capsys.readouterr().err
