"""oracle_popularity: oracle_future knowing each block's popularity instead of when it is asked for again.

What a router that learns reuse from the past could reach at best where reuse follows a
fixed popularity: oracle_future (oracle_future.py) with its knowledge of the future cut
down to each block's request rate over the run,

    cost_i = oracle ttft_i + recompute_s x sum over the victims v on i of (1 - exp(-rate_v x T_i))

- the victims and T_i (how long blocks survive idle on i) exactly as oracle_future reads
  them from the block manager, which no router sees;
- rate_v: the workload's requests that hold v over the span of their send times, so
  1 - exp(-rate_v T_i) is the chance of a request for v within T_i if requests for it
  came as a Poisson stream at that rate: the popularity is known, the draws are not.

Where reuse follows a fixed popularity (the suite's pressure rows), kv_aware's distance to
it is about what a better learned popularity could buy, and its distance to oracle_future
what knowing which requests come next buys, which no past holds; where reuse follows
conversations (mooncake) popularity is no guide. A reference, not a bound: like
oracle_future it decides one request at a time (docs/loadgen.md, "Where kv_aware trails
oracle_future").
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from kvroute.loadgen.sim.cluster import Cluster
from kvroute.loadgen.sim.oracle_future import FutureOraclePolicy, FutureUses, future_uses
from kvroute.loadgen.workload_base import RequestSpec


class PopularityOraclePolicy(FutureOraclePolicy):
    label = "oracle_popularity"

    def __init__(self, cluster: Cluster, future: FutureUses, *, rng: random.Random | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(cluster, future, rng=rng, clock=clock)
        self.per_s = 1.0 / future.span_s if future.span_s > 0 else 0.0

    def wanted(self, block_hash: int, now: float, survive_s: float) -> float:
        """The chance of a request for the block within `survive_s`, from its rate over the run."""
        return 1.0 - math.exp(-self.future.requests_holding(block_hash) * self.per_s * survive_s)


def make_popularity_oracle(cluster: Cluster, rng: random.Random | None = None,
                           clock: Callable[[], float] | None = None, specs: Sequence[RequestSpec] = (),
                           starts: Sequence[tuple[float, RequestSpec]] = ()) -> PopularityOraclePolicy:
    return PopularityOraclePolicy(cluster, future_uses(cluster, specs, starts), rng=rng, clock=clock)
