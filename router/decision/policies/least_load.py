"""Least load: the candidate with the fewest requests in flight.

Load is compared as the tuple `(inflight, running + waiting)`: `inflight` (requests
this router has sent there and not finished) is exact and current, so it decides;
the engine-reported `running + waiting` (polled, possibly stale, and including other
routers' traffic) breaks ties. Candidates still tied are chosen between at random.
`Decision.costs` holds each candidate's inflight count.

Parameters: none (inject `rng: random.Random` for reproducible tie-breaks).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.index.base import PrefixMatch


def load_key(c: InstanceState) -> tuple[int, int]:
    """Lower is less loaded: router inflight first, engine-reported queue as tie-break."""
    return (c.inflight, c.running + c.waiting)


def least_loaded(candidates: Sequence[InstanceState], rng: random.Random) -> InstanceState:
    best = min(load_key(c) for c in candidates)
    return rng.choice([c for c in candidates if load_key(c) == best])


class LeastLoadPolicy(PolicyBase):
    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        chosen = least_loaded(candidates, self.rng)
        costs = {c.id: float(c.inflight) for c in candidates}
        return Decision(instance=chosen.id, costs=costs, reason=f"least load (inflight {chosen.inflight})")
