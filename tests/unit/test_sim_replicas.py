"""Several router replicas in the simulator (loadgen/sim/replicas.py), admission shared or each its own."""

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.sim.tenant_mix import mixed_specs
from kvroute.loadgen.tenants import parse_tenant

SLO = 0.5


def admitted(sync_s: float) -> tuple[dict[str, int], int, int]:
    """A (weight 4) floods replica 0 and B (weight 1) replica 1, each at 120/s for 10 s on 4 instances."""
    loads = [parse_tenant(f"name={name},workload=random,rate=120,duration=10") for name in "AB"]
    specs = mixed_specs(loads)
    config = SimConfig(instances=4, seed=0, admission_slo_s=SLO, routers=2, admission_sync_s=sync_s,
                       admission_tenants=(("A", 0, 4.0), ("B", 0, 1.0)), tenant_routers=(("A", 0), ("B", 1)))
    result = simulate(config, "kv_aware", specs, ArrivalConfig())
    served = dict.fromkeys("AB", 0)
    for r in result.records:
        served[r.group.partition(":")[0]] += r.ok
    return served, len(result.records), len(specs)


def test_shared_admission_holds_the_weights_over_replicas_that_each_see_one_tenant():
    shared, recorded, sent = admitted(0.05)
    assert recorded == sent  # every request served or refused, none lost between replicas
    alone, _, _ = admitted(0.0)
    # each replica alone sees one tenant only, so gives it the whole fleet: the weights collapse to 1:1
    assert alone["A"] / alone["B"] < 1.5
    # shared, the fleet's counts and virtual time hold 4:1 over both replicas (4.1 measured: 447 : 110)
    assert 3.0 <= shared["A"] / shared["B"] <= 6.0


def test_routers_are_checked():
    with pytest.raises(ValueError, match="--routers"):
        SimConfig(routers=0)
    with pytest.raises(ValueError, match="router="):
        SimConfig(routers=2, tenant_routers=(("A", 2),))


def test_a_quiet_tenant_beside_a_flood_at_another_replica_keeps_its_slo():
    """Q at 3 req/s to replica 0, N flooding replica 1 at 240 req/s: Q is light (far below its share),
    so its requests go once they fit their budget, past the engines' threshold the flood fills."""
    loads = [parse_tenant("name=Q,workload=random,rate=3,duration=10"),
             parse_tenant("name=N,workload=random,rate=240,duration=10")]
    config = SimConfig(instances=4, seed=0, admission_slo_s=SLO, routers=2, admission_sync_s=0.05,
                       admission_tenants=(("Q", 0, 1.0), ("N", 0, 1.0)), tenant_routers=(("Q", 0), ("N", 1)))
    result = simulate(config, "kv_aware", mixed_specs(loads), ArrivalConfig())
    quiet = [r for r in result.records if r.group.startswith("Q:")]
    assert len(quiet) == 29 and all(r.ok and r.ttft_s <= SLO for r in quiet)
    assert sum(r.ok for r in result.records) - len(quiet) >= 500  # the flood keeps the fleet full
