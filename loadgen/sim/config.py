"""The simulated cluster's settings, declared once (router/contract/settings.py): its own, and the
engine's batch, runner and tier sections (the settings `kvroute engine` takes, each declared where the
engine declares it), of which it takes those the simulation models."""

from __future__ import annotations

import dataclasses
import json

from kvroute.engine.core.config import BatchConfig
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.runners.config import RunnerConfig
from kvroute.loadgen.adapters import parse_adapters
from kvroute.loadgen.sim.admission import AdmissionSetup
from kvroute.loadgen.sim.instance import SimEngine
from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE, Range, at_least
from kvroute.router.contract.settings import check_settings, section, setting
from kvroute.router.decision.admission import AdmissionConfig


def parse_policy_arg(item: str) -> tuple[str, object]:
    """NAME=VALUE; a value that parses as JSON (numbers, true/false) is taken as such, else as a string."""
    name, sep, raw = item.partition("=")
    if not sep or not name:
        raise ValueError(f"--policy-arg must be NAME=VALUE, got {item!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return name, value


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    """simulated cluster (loadgen/sim)"""

    instances: int = setting(8, "simulated engines", check=at_least(1))
    runner: RunnerConfig = section(RunnerConfig, lambda: RunnerConfig(backend="sim", kv_link="nvlink"),
                                   only=("cost_model", "kv_link"))
    event_delay_s: float = setting(0.0, "KV events reach the index this long after the engine emits them, s",
                                   flag="event-delay", check=NOT_NEGATIVE)
    # Fixed client -> router -> engine -> client latency the simulation does not model (HTTP, JSON, the
    # router's own work). On this machine's loopback it measures ~5 ms for 3k-token prompts:
    # `kvroute bench --policies kv_aware --engine-arg=--time-scale=0.001`.
    request_overhead_s: float = setting(0.0, "fixed HTTP/router latency added to every TTFT and E2E, s (measured "
                                             "~0.005 on loopback)", flag="request-overhead", check=NOT_NEGATIVE)
    poll_interval_s: float = setting(0.1, "engine load (running, waiting, KV usage) polled this often, s; 0 = live",
                                     flag="poll-interval", check=NOT_NEGATIVE)
    fast_candidates: int = setting(0, "K > 0: index policies see index holders + recent senders + the K least "
                                      "loaded instances only (load_view.py)", check=NOT_NEGATIVE)
    recent_ttl_s: float = setting(2.0, "fast path: how long a sent first block keeps its instance a candidate, s",
                                  flag="recent-ttl", check=POSITIVE)
    batch: BatchConfig = section(BatchConfig, only=("block_size", "num_blocks", "max_batched_tokens", "max_running",
                                                    "max_waiting"))
    # Prefill/decode disaggregation (disagg.py)
    prefill_instances: int = setting(0, "prefill/decode disaggregation: instances 0..P-1 prefill, the rest decode; "
                                        "0 = colocated", check=NOT_NEGATIVE)
    pd_min_uncached: int = setting(256, "fewer predicted uncached prompt tokens: run whole on a decode instance (no "
                                        "prefill stage)", check=NOT_NEGATIVE)
    # KV tiers as the engine's; the store is modelled (one shared by every instance), never contacted.
    tiers: TierConfig = section(TierConfig, only=("host_blocks", "kv_store", "kv_store_write", "kv_load_budget_bytes",
                                                  "kv_host_link", "kv_store_link"))
    policy_args: tuple[tuple[str, object], ...] = setting((), "policy parameter (e.g. tier_credit=fixed), given to "
                                                              "every policy that takes it", flag="policy-arg",
                                                          parse=parse_policy_arg, repeat=True, metavar="NAME=VALUE")
    # Admission by predicted TTFT (router/decision/admission.py, loadgen/sim/admission.py).
    admission_slo_s: float | None = setting(None, "admission by predicted TTFT at this SLO, as the router's "
                                                  "--slo-ttft-s (docs/admission.md)", flag="admission-slo",
                                            default_text="off")
    admission_margin: float = setting(-0.4, "as the router's --admission-margin")
    # (name, priority, weight) of each tenant: loadgen/sim/tenant_mix.py, from --tenant
    admission_tenants: tuple[tuple[str, int, float], ...] = setting((), "tenants", cli=False)
    # LoRA adapters every instance serves (requests name them: loadgen/adapters.py), in max_loras slots each
    adapters: tuple[str, ...] = setting((), "LoRA adapters every instance serves, the requests spread over them (as "
                                            "kvroute loadgen)", parse=parse_adapters, metavar="A,B,...")
    max_loras: int = setting(1, "adapter slots per engine, as kvroute engine", check=at_least(1))
    # Router replicas (loadgen/sim/replicas.py): several routers over the cluster, each admitting alone or
    # sharing admission; tenant_routers pins a tenant to one (--tenant's router=)
    routers: int = setting(1, "router replicas over the cluster, each its own policy, view and admission queue, "
                              "sharing one index (replicas.py)", check=Range(1, 64))
    admission_sync_s: float = setting(0.05, "--routers: shared admission synced this often, s; 0: each replica "
                                            "admits alone", flag="admission-sync", check=NOT_NEGATIVE)
    tenant_routers: tuple[tuple[str, int], ...] = setting((), "tenants' routers", cli=False)
    seed: int = setting(0, "seed of the workload, arrivals, policies and sampled tokens")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.prefill_instances and not self.prefill_instances < self.instances:
            raise ValueError(f"--prefill-instances must be 0 (colocated) or leave at least one of the "
                             f"{self.instances} instances for decode, got {self.prefill_instances}")
        self.admission()
        self.engine()
        if self.routers > 1 and self.prefill_instances:
            raise ValueError("--routers > 1 runs colocated instances only (no --prefill-instances)")
        if any(not 0 <= k < self.routers for _, k in self.tenant_routers):
            raise ValueError(f"a tenant's router= must name one of the {self.routers} --routers "
                             f"(0 to {self.routers - 1})")

    def admission(self) -> AdmissionSetup:
        return AdmissionSetup(config=AdmissionConfig(slo_ttft_s=self.admission_slo_s, margin=self.admission_margin),
                              tenants=self.admission_tenants)

    def engine(self) -> SimEngine:
        """The sections each simulated engine runs with (instance i's runner seeded `seed + i`)."""
        runner = dataclasses.replace(self.runner, seed=self.seed, lora_modules=self.adapters, max_loras=self.max_loras)
        return SimEngine(batch=self.batch, runner=runner, tiers=self.tiers)
