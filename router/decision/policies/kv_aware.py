"""KV-aware (the default): what a placement costs this request and what it costs the others.

For each candidate i, in seconds (tokens divided by the learned prefill rate, tokens/s):

    uncached_i = max(num_tokens - credited_blocks_i * block_size, 0)
    wait_i     = queued_prefill_tokens_i / rate + decode_weight_s * max(running_i + waiting_i, inflight_i)
    prefill_i  = uncached_i / rate                                   } the request's own TTFT
    compute_i  = compute_weight * uncached_i / rate                  } what it costs the others:
    evict_i    = evict_weight * lost_blocks_i * block_size / rate    } prefill added to i's queue,
    cost_i     = wait_i + prefill_i + compute_i + evict_i            } cached blocks it evicts there

(`Decision.terms` holds the four parts, base.COST_TERMS; /router/explain shows them.)

Credit. `credits()` weighs the index's consecutive cached prefix by tier
(scoring/tier_credit.py): a device block counts `device_credit`; a host or remote block counts
the compute it saves minus the time to load it, from the bandwidth and latency the
instance advertises (blocks in a shared store count for every instance with that
store); an instance that advertises nothing, or every instance with
tier_credit="fixed", gets `host_credit` / `remote_credit` per block. Blocks recently
routed to i and not yet reported by its KV events (*pending*, kept `pending_ttl_s`)
count as device blocks; i gets the larger of the two credits. A candidate with
`cache_ok=False` gets no credit. The cost formula only reads the credits, so how
blocks are credited can change without touching it.

Rate. One fleet-wide rate by default (`per_instance_rate` for unequal fleets), learned
online from `on_first_token` (rate.py), starting at `prefill_rate`.

Compute. The prefill this request adds to i is waited for by every request sent there
after it: without this term a burst of siblings scatters (on an instance already
prefilling their shared prefix a sibling waits for that prefill, so by TTFT alone any
idle instance looks as good); with compute_weight=1 a sibling follows the first one when
its own suffix is shorter than the shared prefix.

Evictions. Where the KV pools are full every placement evicts somebody, and the cost of
that falls on later requests. Engines report in GET /load (router/contract/protocol.py) their
free blocks and their evictable ones as (blocks, idle seconds) in eviction order;
`lost_blocks_i` is the expected number of blocks this request's `ceil(uncached_i /
block_size)` fresh blocks evict on i (after the blocks already queued there) that would
have been used again, each weighted by reuse(idle): the chance that a block idle that
long is asked for again, learned from the router's own hit history (scoring/eviction.py,
scoring/reuse.py: a SHARDS-style sample of the blocks its requests touch, `reuse_sample`, over
`reuse_window_s`, half-life `reuse_halflife_s`). So a new prefix goes where it evicts
the least valuable blocks: free blocks first, then blocks idle so long they are dead,
never a pool full of hot ones. An engine that reports no profile costs nothing here.

Near-ties. Costs within `tie_tolerance` (relative) of the lowest, crediting the same
blocks (within one), count as a tie -- learned rates differ by noise, and an idle fleet
scores a new prefix alike everywhere -- and a tie goes to the instance sent the fewest
requests lately (a count decaying with half-life `share_halflife_s`), then at random:
new prefixes spread evenly, and a tie never turns a hit into a copy.

Replication on purpose (scoring/replication.py). A copy of a prefix on another instance pays off
over the requests that follow, which no single request's cost sees. Per prefix the
policy keeps its recent demand and the time-averaged extra wait its requests see on its
holders (over the other instances' mean wait), and copies it onto the cheapest
non-holder when that wait, times the requests the next `replicate_halflife_s` should
bring, times the new holder's share, exceeds the copy's whole cost difference (its
prefill, the compute added there, what it evicts there), scaled by `replicate_weight`
(0: never copy on purpose). A burst of siblings at one instant adds no time to the
average, so it does not trigger copies; a queue that lasts does.

Hot-spot guard (scoring/hot_spot.py): load balancing of last resort for an instance hot without
a single hot prefix (many sticky sessions). When the winner has at least
`hot_min_inflight` requests in flight and more than `hot_factor` times the mean inflight
of the other candidates, and a less loaded candidate's cost is within `hot_tolerance_s`,
the request goes to the cheapest such candidate instead. `Decision.reason` says which
rule decided.

Parameters (keywords; defaults in `KvAwareConfig`):
    prefill_rate           initial prefill rate, tokens/s (10000)
    rate_alpha             EWMA weight (in log space) of one TTFT observation (0.2)
    min_prefill_rate, max_prefill_rate   clamp on rate samples, tokens/s (50, 5e6)
    min_rate_sample_tokens ignore observations with less prefill work (512 tokens: a short
                           prefill's TTFT is mostly fixed overhead and would read as a slow rate)
    per_instance_rate      learn one rate per instance instead of one for the fleet (False)
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
    evict_weight           weight of the evicted blocks' expected recompute (1.0; 0: ignore evictions)
    adapter_load_s         added to wait_i when the request's LoRA adapter is not resident on i and i
                           reports its adapters (vLLM's lora_requests_info, a load record's
                           `adapters`/`adapter_slots`): requests for an adapter go where it is
                           loaded and cached unless load says otherwise (0.05 s)
    replicate_weight       weight of a copy's expected benefit (1.0; 0: no replication on purpose)
    replicate_halflife_s   half-life of a prefix's demand and wait, and the copy's payback horizon (10 s)
    reuse_sample           the reuse history follows blocks whose hash is divisible by this (8)
    reuse_window_s         a block unused this long counts as never reused (600 s)
    reuse_halflife_s       half-life of the reuse history (300 s)
    pending_ttl_s          how long routed blocks count as cached there (2.0 s)
    pending_capacity       most pending block entries kept (200000)

`select` has no side effects; `on_routed(request, instance)` records the pending blocks,
the reuse history, the prefix's demand and the queue at dispatch, which
`on_first_token` adds to the sample's work (matched by `request.request_id`; without
one, the queue ahead counts as 0).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from kvroute.router.contract.tier_costs import TierCosts
from kvroute.router.decision.base import InstanceState, RouteRequest
from kvroute.router.decision.scoring.kv_cost import KvCostConfig, KvCostPolicy
from kvroute.router.decision.scoring.recent import RecentBlocks
from kvroute.router.decision.scoring.tier_credit import tier_credit, with_store
from kvroute.router.index.base import PrefixMatch

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
        # per candidate of the last select, what its credit came from (for /router/explain)
        self._detail: dict[str, tuple[dict, TierCosts | None, float]] = {}
        self._measured = config.tier_credit == "measured"

    def credits(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> dict[str, float]:
        pending = self.recent.match(request.block_hashes, self.clock())
        device, fallback = self.config.device_credit, self._tier_credit
        device_fallback = fallback["device"]
        measured, bs = self._measured, request.block_size
        out: dict[str, float] = {}
        self._detail = detail = {}
        get_match, get_pending, rate_of = matches.get, pending.get, self.rates.get
        for c in candidates:
            if not c.cache_ok:
                continue
            cid, costs = c.id, c.tier_costs
            match = get_match(cid)
            credit = get_pending(cid, 0) * device
            if match is not None or (costs is not None and costs.store):  # else nothing indexed to credit
                by_tier = with_store(match, matches, costs)
                if by_tier:
                    per_block = bs / rate_of(cid)
                    detail[cid] = (by_tier, costs, per_block)
                    if len(by_tier) == 1 and "device" in by_tier:  # what tier_credit gives, without its detail
                        indexed = by_tier["device"] * device_fallback
                    else:
                        indexed = tier_credit(by_tier, costs, per_block, fallback, measured).credit
                    if indexed > credit:
                        credit = indexed
            if credit:
                out[cid] = credit
        return out

    def credit_detail(self, instance: str) -> dict:
        detail = self._detail.get(instance)
        if detail is None:
            return {}
        by_tier, costs, per_block = detail
        tc = tier_credit(by_tier, costs, per_block, self._tier_credit, self._measured)
        return {"credited_blocks": tc.credit, "time_saved_s_by_tier": dict(tc.saved_s_by_tier)}
