"""KV-aware (the default): the candidate with the lowest predicted time to first token.

For each candidate i, in seconds (tokens divided by tokens/s):

    uncached_i = max(num_tokens - credited_blocks_i * block_size, 0)
    ttft_i     = (queued_prefill_tokens_i + uncached_i) / rate_i
                 + decode_weight_s * max(running_i + waiting_i, inflight_i)
    cost_i     = ttft_i + compute_weight * uncached_i / rate_i

`credited_blocks_i` weighs the index's consecutive cached prefix by tier
(tier_credit.py): a device block counts `device_credit`; a host or remote block
counts the compute it saves minus the time to load it, from the bandwidth and
latency the instance advertises (blocks in a shared store count for every instance
with that store); an instance that advertises nothing, or every instance with
tier_credit="fixed", gets `host_credit` / `remote_credit` per block. Blocks recently
routed to i and not yet reported by its KV events (*pending*, kept `pending_ttl_s`)
count as device blocks; i gets the larger of the two credits. A candidate with
`cache_ok=False` gets no credit. `rate_i` is the prefill rate, learned online from
`on_first_token` (see `rate.py`; one for the fleet unless `per_instance_rate`),
starting at `prefill_rate`. The decode term charges
decode interleaving and queueing per sequence there (the router's own `inflight`
stands in when the engine's report is stale). The last term charges the prefill this
request adds to i, which every request sent there after it waits for: without it a
burst of siblings scatters (on an instance already prefilling their shared prefix a
sibling waits for that prefill, so by TTFT alone any idle instance looks as good);
with compute_weight=1 a sibling follows the first one when its own suffix is shorter
than the shared prefix. compute_weight=0 makes the cost the bare TTFT prediction.
The lowest cost wins. Costs within `tie_tolerance` (relative) of the lowest count as
a tie -- learned rates differ by noise, and an idle fleet scores a new prefix alike
everywhere -- and a tie goes to the instance sent the fewest requests lately (a count
decaying with half-life `share_halflife_s`), then at random: the load a prefix brings
follows it, so new prefixes spread evenly instead of piling onto one instance. `Decision.costs` holds every
cost, `Decision.uncached_tokens` the chosen candidate's predicted uncached tokens.

Hot-spot guard. Cost alone lets one dominant shared prefix pile every request onto
its holder. So when the winner is *hot* -- at least `hot_min_inflight` requests in
flight and more than `hot_factor` times the mean inflight of the other candidates --
and a less loaded candidate's cost is within `hot_tolerance_s` of the winner's, the
request goes to the cheapest such candidate instead; it then caches the prefix
(credited at once as pending blocks) and later siblings split between the two
holders by cost. Hotness is read from inflight, not queued prefill work: cache hits
keep a holder's prefill queue short while its decode load grows. It is measured
against the *other* candidates' mean because a factor f over a mean that includes
the hot instance can never be exceeded with f or fewer instances; 2.0 is well beyond
the spread of an evenly loaded fleet, so the guard stays quiet there, and the
tolerance caps what one spill may cost.
`Decision.reason` says when the guard fired.

Parameters (keywords; defaults in `KvAwareConfig`):
    prefill_rate           initial prefill rate, tokens/s (10000)
    rate_alpha             EWMA weight of one TTFT observation (0.2)
    min_prefill_rate, max_prefill_rate   clamp on rate samples, tokens/s (50, 5e6)
    min_rate_sample_tokens ignore observations with less prefill work (512 tokens: a short
                           prefill's TTFT is mostly fixed overhead and would read as a slow rate)
    per_instance_rate      learn one rate per instance instead of one for the fleet (False;
                           set it for fleets of unequal engines, see rate.py)
    decode_weight_s        seconds per running/waiting sequence (0.002)
    compute_weight         weight of the prefill compute a request adds (1.0)
    device_credit, host_credit, remote_credit   fraction of a cached block's
                           compute saved, per tier (1.0, 0.8, 0.5); host/remote only for
                           instances that advertise no tier figures, or with tier_credit="fixed"
    tier_credit            "measured" (default: by advertised load time) or "fixed"
    hot_factor             guard: inflight over the others' mean to be hot (2.0)
    hot_min_inflight       guard: below this inflight never hot (4)
    hot_tolerance_s        guard: most extra cost a spill may take, seconds (0.5)
    tie_tolerance          relative cost difference treated as a tie (0.05)
    share_halflife_s       half-life of the recent-requests count that breaks ties (30 s)
    pending_ttl_s          how long routed blocks count as cached there (2.0 s)
    pending_capacity       most pending block entries kept (200000)

`select` has no side effects; `on_routed(request, instance)` records the pending
blocks and the queue at dispatch, which `on_first_token` adds to the sample's work
(matched by `request.request_id`; without one, the queue ahead counts as 0).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Mapping, Sequence

from router.index.base import PrefixMatch
from router.policies.base import InstanceState, RouteRequest
from router.policies.kv_cost import KvCostConfig, KvCostPolicy
from router.policies.recent import RecentBlocks
from router.policies.tier_credit import TierCredit, tier_credit, with_store


TIER_CREDITS = ("measured", "fixed")


@dataclasses.dataclass(frozen=True, slots=True)
class KvAwareConfig(KvCostConfig):
    pending_ttl_s: float = 2.0
    pending_capacity: int = 200_000
    tier_credit: str = "measured"  # "fixed": host_credit / remote_credit for every instance (tier_credit.py)

    def __post_init__(self) -> None:
        KvCostConfig.__post_init__(self)  # zero-argument super() does not work in slots dataclasses
        if self.tier_credit not in TIER_CREDITS:
            raise ValueError(f"tier_credit must be one of {', '.join(TIER_CREDITS)}, got {self.tier_credit!r}")
        if self.pending_ttl_s <= 0 or self.pending_capacity < 1:
            raise ValueError(
                f"pending_ttl_s must be positive and pending_capacity at least 1, "
                f"got {self.pending_ttl_s} and {self.pending_capacity}"
            )


class KvAwarePolicy(KvCostPolicy):
    config_class = KvAwareConfig
    uses_index = True

    def __init__(
        self,
        config: KvAwareConfig | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        **params,
    ) -> None:
        config = config or KvAwareConfig(**params)
        super().__init__(config, RecentBlocks(config.pending_ttl_s, config.pending_capacity), rng, clock)
        self._detail: dict[str, TierCredit] = {}  # per candidate of the last select, for /router/explain

    def credits(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> dict[str, float]:
        pending = self.recent.match(request.block_hashes, self.clock())
        device, fallback = self.config.device_credit, self._tier_credit
        measured, bs = self.config.tier_credit == "measured", request.block_size
        out: dict[str, float] = {}
        self._detail = {}
        for c in candidates:
            if not c.cache_ok:
                continue
            credit = pending.get(c.id, 0) * device
            by_tier = with_store(matches.get(c.id), matches, c.tier_costs)
            if by_tier:
                tc = tier_credit(by_tier, c.tier_costs, bs / self.rates.get(c.id), fallback, measured)
                self._detail[c.id] = tc
                credit = max(credit, tc.credit)
            if credit:
                out[c.id] = credit
        return out

    def credit_detail(self, instance: str) -> dict:
        tc = self._detail.get(instance)
        if tc is None:
            return {}
        return {"credited_blocks": tc.credit, "time_saved_s_by_tier": dict(tc.saved_s_by_tier)}
