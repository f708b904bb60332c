"""The simulator runs the router's admission (loadgen/sim/admission.py): overload and below it."""

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build

SLO = 0.5


def run(rate: float, admission: float | None, n: int = 600):
    specs = make_workload("random", seed=1, num_requests=n).requests()
    config = build(SimConfig, instances=2, seed=0, admission_slo_s=admission)
    return simulate(config, "kv_aware", specs, ArrivalConfig(rate=rate))


def in_slo(records) -> int:
    return sum(1 for r in records if r.ok and r.ttft_s is not None and r.ttft_s <= SLO)


def test_overload_admission_refuses_early_and_serves_more_within_the_slo():
    flooded, admitted = run(60.0, None), run(60.0, SLO)
    assert all(r.ok for r in flooded.records)  # without admission every request waits
    refused = [r for r in admitted.records if r.status in (429, 503)]
    served = [r for r in admitted.records if r.ok]
    assert refused and len(refused) + len(served) == 600  # nothing lost
    assert in_slo(admitted.records) > 1.5 * in_slo(flooded.records)
    assert in_slo(served) >= 0.95 * len(served)  # what is admitted meets its SLO
    # refusals come at once, or once a queued request's budget is below what the engines may hold
    # (SLO x (1 + margin), margin -0.4): within 0.4 x SLO
    assert all(r.e2e_s <= 0.4 * SLO + 1e-9 for r in refused)
    assert any("deadline" in r.error for r in refused)
    assert sorted(r.error for r in refused)[0].startswith("refused by admission")


def test_below_capacity_admission_admits_everything():
    calm = run(5.0, SLO, n=100)
    assert all(r.ok for r in calm.records) and len(calm.records) == 100
    off = run(5.0, None, n=100)
    assert in_slo(calm.records) == in_slo(off.records) == 100


def tenants_run(specs, admission, tenants=()):
    import dataclasses

    from kvroute.loadgen.sim.tenant_mix import mixed_specs, per_tenant
    from kvroute.loadgen.tenants import parse_tenant

    config = dataclasses.replace(build(SimConfig, instances=2, seed=0), admission_slo_s=SLO if admission else None,
                                 admission_tenants=tenants)
    result = simulate(config, "kv_aware", mixed_specs([parse_tenant(s) for s in specs]), ArrivalConfig())
    return per_tenant(result.records, SLO)


def test_a_light_tenant_keeps_its_slo_while_another_floods():
    specs = ["name=A,workload=shared-prefix,rate=3,duration=12", "name=B,workload=random,rate=40,duration=10,seed=3"]
    off, on = tenants_run(specs, False), tenants_run(specs, True)
    assert on["A"]["goodput"] >= 0.95 > off["A"]["goodput"]
    assert on["B"]["refused"] > 0 and on["B"]["goodput_rps"] > off["B"]["goodput_rps"]


def test_priority_bands_keep_the_urgent_stream_and_serve_the_rest_after_the_flood():
    specs = ["name=H,workload=random,rate=5,duration=20,seed=1", "name=L,workload=random,rate=40,duration=8,seed=2",
             "name=Z,workload=random,rate=4,duration=6,start=14,seed=3"]
    out = tenants_run(specs, True, (("H", -1, 1.0), ("L", 1, 1.0), ("Z", 1, 1.0)))
    assert out["H"]["goodput"] >= 0.95 and out["L"]["refused"] > 0
    assert out["Z"]["goodput"] >= 0.95  # low priority is served again once the flood is over


def test_sim_cli_runs_tenants_and_reports_each(tmp_path, capsys):
    import json

    from kvroute.loadgen.sim.cli import main

    out = tmp_path / "tenants.json"
    args = ["--instances", "2", "--policy", "kv_aware", "--admission-slo", "0.5", "--out", str(out),
            "--tenant", "name=A,workload=shared-prefix,rate=3,duration=8",
            "--tenant", "name=B,workload=random,rate=40,duration=6,start=1,seed=3,priority=1"]
    assert main(args) == 0
    tenants = json.loads(out.read_text())["tenants"]["kv_aware"]
    assert set(tenants) == {"A", "B"}
    assert tenants["A"]["goodput"] >= 0.95 and tenants["A"]["refused"] == 0
    assert tenants["B"]["refused"] > 0
    assert "refusal p90 s" in capsys.readouterr().out
    tenant = "name=A,workload=random,rate=1,duration=1"
    assert main(["--instances", "2", "--workload", "random", "--tenant", tenant]) == 2
