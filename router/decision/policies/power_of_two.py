"""Power of two choices: sample two distinct candidates at random, take the less loaded.

Load is `least_load.load_key` (router inflight, then engine running + waiting); a tie
between the two is broken at random. With one candidate, that one. Nearly as even as
least load, without herding every router replica onto the same idle instance.
`Decision.costs` holds the two sampled candidates' inflight counts.

Parameters: none (inject `rng: random.Random` for reproducible runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.decision.policies.least_load import least_loaded
from kvroute.router.index.base import PrefixMatch


class PowerOfTwoPolicy(PolicyBase):
    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        pair = self.rng.sample(list(candidates), 2) if len(candidates) > 1 else list(candidates)
        chosen = least_loaded(pair, self.rng)
        costs = {c.id: float(c.inflight) for c in pair}
        return Decision(instance=chosen.id, costs=costs, reason=f"less loaded of {' and '.join(c.id for c in pair)}")
