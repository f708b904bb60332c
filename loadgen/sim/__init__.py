"""`kvroute sim`: the real policies, index and engine scheduler on a virtual clock, for many instances.

    cluster.py    virtual clock (event heap) + the simulated instances
    instance.py   one engine: BlockManager + Scheduler + the sim runner's cost model
    load_view.py  the router's per-instance load, as InstanceStates kept current incrementally
    router.py     the simulated router: MemoryIndex + policy, dispatch bookkeeping, records
    oracle.py     the reference policy with instant, exact knowledge (simulator only)
    disagg.py     prefill/decode disaggregation: roles, decode choice, KV pulls
    tiers.py      KV tiers: the engine's host pool and shared store with modelled transfer times
    runner.py     simulate(config, policy, specs, arrival) -> SimResult
    report.py     the comparison table
    pd_sweep.py   colocated vs every P:D split, goodput under SLOs (--pd-sweep)
    config.py     SimConfig: the cluster's settings (and the engine's sections it takes)
    flags.py      `kvroute sim`'s flags (COMMAND)
    cli.py        `kvroute sim` (main)
"""

from kvroute.loadgen.sim.cli import main
from kvroute.loadgen.sim.config import SimConfig
from kvroute.loadgen.sim.flags import COMMAND
from kvroute.loadgen.sim.runner import SimResult, simulate

__all__ = ["COMMAND", "main", "simulate", "SimConfig", "SimResult"]
