"""`kvroute bench` end to end (real processes on loopback), and its argument errors."""

import asyncio
import json

import pytest

from kvroute.loadgen import bench
from kvroute.loadgen.processes import free_port, kvroute_argv, spawn, stop_process, wait_ready

SUMMARY_FIELDS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "cached_token_ratio", "goodput",
                  "requests", "errors")


@pytest.fixture
def direct_engine(tmp_path):
    port = free_port()
    proc = spawn(kvroute_argv("engine", "--backend", "sim", "--port", str(port), "--instance-id", "direct",
                              "--time-scale", "0.1", "--log-level", "WARNING"), str(tmp_path / "direct.log"))
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, watch=[proc], logs=str(tmp_path)))
        yield url
    finally:
        stop_process(proc)


def test_tiny_bench_writes_all_outputs(tmp_path, direct_engine, capsys):
    out = tmp_path / "bench"
    rc = bench.main(["--engines", "2", "--policies", "round_robin,kv_aware", "--num-requests", "16",
                     "--groups", "2", "--prefix-tokens", "256", "--question-tokens", "16", "--output-tokens", "4",
                     "--rate", "20", "--slo-ttft", "1.0", "--slo-tpot", "0.5", "--engine-arg=--time-scale=0.1",
                     "--extra-target", f"direct={direct_engine}", "--no-progress", "--out", str(out)])
    assert rc == 0
    runs = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in runs] == ["round_robin", "kv_aware", "direct"]
    for run in runs:
        assert all(field in run for field in SUMMARY_FIELDS)
        assert run["requests"] == 16 and run["errors"] == 0
    kv = runs[1]
    assert kv["cached_token_ratio"] > 0.5  # 2 groups x 8 requests: all but the first of each hit
    assert "| kv_aware |" in (out / "results.md").read_text()
    for png in ("ttft_cdf.png", "ttft_over_time.png", "requests_per_instance.png"):
        assert (out / png).stat().st_size > 1000
    assert "| kv_aware |" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--policies", "nope"], "unknown policy"),
    (["--workload", "nope"], "unknown workload"),
    (["--rate", "0"], "rate"),
    (["--rate", "-2"], "rate"),
    (["--engines", "0"], "--engines"),
    (["--extra-target", "x"], "NAME=http"),
    (["--tiers", "--pd"], "--tiers runs its own"),
    (["--tiers", "--host-blocks", "0"], "--host-blocks must be at least 1, got 0"),
])
def test_bad_arguments_one_line_error(argv, needle, capsys, tmp_path):
    assert bench.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_unreachable_extra_target_fails_cleanly(tmp_path, capsys):
    port = free_port()  # nothing listens there
    rc = bench.main(["--engines", "1", "--policies", "round_robin", "--num-requests", "2", "--groups", "1",
                     "--prefix-tokens", "32", "--rate", "50", "--engine-arg=--time-scale=0.1", "--no-progress",
                     "--extra-target", f"gone=http://127.0.0.1:{port}", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "--extra-target gone" in err[0] and str(port) in err[0]


def test_tiers_bench_runs_the_storm_on_every_tier_setup(tmp_path, capsys):
    out = tmp_path / "tiers"
    rc = bench.main(["--tiers", "--engines", "1", "--num-blocks", "64", "--host-blocks", "256", "--sessions", "3",
                     "--burst", "3", "--context-tokens", "256", "--min-context-tokens", "192", "--idle-requests", "6",
                     "--idle-tokens", "256", "--idle-rate", "30", "--session-rate", "20", "--gap", "0.3",
                     "--burst-spread", "0.1", "--engine-arg=--time-scale=0.05", "--no-progress", "--out", str(out)])
    assert rc == 0
    runs = {r["name"]: r for r in json.loads((out / "results.json").read_text())}
    assert list(runs) == ["device", "host", "host+redis", "host+file"]
    for name, run in runs.items():
        assert run["requests"] == 3 and run["all_errors"] == 0 and run["all_requests"] == 12
        if name != "device":
            assert run["outputs_equal_device"] == 3
            assert run["cached_tokens_by_tier"]["host"] > 0 and run["tiers"]["recoveries"]["load_host"] >= 1
    assert runs["host+redis"]["tiers"]["bytes"]["store_write"] > 0
    table = (out / "tiers.md").read_text()
    assert table.count("\n") == 6 and "| host+file |" in table and "| host+file |" in capsys.readouterr().out
