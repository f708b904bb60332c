"""`kvroute bench`'s last line names the policy under test, whatever order the runs came in."""

from kvroute.loadgen import bench
from kvroute.loadgen.report import Run


def _run(name: str, p90: float, cached: float) -> Run:
    return Run(name, {"requests": 10, "errors": 0, "ttft_p90_s": p90, "cached_token_ratio": cached})


def test_verdict_names_kv_aware_even_when_another_policy_ran_last():
    args, policies, _ = bench.parse(["--policies", "round_robin,kv_aware,prefix_hash"])
    runs = [_run("round_robin", 0.2, 0.3), _run("kv_aware", 0.05, 0.9), _run("prefix_hash", 0.196, 0.8)]
    line = bench.verdict_line(args, policies, runs)
    assert line.startswith("kv_aware's TTFT p90 is 0.25x round_robin's (50 ms vs 200 ms); ")
    assert line.endswith("cached tokens: round_robin 30%, kv_aware 90%, prefix_hash 80%")


def test_verdict_subject_is_never_an_extra_target():
    args, policies, _ = bench.parse(["--policies", "least_load,kv_aware", "--extra-target", "other=http://h:1"])
    runs = [_run("least_load", 0.1, 0.3), _run("kv_aware", 0.02, 0.9), _run("other", 0.04, 0.5)]
    assert bench.verdict_line(args, policies, runs).startswith("kv_aware's TTFT p90 is 0.20x least_load's")


def test_without_kv_aware_the_last_policy_given_is_under_test():
    args, policies, _ = bench.parse(["--policies", "prefix_hash,round_robin"])
    runs = [_run("prefix_hash", 0.1, 0.8), _run("round_robin", 0.2, 0.3)]
    assert bench.verdict_line(args, policies, runs).startswith("round_robin's TTFT p90 is 2.00x prefix_hash's")


def test_kv_aware_alone_against_an_extra_target():
    args, policies, _ = bench.parse(["--policies", "kv_aware", "--extra-target", "vllm-router=http://h:1"])
    runs = [_run("kv_aware", 0.03, 0.9), _run("vllm-router", 0.06, 0.8)]
    assert bench.verdict_line(args, policies, runs).startswith("kv_aware's TTFT p90 is 0.50x vllm-router's")


def test_pd_compares_disaggregated_with_colocated_not_an_extra_target():
    args, policies, _ = bench.parse(["--pd", "--extra-target", "other=http://h:1"])
    runs = [_run("colocated", 0.1, 0.0), _run("disaggregated 1P+1D", 0.12, 0.0), _run("other", 0.5, 0.0)]
    assert bench.verdict_line(args, policies, runs).startswith(
        "disaggregated 1P+1D's TTFT p90 is 1.20x colocated's")


def _tail(name: str, p90: float, p99: float) -> Run:
    return Run(name, {"requests": 10, "errors": 0, "ttft_p90_s": p90, "ttft_p99_s": p99, "cached_token_ratio": 0.5})


def test_verdict_names_p99_when_it_disagrees_with_p90():
    args, policies, _ = bench.parse(["--policies", "round_robin,kv_aware"])
    better_p90_worse_p99 = [_tail("round_robin", 0.2, 0.3), _tail("kv_aware", 0.05, 0.45)]
    line = bench.verdict_line(args, policies, better_p90_worse_p99)
    assert line.startswith("kv_aware's TTFT p90 is 0.25x round_robin's (50 ms vs 200 ms), "
                           "but its TTFT p99 is 1.50x (450 ms vs 300 ms); cached tokens:")
    worse_p90_better_p99 = [_tail("round_robin", 0.2, 0.9), _tail("kv_aware", 0.3, 0.45)]
    assert ", but its TTFT p99 is 0.50x (450 ms vs 900 ms);" in bench.verdict_line(args, policies, worse_p90_better_p99)
    agreeing = [_tail("round_robin", 0.2, 0.9), _tail("kv_aware", 0.05, 0.45)]
    assert "p99" not in bench.verdict_line(args, policies, agreeing)
