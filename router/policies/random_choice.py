"""Random: a uniformly random candidate.

Parameters: none (inject `rng: random.Random` for reproducible runs).
"""

from __future__ import annotations

import random
from typing import Callable, Mapping, Sequence

from router.index.base import PrefixMatch
from router.policies.base import Decision, InstanceState, PolicyBase, RouteRequest


class RandomPolicy(PolicyBase):
    config_class = None

    def __init__(self, *, rng: random.Random | None = None, clock: Callable[[], float] | None = None) -> None:
        self.rng = rng or random.Random()

    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        return Decision(self.rng.choice(candidates).id, reason="uniform random")
