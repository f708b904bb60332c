"""The chaos scenarios, run in this order; one registry (name -> scenario)."""

from __future__ import annotations

from kvroute.loadgen.chaos.config import ChaosConfig
from kvroute.loadgen.chaos.scenarios.boundaries import (
    EngineHangWhole,
    HandleReplay,
    IntrospectionAuth,
    RogueRegistry,
    SlowClients,
)
from kvroute.loadgen.chaos.scenarios.connections import FrontCases, StalledBodies, Upgrades
from kvroute.loadgen.chaos.scenarios.engine_faults import ENGINE_HANG, ENGINE_KILL
from kvroute.loadgen.chaos.scenarios.feeds import FeedFlood, FeedPoison
from kvroute.loadgen.chaos.scenarios.fuzzing import Fuzz
from kvroute.loadgen.chaos.scenarios.pd_decode_kill import PdDecodeKill
from kvroute.loadgen.chaos.scenarios.progress import EngineStuckStep, RegistryReplay
from kvroute.loadgen.chaos.scenarios.redis_faults import REDIS_FREEZE, REDIS_KILL
from kvroute.loadgen.chaos.scenarios.request_limits import (
    KeyBoundTenant,
    PoisonedBodies,
    SloHeader,
    TenantLimits,
    TokenizerFlood,
)
from kvroute.loadgen.chaos.scenarios.router_restart import RouterRestart
from kvroute.loadgen.chaos.scenarios.streams import ManyStreams
from kvroute.router.contract.settings import did_you_mean

SCENARIOS = {s.name: s for s in (Fuzz(), ENGINE_KILL, ENGINE_HANG, REDIS_KILL, REDIS_FREEZE, ManyStreams(),
                                 RouterRestart(), FeedPoison(), FeedFlood(), SlowClients(), IntrospectionAuth(),
                                 RogueRegistry(), EngineHangWhole(), HandleReplay(), EngineStuckStep(),
                                 RegistryReplay(), PoisonedBodies(), SloHeader(), TenantLimits(), KeyBoundTenant(),
                                 PdDecodeKill(), TokenizerFlood(), StalledBodies(), Upgrades(), FrontCases())}
QUICK_SCENARIOS = ("fuzz", "engine-kill")


def chosen(config: ChaosConfig) -> tuple[str, ...]:
    """The scenarios `config` runs, in order; ValueError for an unknown one or a fleet that cannot run one."""
    names = config.scenarios or (QUICK_SCENARIOS if config.quick else tuple(SCENARIOS))
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}{did_you_mean(unknown[0], SCENARIOS)}; "
                         f"choose from {', '.join(SCENARIOS)}")
    if "router-restart" in names and config.routers < 2:
        raise ValueError("the router-restart scenario needs --routers 2 or more (one keeps serving)")
    return names
