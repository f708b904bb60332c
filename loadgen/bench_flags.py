"""`kvroute bench`'s own flags (and `kvroute demo`'s, which runs bench), declared once
(router/contract/settings.py); the workload and load flags are loadgen's (loadgen/load_flags.py).
A sizing flag left unset takes the figure for the backend (and --quick) from loadgen/bench.py."""

from __future__ import annotations

import dataclasses

from kvroute.loadgen.bench_tiers import TIER_RUNS
from kvroute.router.contract.constraints import at_least
from kvroute.router.contract.settings import setting

BACKENDS = ("sim", "torch")
DEFAULT_POLICIES = "round_robin,least_load,prefix_hash,kv_aware"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchFlags:
    """local cluster and comparison"""

    quick: bool = setting(False, "a smaller run (under 2 minutes with sim engines)")
    backend: str = setting("sim", "engine backend of the local cluster", choices=BACKENDS)
    engines: int | None = setting(None, "engines in the local cluster", check=at_least(1),
                                  default_text="8 sim or 4 torch; --pd 2; --tiers 4")
    policies: str = setting(DEFAULT_POLICIES, "comma-separated router policies")
    extra_target: tuple[str, ...] = setting((), "another OpenAI endpoint to run the same workload against",
                                            metavar="NAME=URL")
    num_blocks: int | None = setting(None, "KV blocks per engine", check=at_least(2),
                                     default_text="1024 sim, 512 torch; --pd 2048; --tiers 512")
    engine_arg: tuple[str, ...] = setting((), "extra flag passed to every engine (--engine-arg=--time-scale=0.1)",
                                          metavar="ARG")
    router_arg: tuple[str, ...] = setting((), "extra flag passed to the router", metavar="ARG")
    pd: bool = setting(False, "compare colocated engines against prefill + decode engines (same engines, workload)")
    prefill_engines: int | None = setting(None, "with --pd: prefill engines", check=at_least(1),
                                          default_text="half the engines")
    tiers: bool = setting(False, "the session-recovery storm on the same engines: device only, + host pool, + host + "
                                 "Redis store, + host + file store")
    host_blocks: int | None = setting(None, "with --tiers: host pool blocks per engine", check=at_least(1),
                                      default_text="4096")
    tier_runs: str = setting(",".join(TIER_RUNS), "with --tiers: the setups to run, device first (the reference of "
                                                  "the output comparison)")
    max_loras: int | None = setting(None, "with --adapters: each engine's adapter slots", check=at_least(1),
                                    default_text="all of them")
    out: str = setting("kvroute-bench", "output directory", metavar="DIR")
