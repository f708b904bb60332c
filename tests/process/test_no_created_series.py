"""No `*_created` series on any server's /metrics (vLLM and most exporters turn them off).

prometheus_client's switch (`disable_created_metrics`) is per process, so each server's metrics are
built and scraped in a fresh interpreter that imports what that server imports, not in this test
process, where some other module has long turned it off."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = {  # what the server's process builds, and a counter moved so that its series are written
    "router": "from kvroute.router.service.metrics import RouterMetrics\n"
              "m = RouterMetrics(); m.count_request('e0', 'kv_aware', '200'); m.observe_rejected(413)\n"
              "m.observe_finished('tiny', 'e0', 0.02, None); registry = m.registry",
    "engine": "from kvroute.engine.service.metrics import EngineMetrics\n"
              "registry = EngineMetrics('tiny').registry",
    "planner": "from kvroute.router.planner.decide import PlannerConfig\n"
               "from kvroute.router.planner.service import PlannerService\n"
               "s = PlannerService(PlannerConfig(), 'http://127.0.0.1:9', None); s.changes.inc(); s.errors.inc()\n"
               "registry = s.registry",
}


@pytest.mark.parametrize("server", BUILD)
def test_metrics_have_no_created_series(server):
    code = BUILD[server] + "\nfrom prometheus_client import generate_latest\nprint(generate_latest(registry).decode())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    counters = [line for line in out.splitlines() if line.split("{")[0].split(" ")[0].endswith("_total")]
    assert counters, out  # counters are there, written without their _created companions
    assert "_created" not in out, [line for line in out.splitlines() if "_created" in line]
