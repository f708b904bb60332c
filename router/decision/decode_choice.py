"""Which decode engine takes a prefilled request: one rule for the router and the simulator.

While the fleet is disaggregated, "both" engines (e.g. halfway through the planner's role
changes) take what decode engines take: decode stages and whole short requests. Among them
the least decode load wins: the most of the router's in-flight count and the engine's own
running + waiting, then KV usage; ties at random.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

from router.contract.protocol import LoadRecord

DECODE_ROLES = ("decode", "both")

T = TypeVar("T")


def decode_load(inflight: int, load: LoadRecord | None) -> tuple[int, float]:
    engine = (load.running + load.waiting) if load else 0
    return max(inflight, engine), load.kv_usage if load else 0.0


def pick_decode(candidates: Sequence[T], load_of: Callable[[T], tuple[int, float]], rng: random.Random) -> T:
    """The candidate with the least `load_of` (a `decode_load`), at random among ties."""
    loads = [load_of(c) for c in candidates]
    best = min(loads)
    return rng.choice([c for c, load in zip(candidates, loads) if load == best])
