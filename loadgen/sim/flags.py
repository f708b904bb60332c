"""`kvroute sim`'s flags, declared once (router/contract/settings.py): the command's own, the load
flags it shares with `kvroute loadgen`, the cluster's (SimConfig), the planner's under `--planner-`
and the workload knobs."""

from __future__ import annotations

import dataclasses

from kvroute.loadgen.load_flags import LoadFlags
from kvroute.loadgen.sim.config import SimConfig
from kvroute.loadgen.sim.parallel import default_jobs
from kvroute.loadgen.sim.suite import DEFAULT_TRACE, SUITE_POLICIES
from kvroute.loadgen.workloads import knob_flags
from kvroute.router.contract.cli_parser import Command
from kvroute.router.contract.constraints import at_least
from kvroute.router.contract.settings import Declared, declared, setting
from kvroute.router.planner.config import PlannerConfig

PROG = "kvroute sim"
PLANNER_KNOBS = ("interval_s", "window_s", "hold", "cooldown_s", "colocate_below", "prefill_tokens_per_s",
                 "decode_tokens_per_s")
FROM_PROFILE = ("prefill_tokens_per_s", "decode_tokens_per_s")  # unset: --profile's figure for the cost model


def _policy_help() -> str:
    from kvroute.loadgen.sim.runner import policy_names

    return f"comma-separated, from: {', '.join(policy_names())}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimFlags:
    """simulation"""

    policy: str | None = setting(None, _policy_help(),
                                 default_text=f"kv_aware; with --suite {','.join(SUITE_POLICIES)}")
    num_requests: int | None = setting(None, "requests to generate", flag="requests", aliases=("--num-requests",),
                                       check=at_least(1), default_text="the workload's")
    tenant: tuple[str, ...] = setting((), "a tenant's load, as kvroute loadgen --tenant (name=A,workload=...,rate=...,"
                                          "duration=...,priority=...,start=...,seed=...), and its weight=W (as in a "
                                          "tenant file) and router=K (the replica of --routers it sends to); "
                                          "repeatable, instead of --workload; a row per tenant", metavar="SPEC")
    pd_sweep: bool = setting(False, "run colocated and every P:D split of --instances (one policy); table of goodput "
                                    "per split")
    suite: bool = setting(False, "every workload and a KV pressure sweep, each policy against the oracle (suite.py)")
    suite_trace: str = setting(str(DEFAULT_TRACE), "--suite: the Mooncake trace file", metavar="FILE",
                            default_text="the package's loadgen/data/mooncake_synthetic_trace.jsonl.gz")
    planner: bool = setting(False, "run kvroute planner on the virtual clock (needs --slo-ttft and --slo-tpot): roles "
                                   "change online, starting from --prefill-instances (0: all colocated)")
    profile: bool = setting(False, "print one engine's prefill and decode capacities (at --slo-tpot) for "
                                   "--cost-model, and exit")
    profile_context: int = setting(2000, "with --profile: decode context tokens", check=at_least(1))
    jobs: int = setting(default_jobs(), "policies simulated at once, one process each; same results",
                        check=at_least(1), default_text="one per core")
    json: bool = setting(False, "print the results as JSON instead of a table")
    out: str | None = setting(None, "also write the results as JSON to this file", metavar="FILE")
    records: str | None = setting(None, "write every request's record as JSON lines (with its policy) to this file",
                                  metavar="FILE")


def _load() -> list[Declared]:
    return declared(LoadFlags, only=("workload", "rate", "burstiness", "slo_ttft", "slo_tpot", "adapter_assign"))


def _planner() -> list[Declared]:
    out = []
    for d in declared(PlannerConfig, "planner-", only=PLANNER_KNOBS):
        if d.field in FROM_PROFILE:
            d = dataclasses.replace(d, default=None, optional=True, setting=dataclasses.replace(
                d.setting, default_text="--profile's figure for the cost model"))
        out.append(d)
    return out


COMMAND = Command(prog=PROG, description="Discrete-event simulation of a large cluster with the real policies.",
                  env_prefix="KVROUTE_SIM_", sections=(SimFlags, _load, SimConfig, _planner, knob_flags),
                  doc="docs/loadgen.md")
