"""Which roles serve a request, and which decode engine takes a prefilled one: one rule for the
router and the simulator.

A fleet is disaggregated while it has prefill engines and decode (or "both") engines: a request's
prefill runs on a prefill engine, its decode on a decode one. Otherwise requests run whole, on
"both" engines when there are any, else on every engine (`colocated_roles`). While the fleet is
disaggregated, "both" engines (e.g. halfway through the planner's role changes) take what decode
engines take: decode stages and whole short requests. Among them the least decode load wins: the
most of the router's in-flight count and the engine's own running + waiting, then KV usage; ties
at random.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection

from kvroute.router.decision.route import M, Members

DECODE_ROLES = ("decode", "both")
PREFILL_ROLES = ("prefill",)
COLOCATED_ROLES = ("both",)  # whole requests, when the fleet is not disaggregated and has any
Present = Callable[[tuple[str, ...]], bool]  # whether any engine (of the model) that takes work is in these roles


def disaggregated(present: Present) -> bool:
    """Requests are split into a prefill and a decode stage: prefill and decode engines are both there."""
    return present(PREFILL_ROLES) and present(DECODE_ROLES)


def colocated_roles(present: Present) -> tuple[str, ...] | None:
    """The roles that serve whole requests when the fleet is not disaggregated: "both" engines when
    there are any, else every engine (None)."""
    return COLOCATED_ROLES if present(COLOCATED_ROLES) else None


def pick_decode_member(decodes: Members[M], rng: random.Random, exclude: Collection[str] = ()) -> M | None:
    """The member of `decodes` (a router/decision/route.py `Members`) with the least decode load,
    read from its `InstanceState`; at random among ties. Members named in `exclude` (tried already)
    are not chosen; None when no other is left."""
    states = [s for s in decodes.states(decodes.members) if s.id not in exclude]
    if not states:
        return None
    loads = [(s.inflight if s.inflight > s.running + s.waiting else s.running + s.waiting, s.kv_usage)
             for s in states]
    best = min(loads)
    by_id = decodes.by_id
    return rng.choice([by_id[s.id] for s, load in zip(states, loads) if load == best])
