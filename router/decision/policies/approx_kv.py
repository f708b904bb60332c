"""Approximate KV-aware: kv_aware's cost model for engines that report no KV events.

With no events there is no index (`uses_index = False`; `matches` is ignored), so the
policy learns its own from its decisions: every routed prompt's block chain is recorded
against the chosen instance in a `RecentBlocks` table for `learned_ttl_s`, and a new
request's credited blocks on an instance are the leading blocks of its chain that
were routed there within that time, counted as device blocks (`device_credit`; the
table knows no tiers, so `host_credit` and `remote_credit` go unused). After the TTL
the policy assumes the engine has evicted them. Everything else -- the cost of a
placement (own TTFT, compute and evictions for others: engines without events still
report load), the online prefill rate, replication, the hot-spot guard, near-ties broken
by recent load, `cache_ok=False` getting no credit -- is kv_aware's; see `kv_aware.py`
for the formula and those parameters.

Parameters besides kv_aware's cost-model and guard parameters:
    learned_ttl_s       how long a routed block is assumed cached there (default 120 s)
    learned_capacity    most block entries remembered, least recently routed dropped
                        first (default 200000; about 330 bytes each, so ~65 MB full)
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from kvroute.router.decision.base import InstanceState, RouteRequest
from kvroute.router.decision.scoring.kv_cost import KvCostConfig, KvCostPolicy
from kvroute.router.decision.scoring.recent import RecentBlocks
from kvroute.router.index.base import PrefixMatch


@dataclasses.dataclass(frozen=True, slots=True)
class ApproxKvConfig(KvCostConfig):
    learned_ttl_s: float = 120.0
    learned_capacity: int = 200_000

    def __post_init__(self) -> None:
        KvCostConfig.__post_init__(self)  # zero-argument super() does not work in slots dataclasses
        if self.learned_ttl_s <= 0 or self.learned_capacity < 1:
            raise ValueError(
                f"learned_ttl_s must be positive and learned_capacity at least 1, "
                f"got {self.learned_ttl_s} and {self.learned_capacity}"
            )


class ApproxKvPolicy(KvCostPolicy):
    config_class = ApproxKvConfig
    uses_index = False

    def __init__(
        self,
        config: ApproxKvConfig | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        **params,
    ) -> None:
        config = config or ApproxKvConfig(**params)
        super().__init__(config, RecentBlocks(config.learned_ttl_s, config.learned_capacity), rng, clock)

    def credits(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> dict[str, float]:
        learned = self.recent.match(request.block_hashes, self.clock())
        device = self.config.device_credit
        return {c.id: learned[c.id] * device for c in candidates if c.cache_ok and c.id in learned}
