"""The chaos scenarios, run in this order; one registry (name -> scenario)."""

from __future__ import annotations

from loadgen.chaos.scenarios.boundaries import EngineHangWhole, HandleReplay, IntrospectionAuth, RogueRegistry, SlowClients
from loadgen.chaos.scenarios.engine_faults import ENGINE_HANG, ENGINE_KILL
from loadgen.chaos.scenarios.feeds import FeedFlood, FeedPoison
from loadgen.chaos.scenarios.fuzzing import Fuzz
from loadgen.chaos.scenarios.redis_faults import REDIS_FREEZE, REDIS_KILL
from loadgen.chaos.scenarios.router_restart import RouterRestart
from loadgen.chaos.scenarios.streams import ManyStreams

SCENARIOS = {s.name: s for s in (Fuzz(), ENGINE_KILL, ENGINE_HANG, REDIS_KILL, REDIS_FREEZE, ManyStreams(),
                                 RouterRestart(), FeedPoison(), FeedFlood(), SlowClients(), IntrospectionAuth(),
                                 RogueRegistry(), EngineHangWhole(), HandleReplay())}
