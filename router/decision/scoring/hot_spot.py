"""The hot-spot guard: load balancing of last resort for an instance far busier than the rest.

Replication (replication.py) copies a hot *prefix*; an instance can also be hot with
no single hot prefix, from many sticky sessions that happened to land on it (each
session's next turn is cheapest where its history is cached). So when the cheapest
candidate is *hot* -- at least `hot_min_inflight` requests in flight and more than
`hot_factor` times the mean inflight of the other candidates -- and a less loaded
candidate's cost is within `hot_tolerance_s` of it, the request goes to the cheapest
such candidate instead. Hotness is read from inflight, not queued prefill work (cache
hits keep a holder's prefill queue short while its decode load grows), against the
*other* candidates' mean: a factor f over a mean that includes the hot instance can
never be exceeded with f or fewer instances. 2.0 is well beyond the spread of an
evenly loaded fleet, so the guard stays quiet there; the tolerance caps what one
spill may cost.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from kvroute.router.decision.base import InstanceState


def spill_target(best: InstanceState, candidates: Sequence[InstanceState], costs: Mapping[str, float],
                 hot_factor: float, hot_min_inflight: int, hot_tolerance_s: float,
                 rng: random.Random) -> InstanceState | None:
    """The cooler candidate to send the request to instead of a hot `best`, or None."""
    if len(candidates) < 2 or best.inflight < hot_min_inflight:
        return None
    if best.inflight <= hot_factor * others_mean(best, candidates):
        return None
    cooler = [c for c in candidates if c.inflight < best.inflight]
    if not cooler:
        return None
    cheapest = min(costs[c.id] for c in cooler)
    if cheapest - costs[best.id] > hot_tolerance_s:
        return None
    return rng.choice([c for c in cooler if costs[c.id] == cheapest])


def others_mean(best: InstanceState, candidates: Sequence[InstanceState]) -> float:
    return (sum(c.inflight for c in candidates) - best.inflight) / (len(candidates) - 1)
