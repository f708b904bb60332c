"""Random: a uniformly random candidate.

Parameters: none (inject `rng: random.Random` for reproducible runs).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from kvroute.router.index.base import PrefixMatch
from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest


class RandomPolicy(PolicyBase):
    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        return Decision(instance=self.rng.choice(candidates).id, reason="uniform random")
