"""The device check (kvroute/benchmarks/gpu_check) takes every step on CPU with the tiny shape (--quick): the
command a GPU run uses, kept working where CI has no GPU, and run from outside the checkout as a user would."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_check_runs_every_step_on_cpu(tmp_path):
    (tmp_path / "cwd").mkdir()
    proc = subprocess.run([sys.executable, "-m", "kvroute.benchmarks.gpu_check", "--out", str(tmp_path / "out"),
                           "--device", "cpu", "--shape", "tiny", "--quick"], cwd=tmp_path / "cwd",
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    steps = result["steps"]
    assert list(steps) == ["memcpy", "prefill", "decode", "serving", "bench", "tiers", "pd_pull"]
    assert steps["memcpy"]["h2d_gb_s"] > 0 and steps["memcpy"]["d2h_gb_s"] > 0
    prefill = steps["prefill"]
    assert prefill["step_ms_0_cached"] > prefill["step_ms_1008_cached"] > 0
    assert all(steps["decode"][f"batch_{b}_eager_ms"] > 0 for b in (1, 16, 64))
    serving = steps["serving"]
    assert serving["served_ttft_ms"] > 0 and serving["runner_step_ms"] > 0 and serving["cold_over_warm"] > 1
    assert steps["bench"]["kv_aware"]["errors"] == 0 and steps["bench"]["kv_aware"]["requests"] == 4
    tiers = steps["tiers"]
    assert set(tiers) - {"seconds"} == {"device", "host+redis"}
    assert tiers["host+redis"]["outputs_equal_device"] == tiers["host+redis"]["storm_requests"] == 3
    assert tiers["host+redis"]["recovery_moved_over_needed"] <= 1.05
    assert steps["pd_pull"]["pulls"] == 2 and steps["pd_pull"]["gb_per_s"] > 0
    assert result["checkpoint"]["num_hidden_layers"] == 2 and (tmp_path / "out" / "model" / "tokenizer.json").is_file()
    assert result["commit"] and not list((tmp_path / "cwd").iterdir())
