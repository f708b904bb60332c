"""`kvroute sim --jobs`: policies in forked processes give what they give one after the other."""

import json

from kvroute.loadgen.sim.cli import main

TIMED = ("decision_us_mean", "decision_us_p50", "decision_us_p99", "decision_us_max", "engine_step_us_mean",
         "sim_wall_s")
ARGV = ["--instances", "6", "--policy", "kv_aware,round_robin,oracle", "--workload", "shared-prefix",
        "--requests", "150", "--groups", "4", "--prefix-tokens", "64", "--question-tokens", "8",
        "--output-tokens", "3", "--rate", "60", "--json"]


def run(tmp_path, jobs: int, capsys) -> tuple[dict, list[str]]:
    records = tmp_path / f"records-{jobs}.jsonl"
    assert main([*ARGV, "--jobs", str(jobs), "--records", str(records)]) == 0
    out = json.loads(capsys.readouterr().out)
    for summary in out["results"].values():
        for key in TIMED:  # wall-clock measurements: the only fields that may differ
            assert summary.pop(key) >= 0
    return out, records.read_text().splitlines()


def test_parallel_policies_give_the_sequential_results(tmp_path, capsys):
    one, one_records = run(tmp_path, 1, capsys)
    two, two_records = run(tmp_path, 3, capsys)
    assert list(two["results"]) == ["kv_aware", "round_robin", "oracle"]  # the order asked for
    assert two["results"] == one["results"] and two["relative_to_oracle"] == one["relative_to_oracle"]
    assert two_records == one_records and len(one_records) == 450
    assert one["results"]["kv_aware"]["cached_token_ratio"] > one["results"]["round_robin"]["cached_token_ratio"]


def test_jobs_must_be_positive(capsys):
    assert main([*ARGV, "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs" in err
