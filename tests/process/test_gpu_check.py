"""tools/gpu_check.py takes every step on CPU with the tiny shape (--quick): the command a GPU run
uses, kept working where CI has no GPU."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_check_runs_every_step_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "tools/gpu_check.py", "--out", str(tmp_path), "--device", "cpu",
                           "--shape", "tiny", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
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
    assert result["checkpoint"]["num_hidden_layers"] == 2 and (tmp_path / "model" / "tokenizer.json").is_file()
