"""The planner's numbers, pinned (router/planner/decide.py): decode capacity from a step model,
the predicted colocated TPOT, the Poisson quantile, the SLO bias, the reasons it prints, and
the config it refuses. test_planner.py checks the splits these lead to."""

import math

import pytest

from kvroute.router.planner.decide import (
    EngineView,
    Observation,
    Plan,
    Planner,
    PlannerConfig,
    _overloaded,
    _poisson_quantile,
    assign,
)
from tests.support.planner_fleet import CFG, fleet, obs

STEP = dict(decode_step_s=2 ** -7, decode_seq_s=2 ** -9, decode_context_s=2 ** -20)  # exact in binary


def test_decode_capacity_is_the_profile_figure_without_a_step_model_or_a_context():
    assert Planner(PlannerConfig(decode_tokens_per_s=1234)).decode_capacity(1000) == 1234
    assert Planner(PlannerConfig(decode_tokens_per_s=1234, **STEP)).decode_capacity(0) == 1234


def test_decode_capacity_is_the_largest_batch_meeting_the_tpot_slo():
    # per sequence 2^-9 + 1024 x 2^-20 = 0.0029296875 s; (0.05 - 2^-7) / that = 14.4: 14 sequences
    # in a 2^-7 + 14 x 0.0029296875 = 0.048828125 s step: 286.72 tokens/s
    assert Planner(PlannerConfig(**STEP)).decode_capacity(1024) == pytest.approx(286.72)


def test_decode_capacity_batch_is_capped_by_max_running():
    assert Planner(PlannerConfig(max_running=8, **STEP)).decode_capacity(1024) == pytest.approx(256.0)


def test_decode_capacity_without_a_per_sequence_cost_runs_max_running():
    assert Planner(PlannerConfig(decode_step_s=2 ** -7, max_running=64)).decode_capacity(100) == 8192.0


def test_decode_capacity_runs_one_sequence_when_a_step_alone_misses_the_slo():
    config = PlannerConfig(decode_step_s=0.06, decode_seq_s=2 ** -9)
    assert Planner(config).decode_capacity(100) == pytest.approx(1 / (0.06 + 2 ** -9))


def test_decode_capacity_sets_the_decode_need():
    planner = Planner(PlannerConfig(**STEP))
    plan = planner.decide(Observation(0, fleet("both", "both"), 10, 0.0, 2867.2, mean_context_tokens=1024))
    assert plan.desired == {"prefill": 0, "decode": math.ceil(10 / 0.8)}


def _colocated(n=4, prefill=8000.0, output=2000.0, prompt=1000.0, out_tokens=200.0):
    config = PlannerConfig(decode_step_s=0.01, decode_seq_s=0.0005, decode_context_s=1e-6, slo_tpot_s=0.05,
                           prefill_tokens_per_s=10_000, max_batched_tokens=2048, max_running=64)
    o = Observation(0, fleet(*["both"] * n), 100, prefill, output, None, None, 1000.0, prompt, out_tokens)
    return Planner(config)._colocated_fit(o, n, prefill / 10_000, 0.5)


def test_predicted_colocated_tpot_with_a_full_batch():
    # u_p 0.2, 500 tokens/s an engine, 0.0015 s a sequence: room 0.05; short steps
    # 0.01 + min(64, 100) x 0.0015 = 0.106 s, long ones + 0.1 s of chunk; k90 = 29 of 199 steps
    fit, text = _colocated()
    assert fit == pytest.approx((0.106 + 29 * 0.1 / 199) / 0.05)
    assert text == "predicted colocated TPOT p90 121 ms / SLO"


def test_predicted_colocated_tpot_below_max_running():
    # u_p 0.75, 25 tokens/s an engine: room 0.2125, batch 25 x 0.01 / 0.2125 = 1.18 sequences
    fit, _ = _colocated(prefill=30_000, output=100, out_tokens=100)
    short = 0.01 + 25 * 0.01 / 0.2125 * 0.0015
    k90 = _poisson_quantile(99 * (0.75 / (short + 0.1)) / (0.75 / (short + 0.1) + 0.25 / short), 0.9)
    assert fit == pytest.approx(((99 - k90) * short + k90 * (short + 0.1)) / 99 / 0.05)
    assert fit == pytest.approx(0.8413547237)


def test_predicted_colocated_tpot_of_a_short_output():
    # 3 output tokens: 2 steps, one long at p90; a chunk is min(4000, 2048) tokens
    fit, _ = _colocated(prompt=4000, out_tokens=3)
    assert fit == pytest.approx((0.106 + 0.2048 / 2) / 0.05)


def test_predicted_colocated_tpot_caps_the_long_steps_at_the_output():
    # u_p 0.9, 100-token chunks: 82% of steps long, k90 = 2 of the 1 step a 2-token output takes
    fit, _ = _colocated(prefill=36_000, output=10, prompt=100, out_tokens=2)
    short = 0.01 + 2.5 * 0.01 / (1 - 0.9 - 2.5 * 0.0015) * 0.0015
    assert fit == pytest.approx((short + 0.01) / 0.05)


def test_predicted_colocated_tpot_of_a_one_step_output():
    # 2 output tokens: one step, long at p90 (18% of steps are long: k90 = 1)
    fit, _ = _colocated(prefill=12_000, output=10, prompt=100, out_tokens=2)
    short = 0.01 + 2.5 * 0.01 / (1 - 0.3 - 2.5 * 0.0015) * 0.0015
    assert fit == pytest.approx((short + 0.01) / 0.05)


def test_predicted_colocated_tpot_is_unbounded_with_no_room_left_exactly():
    config = PlannerConfig(decode_step_s=0.01, decode_seq_s=2 ** -10, slo_tpot_s=0.05, prefill_tokens_per_s=10_000)
    o = Observation(0, fleet(*["both"] * 4), 100, 20_000, 2048, None, None, 1000.0, 1000.0, 100.0)
    assert Planner(config)._colocated_fit(o, 4, 2.0, 0.5) == (math.inf, "predicted colocated TPOT unbounded")


def test_a_context_of_one_token_uses_the_step_model():
    planner = Planner(PlannerConfig(**STEP))
    assert planner.decode_capacity(1) == pytest.approx(
        int((0.05 - 2 ** -7) / (2 ** -9 + 2 ** -20)) / (2 ** -7 + int((0.05 - 2 ** -7) / (2 ** -9 + 2 ** -20))
                                                        * (2 ** -9 + 2 ** -20)))
    o = Observation(0, fleet("both", "both"), 10, 100, 100, mean_context_tokens=1, mean_prompt_tokens=10,
                    mean_output_tokens=10)
    assert planner._colocated_fit(o, 2, 0.01, 0.37)[1].startswith("predicted colocated TPOT p90")


def test_predicted_colocated_tpot_is_unbounded_without_room():
    assert _colocated(prefill=2000, output=20_000, prompt=500, out_tokens=100) == (
        math.inf, "predicted colocated TPOT unbounded")
    assert _colocated(prefill=40_000, output=10)[0] == math.inf  # prefill alone fills every engine
    assert _colocated(prefill=39_999, output=0)[0] < math.inf


def test_colocated_fit_is_the_utilization_without_a_step_model():
    o = Observation(0, fleet("both", "both"), 10, 100, 100, mean_context_tokens=500)
    assert Planner(CFG)._colocated_fit(o, 2, 0.01, 0.37) == (0.37, "util 0.37")
    no_context = Observation(0, fleet("both", "both"), 10, 100, 100)
    assert Planner(PlannerConfig(**STEP))._colocated_fit(no_context, 2, 0.01, 0.37)[0] == 0.37


@pytest.mark.parametrize("mean, q, k", [(0.0, 0.9, 0), (1.0, 0.9, 2), (4.0, 0.9, 7), (1.0, 0.5, 1),
                                        (1e5, 0.9, 10_000)])
def test_poisson_quantile(mean, q, k):
    assert _poisson_quantile(mean, q) == k


def test_plan_to_dict_holds_every_field():
    plan = Plan(3.5, {"e1": "decode"}, {"prefill": 1, "decode": 1, "both": 0}, {"prefill": 1, "decode": 2}, "why")
    assert plan.to_dict() == {"at": 3.5, "changes": {"e1": "decode"},
                              "target": {"prefill": 1, "decode": 1, "both": 0},
                              "desired": {"prefill": 1, "decode": 2}, "reason": "why"}


def test_reasons_name_the_split_the_load_and_the_slos():
    planner = Planner(CFG)
    assert planner.decide(obs(0, fleet("both", "both", "both"), 1000, 200)).reason == (
        "keep colocated x3: util 0.07 (prefill 0.10, decode 0.10 engines' worth); colocated: util 0.07 < 0.5")
    assert Planner(CFG).decide(obs(0, fleet("prefill", "decode", "decode"), 1000, 200)).reason == (
        "colocated x3 pending (1/2 intervals, cool-down): util 0.07 (prefill 0.10, decode 0.10 engines' "
        "worth); colocated: util 0.07 < 0.3")
    plan = Planner(CFG).decide(obs(0, fleet(*["both"] * 4), 20_000, 4000, ttft=2.5, tpot=0.0123))
    assert plan.reason == ("2P:2D pending (1/2 intervals, cool-down): util 1.00 (prefill 2.00, decode 2.00 "
                           "engines' worth); TTFT p90 2500 ms, TPOT p90 12 ms, SLO bias +0")
    assert plan.desired == {"prefill": 3, "decode": 3} and plan.target == {"prefill": 2, "decode": 2, "both": 0}
    switch = Planner(CFG).decide(obs(7, fleet("prefill", "decode", "decode", "both"), 20_000, 4000))
    assert switch.reason == ("1P:2D+1both -> 2P:2D: util 1.00 (prefill 2.00, decode 2.00 engines' worth); "
                             "TTFT p90 n/a, TPOT p90 n/a, SLO bias +0")
    assert switch.changes == {"e3": "prefill"} and switch.at == 7


def test_plans_carry_their_time_target_and_demand():
    planner = Planner(CFG)
    assert planner.decide(obs(3, fleet("both", "both"), 1000, 200, requests=0)) == Plan(
        3, {}, {"prefill": 0, "decode": 0, "both": 2}, {"prefill": 1, "decode": 1},
        "no traffic or fewer than 2 engines: no change")
    assert planner.decide(obs(4, fleet("both", "both"), 1000, 200, requests=1)).reason.startswith("keep colocated x2")
    keep = planner.decide(obs(5, fleet("both", "both"), 1000, 200))
    assert (keep.at, keep.changes, keep.target) == (5, {}, {"prefill": 0, "decode": 0, "both": 2})
    pending = planner.decide(obs(6, fleet("both", "both", "both", "both"), 20_000, 4000))
    assert (pending.at, pending.changes) == (6, {})


def test_reasons_name_partial_splits_by_their_counts():
    config = PlannerConfig(**{**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__}, "hold": 1,
                              "cooldown_s": 0.0})
    for roles, before in ((("prefill", "prefill", "prefill"), "3P:0D"), (("prefill", "both"), "1P:0D+1both"),
                          (("decode", "both"), "0P:1D+1both")):
        plan = Planner(config).decide(obs(0, fleet(*roles), 100, 100))
        assert plan.reason.startswith(f"{before} -> colocated x{len(roles)}: "), plan.reason


def test_keeping_the_split_resets_the_pending_target():
    planner = Planner(CFG)
    engines = fleet("prefill", "prefill", "decode", "decode")
    assert not planner.decide(obs(0, engines, 10_000, 4000)).changes  # 1P:3D asked once
    assert "keep 2P:2D" in planner.decide(obs(20, engines, 20_000, 4000)).reason
    assert planner.pending is None and planner.pending_count == 0
    assert not planner.decide(obs(40, engines, 10_000, 4000)).changes  # counts from 1 again


def test_a_change_waits_out_the_cooldown_even_when_held_long_enough():
    planner = Planner(CFG)  # hold 2, cooldown 10
    planner.last_change = 0.0
    engines = fleet("prefill", "prefill", "decode", "decode")
    for now in (1, 2, 3):
        assert not planner.decide(obs(now, engines, 10_000, 4000)).changes
    assert planner.pending_count == 3
    assert planner.decide(obs(10, engines, 10_000, 4000)).changes  # cooled down at exactly 10 s


def test_an_overloaded_split_waits_one_interval_after_a_change():
    planner = Planner(CFG)  # interval_s 2
    planner.last_change = 5.0
    engines = fleet("prefill", "decode", "decode", "decode")
    assert not planner.decide(obs(6.5, engines, 30_000, 1000)).changes
    assert planner.decide(obs(7, engines, 30_000, 1000)).changes


def test_a_fresh_planner_has_no_bias_no_pending_target_and_no_last_change():
    planner = Planner(CFG)
    assert (planner.bias, planner.pending, planner.pending_count, planner.last_change) == (0, None, 0, -math.inf)


def _bias_after(ttfts_tpots, roles=("prefill", "prefill", "decode", "decode")):
    planner, seen = Planner(CFG), []
    for k, (ttft, tpot) in enumerate(ttfts_tpots):
        planner.decide(obs(k, fleet(*roles), 20_000, 4000, ttft=ttft, tpot=tpot))
        seen.append(planner.bias)
    return seen


def test_slo_bias_steps_up_to_half_the_split_and_back_down():
    ttft_miss = (2.0, 0.01)  # TTFT over 1 s, TPOT with room (under 0.8 x 50 ms)
    assert _bias_after([ttft_miss] * 4 + [(0.5, 0.01)] * 3) == [1, 2, 2, 2, 1, 0, 0]


def test_slo_bias_steps_down_for_tpot_and_back_up():
    tpot_miss = (0.5, 0.09)
    assert _bias_after([tpot_miss] * 3 + [(None, None)] * 3) == [-1, -2, -2, -1, 0, 0]


def test_slo_bias_holds_when_the_other_slo_has_no_room():
    assert _bias_after([(2.0, 0.01), (2.0, 0.045), (2.0, 0.06), (0.85, 0.09), (1.0, 0.05)]) == [1, 1, 1, 1, 0]
    assert _bias_after([(0.5, 0.09), (0.8, 0.09)]) == [-1, -1]  # TTFT at 0.8 x its SLO has no room


def test_slo_room_is_a_fraction_of_each_slo():
    config = PlannerConfig(**{**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__}, "slo_ttft_s": 2.0})
    planner = Planner(config)
    engines = fleet("prefill", "prefill", "decode", "decode")
    planner.decide(obs(0, engines, 20_000, 4000, ttft=1.5, tpot=0.09))  # TTFT 1.5 s < 0.8 x 2 s: room
    assert planner.bias == -1


def test_slo_bias_limit_is_at_least_one():
    assert _bias_after([(2.0, 0.01)] * 3, roles=("prefill", "decode")) == [1, 1, 1]


def test_slo_bias_moves_only_while_split_and_resets_when_colocated():
    assert _bias_after([(2.0, 0.01)] * 2, roles=("both", "both", "both", "both")) == [0, 0]
    planner = Planner(CFG)
    planner.bias = 2
    planner.decide(obs(0, fleet("prefill", "decode"), 100, 100))
    assert planner.bias == 0  # light load: colocated, no bias carried


def test_slo_bias_shifts_the_split_within_the_minimums():
    planner = Planner(CFG)
    planner.bias = 5
    assert planner._target(obs(0, fleet(*["both"] * 4), 20_000, 4000), 4, 2.0, 2.0,
                           {"prefill": 0, "decode": 0, "both": 4})[0] == {"prefill": 3, "decode": 1, "both": 0}
    planner.bias = -5
    assert planner._target(obs(0, fleet(*["both"] * 4), 20_000, 4000), 4, 2.0, 2.0,
                           {"prefill": 0, "decode": 0, "both": 4})[0] == {"prefill": 1, "decode": 3, "both": 0}


def test_slos_met_counts_a_missing_figure_as_met_and_the_slo_itself_as_met():
    planner = Planner(CFG)
    assert planner._slos_met(obs(0, [], ttft=1.0, tpot=0.05))
    assert planner._slos_met(obs(0, []))
    assert not planner._slos_met(obs(0, [], ttft=1.01))
    assert not planner._slos_met(obs(0, [], tpot=0.051))


def test_no_load_at_all_runs_colocated():
    target, why = Planner(PlannerConfig(colocate_below=0.0))._target(
        obs(0, [], 0, 0), 2, 0.0, 0.0, {"prefill": 1, "decode": 1, "both": 0})
    assert target == {"prefill": 0, "decode": 0, "both": 2} and "colocated" in why


def test_overloaded_reads_each_roles_demand_against_its_engines():
    assert not _overloaded({"prefill": 0, "decode": 0, "both": 4}, 9.0, 9.0)  # colocated
    assert _overloaded({"prefill": 1, "decode": 0, "both": 3}, 1.5, 0.0)  # prefill on one engine
    assert not _overloaded({"prefill": 2, "decode": 2, "both": 0}, 2.0, 2.0)  # exactly at capacity
    assert _overloaded({"prefill": 2, "decode": 2, "both": 0}, 1.0, 2.5)
    assert not _overloaded({"prefill": 2, "decode": 1, "both": 1}, 1.0, 2.0)  # both engines decode too


def test_assign_fills_prefill_first_from_the_least_loaded_surplus():
    engines = [EngineView("a", "both", running=5), EngineView("b", "both", waiting=1),
               EngineView("c", "both", running=3), EngineView("d", "decode", running=2, waiting=2)]
    assert assign(engines, {"prefill": 1, "decode": 2, "both": 1}) == {"b": "prefill", "c": "decode"}
    assert assign(engines, {"prefill": 2, "decode": 2}) == {"b": "prefill", "c": "prefill", "a": "decode"}


def test_assign_counts_waiting_requests_as_load():
    engines = [EngineView("x", "decode", waiting=5), EngineView("y", "decode", running=3), EngineView("z", "prefill")]
    assert assign(engines, {"prefill": 2, "decode": 1, "both": 0}) == {"y": "prefill"}
    surplus = [EngineView("p", "prefill", waiting=5), EngineView("q", "both", running=3)]
    assert assign(surplus, {"prefill": 0, "decode": 1, "both": 0}) == {"q": "decode"}


def test_assign_to_a_target_without_a_role_moves_nobody_into_it():
    engines = [EngineView("a", "prefill"), EngineView("b", "decode"), EngineView("c", "decode", running=1)]
    assert assign(engines, {"prefill": 2, "decode": 1}) == {"b": "prefill"}


def test_assign_moves_nobody_when_the_target_is_met():
    engines = [EngineView("a", "prefill"), EngineView("b", "decode")]
    assert assign(engines, {"prefill": 1, "decode": 1, "both": 0}) == {}


@pytest.mark.parametrize("field, flag", [("slo_ttft_s", "--slo-ttft"), ("slo_tpot_s", "--slo-tpot"),
                                         ("prefill_tokens_per_s", "--prefill-tokens-per-s"),
                                         ("decode_tokens_per_s", "--decode-tokens-per-s"),
                                         ("interval_s", "--interval-s"), ("window_s", "--window-s")])
def test_each_rate_and_time_must_be_positive(field, flag):
    with pytest.raises(ValueError, match=f"^{flag} must be positive, got 0$"):
        PlannerConfig(**{field: 0})
    assert getattr(PlannerConfig(**{field: 0.001}), field) == 0.001


@pytest.mark.parametrize("bad, message", [({"min_prefill": 0}, "planner min_prefill and min_decode must be at least 1"),
                                          ({"min_decode": 0}, "planner min_prefill and min_decode must be at least 1"),
                                          ({"hold": 0}, "--hold must be at least 1, got 0")])
def test_minimums_and_hold_must_be_at_least_one(bad, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        PlannerConfig(**bad)


@pytest.mark.parametrize("bad", [{"decode_step_s": -0.1}, {"decode_seq_s": -0.1}, {"decode_context_s": -0.1},
                                 {"colocate_margin": -0.1}, {"max_running": 0}])
def test_step_coefficients_margin_and_max_running_are_checked(bad):
    with pytest.raises(ValueError, match="cannot be negative, max_running must be at least 1"):
        PlannerConfig(**bad)


@pytest.mark.parametrize("bad, message", [
    ({"target_utilization": 0}, r"planner target_utilization must be in \(0, 1\], got 0"),
    ({"target_utilization": 1.01}, r"planner target_utilization must be in \(0, 1\], got 1.01"),
    ({"colocate_below": -0.01}, "--colocate-below must be between 0 and 1, got -0.01"),
    ({"colocate_below": 1.01}, "--colocate-below must be between 0 and 1, got 1.01"),
    ({"cooldown_s": -1}, "--cooldown-s must be at least 0, got -1")])
def test_utilization_threshold_and_cooldown_ranges(bad, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        PlannerConfig(**bad)


def test_the_edges_of_each_range_are_accepted():
    config = PlannerConfig(min_prefill=1, min_decode=1, hold=1, decode_step_s=0, decode_seq_s=0,
                           decode_context_s=0, colocate_margin=0, max_running=1, target_utilization=1,
                           colocate_below=1, cooldown_s=0)
    assert (config.max_running, config.target_utilization, config.colocate_below) == (1, 1, 1)
    assert PlannerConfig(colocate_below=0).colocate_below == 0
