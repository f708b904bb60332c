"""`kvroute loadgen --tenant SPEC`: specs, per-tenant requests, summaries with refusal latency."""

import pytest

from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.runner import LoadConfig, LoadResult
from kvroute.loadgen.tenants import _config, parse_tenant, tenant_summary, workload_of


def test_a_spec_names_workload_rate_priority_key_and_knobs():
    load = parse_tenant("name=A,workload=shared-prefix,rate=4,duration=10,priority=-1,key=ka,groups=2,start=1.5")
    assert (load.name, load.rate, load.duration_s, load.priority, load.key, load.start_s) == \
        ("A", 4.0, 10.0, -1, "ka", 1.5)
    assert dict(load.knobs) == {"groups": 2}
    config = _config(LoadConfig(target="http://x"), load, "x-tenant")
    assert dict(config.headers) == {"Authorization": "Bearer ka", "x-tenant": "A"}
    assert config.priority == -1 and config.arrival.rate == 4.0
    assert 20 <= len(workload_of(load).requests()) <= 70  # about rate x duration


@pytest.mark.parametrize("spec", ["name=A,workload=random,rate=4", "name=A,workload=random,rate=0,duration=5",
                                  "name=A,workload=random,rate=4,duration=5,groups=3", "name=A,rate"])
def test_bad_specs_say_why(spec):
    with pytest.raises(ValueError):
        parse_tenant(spec)


def test_the_summary_is_per_tenant_with_refusal_latency():
    ok = RequestRecord(index=0, send_s=0.0, ttft_s=0.1, e2e_s=0.5, output_tokens=3, status=200)
    refused = [RequestRecord(index=i, send_s=0.1 * i, e2e_s=0.01 * i, status=503, error="no") for i in range(1, 11)]
    results = {"A": LoadResult([ok], 1.0, "m", {}, "x"), "B": LoadResult(refused, 2.0, "m", {}, "x")}
    summary, records = tenant_summary(results, 0.5, None)
    assert summary["tenants"]["A"]["goodput"] == 1.0 and summary["tenants"]["A"]["refused"] == 0
    assert summary["tenants"]["B"]["refused"] == 10
    assert summary["tenants"]["B"]["refused_p90_s"] == pytest.approx(0.091)
    assert summary["tenants"]["all"]["requests"] == 11 and {r.group for r in records} == {"A", "B"}
