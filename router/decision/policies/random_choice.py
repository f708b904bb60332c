"""Random: a uniformly random candidate.

Parameters: none (inject `rng: random.Random` for reproducible runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.index.base import PrefixMatch


class RandomPolicy(PolicyBase):
    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        return Decision(instance=self.rng.choice(candidates).id, reason="uniform random")
