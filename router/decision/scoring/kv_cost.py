"""The cost model shared by kv_aware and approx_kv: what a placement costs the request and the others.

They differ only in where a candidate's cached blocks come from (`credits`, which a
subclass supplies). The formula and every parameter are explained in kv_aware.py;
the parts live in rate.py (learned prefill rate), eviction.py and reuse.py (what a
placement evicts and how likely that was to be used again), replication.py (copying
a hot prefix on purpose) and hot_spot.py (load balancing of last resort).
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.decision.scoring.eviction import expected_loss
from kvroute.router.decision.scoring.hot_spot import others_mean, spill_target
from kvroute.router.decision.scoring.rate import PrefillRate, RateConfig
from kvroute.router.decision.scoring.recent import RecentBlocks
from kvroute.router.decision.scoring.replication import Copy, PrefixDemand, consider
from kvroute.router.decision.scoring.reuse import ReuseHistory
from kvroute.router.index.base import PrefixMatch

_MAX_DISPATCHED = 65536  # request ids whose queue-at-dispatch is remembered until first token


@dataclasses.dataclass(frozen=True, slots=True)
class KvCostConfig:
    """The cost model, replication and hot-spot guard shared by kv_aware and approx_kv."""

    prefill_rate: float = 10_000.0
    rate_alpha: float = 0.2
    min_prefill_rate: float = 50.0
    max_prefill_rate: float = 5_000_000.0
    min_rate_sample_tokens: int = 512
    per_instance_rate: bool = False
    decode_weight_s: float = 0.002
    compute_weight: float = 1.0
    device_credit: float = 1.0
    host_credit: float = 0.8
    remote_credit: float = 0.5
    hot_factor: float = 2.0
    hot_min_inflight: int = 4
    hot_tolerance_s: float = 0.5
    tie_tolerance: float = 0.05
    share_halflife_s: float = 30.0
    evict_weight: float = 1.0
    replicate_weight: float = 1.0
    replicate_halflife_s: float = 10.0
    reuse_sample: int = 8
    reuse_window_s: float = 600.0
    reuse_halflife_s: float = 300.0
    adapter_load_s: float = 0.05  # waiting for a LoRA adapter to load where it is not resident

    def __post_init__(self) -> None:
        self.rate_config()  # validates the rate fields
        self.reuse_history()  # validates the reuse fields
        if not 0 <= self.tie_tolerance < 1 or self.share_halflife_s <= 0:
            raise ValueError(f"tie_tolerance must be in [0, 1) and share_halflife_s positive, "
                             f"got {self.tie_tolerance} and {self.share_halflife_s}")
        for name in ("device_credit", "host_credit", "remote_credit"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a fraction of a block's compute, in [0, 1]; got {getattr(self, name)}")
        weights = ("decode_weight_s", "compute_weight", "hot_tolerance_s", "evict_weight", "replicate_weight")
        if min(getattr(self, name) for name in weights) < 0:
            raise ValueError(f"{', '.join(weights)} cannot be negative")
        if self.hot_factor < 1 or self.hot_min_inflight < 1:
            raise ValueError(
                f"hot_factor must be >= 1 and hot_min_inflight >= 1, got {self.hot_factor} and {self.hot_min_inflight}"
            )
        if self.adapter_load_s < 0:
            raise ValueError(f"adapter_load_s cannot be negative, got {self.adapter_load_s}")
        if self.replicate_halflife_s <= 0:
            raise ValueError(f"replicate_halflife_s must be positive, got {self.replicate_halflife_s}")

    def rate_config(self) -> RateConfig:
        return RateConfig(
            initial=self.prefill_rate,
            alpha=self.rate_alpha,
            min_rate=self.min_prefill_rate,
            max_rate=self.max_prefill_rate,
            min_sample_tokens=self.min_rate_sample_tokens,
            per_instance=self.per_instance_rate,
        )

    def reuse_history(self) -> ReuseHistory:
        return ReuseHistory(self.reuse_sample, self.reuse_window_s, self.reuse_halflife_s)


class KvCostPolicy(PolicyBase):
    """Scores by the cost model from per-candidate credited blocks; subclasses supply the credits."""

    def __init__(
        self,
        config: KvCostConfig,
        recent: RecentBlocks,
        rng: random.Random | None,
        clock: Callable[[], float] | None,
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.config = config
        self.recent = recent
        self.rates = PrefillRate(config.rate_config())
        self.reuse = config.reuse_history()
        self.demand = PrefixDemand(config.replicate_halflife_s)
        self._tier_credit = {"device": config.device_credit, "host": config.host_credit, "remote": config.remote_credit}
        self._last: tuple[RouteRequest, Sequence[InstanceState], Copy | None] | None = None
        self._dispatched: OrderedDict[str, int] = OrderedDict()
        self._routed: dict[str, tuple[float, float]] = {}  # instance -> (decayed request count, as of)

    def credits(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> dict[str, float]:
        raise NotImplementedError

    def score(self, request: RouteRequest, candidates: Sequence[InstanceState], credits: Mapping[str, float],
              now: float) -> tuple[dict[str, float], dict[str, tuple[float, float, float, float]]]:
        """Per candidate, the cost and its terms (base.COST_TERMS): wait, own prefill, prefill and
        evictions it causes the others."""
        cfg, bs, num_tokens = self.config, request.block_size, request.num_tokens
        decode_w, compute_w, evict_w = cfg.decode_weight_s, cfg.compute_weight, cfg.evict_weight
        reuse = self.reuse.curve(now)
        rate_of, fleet_rate = self.rates.get, None if cfg.per_instance_rate else self.rates.get("")
        credit_of, adapter = credits.get, request.adapter
        costs, terms = {}, {}
        for c in candidates:
            cid = c.id
            rate = fleet_rate or rate_of(cid)
            uncached = num_tokens - credit_of(cid, 0.0) * bs
            if uncached < 0.0:
                uncached = 0.0
            queued = c.queued_prefill_tokens
            load = c.running + c.waiting
            inflight = c.inflight
            wait = queued / rate + decode_w * (load if load > inflight else inflight)
            if adapter is not None and c.adapter_slots >= 0 and adapter not in c.adapters:
                wait += cfg.adapter_load_s  # the adapter must be loaded there first (wait term)
            prefill = uncached / rate
            evict = 0.0
            free = c.kv_free_blocks
            if evict_w and free >= 0:
                need, ahead = -int(-uncached // bs), -(-queued // bs)
                if need > 0 and ahead + need > free:  # else it fits in free blocks: expected_loss is 0
                    evict = evict_w * expected_loss(c, need, ahead, now, reuse) * bs / rate
            compute = compute_w * prefill
            costs[cid] = wait + prefill + compute + evict
            terms[cid] = (wait, prefill, compute, evict)
        return costs, terms

    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        cfg, now = self.config, self.clock()
        credits = self.credits(request, candidates, matches)
        costs, terms = self.score(request, candidates, credits, now)
        chosen = self._cheapest(candidates, costs, credits, now)
        why: Callable[..., str] = lambda c=chosen: (  # noqa: E731
            f"lowest cost {costs[c.id]:.4f} s ({credits.get(c.id, 0.0):g} cached blocks credited)")
        copy = None
        if cfg.replicate_weight and credits:
            waits = {i: t[0] for i, t in terms.items()}
            copy = consider(request, candidates, credits, costs, waits, chosen, self.demand, now, cfg.replicate_weight)
            if copy is not None and copy.target is not None:
                chosen, why = copy.target, lambda reason=copy.reason: reason
        spill = spill_target(chosen, candidates, costs, cfg.hot_factor, cfg.hot_min_inflight, cfg.hot_tolerance_s,
                             self.rng)
        if spill is not None:
            why = lambda hot=chosen, spill=spill: (  # noqa: E731
                f"hot-spot guard: {hot.id} has {hot.inflight} inflight > {cfg.hot_factor:g} x others' "
                f"mean {others_mean(hot, candidates):.2f}; spilled to {spill.id} "
                f"(cost +{costs[spill.id] - costs[hot.id]:.4f} s)")
            chosen = spill
        self._last = (request, candidates, copy)
        uncached = round(max(request.num_tokens - credits.get(chosen.id, 0.0) * request.block_size, 0.0))
        return Decision(instance=chosen.id, costs=costs, uncached_tokens=uncached, terms=terms, reason_fn=why)

    def _cheapest(self, candidates: Sequence[InstanceState], costs: Mapping[str, float],
                  credits: Mapping[str, float], now: float) -> InstanceState:
        """The lowest cost; near-ties (within tie_tolerance, crediting the same blocks) go to the
        instance sent the fewest requests lately, then at random."""
        values = list(costs.values())  # in candidate order (score's)
        lowest = min(values)
        best = candidates[values.index(lowest)]  # the first of the lowest, as min(candidates, key=cost)
        limit, credit = lowest * (1.0 + self.config.tie_tolerance), credits.get(best.id, 0.0)
        credit_of = credits.get
        near = [c for c, cost in zip(candidates, values) if cost <= limit and abs(credit_of(c.id, 0.0) - credit) < 1.0]
        if len(near) == 1:
            return near[0]
        shares = {c.id: self._share(c.id, now) for c in near}
        least = min(shares.values())
        return self.rng.choice([c for c in near if shares[c.id] <= least + 1e-9])

    def _share(self, instance: str, now: float) -> float:
        value, since = self._routed.get(instance, (0.0, now))
        return value * 0.5 ** ((now - since) / self.config.share_halflife_s)

    def on_routed(self, request: RouteRequest, instance: str) -> None:
        now = self.clock()
        self._routed[instance] = (self._share(instance, now) + 1.0, now)
        if request.block_hashes:
            self.recent.record(instance, request.block_hashes, now)
            self.reuse.observe(request.block_hashes, now)
        last, self._last = self._last, None
        if last is not None and not (last[0] is request
                                     or request.request_id and last[0].request_id == request.request_id):
            last = None  # the decision was for another request (select without on_routed)
        if last is not None and last[2] is not None:
            self.demand.record(last[2].key, now, last[2].delay_s)
        if not request.request_id:
            return
        queued = next((c.queued_prefill_tokens for c in last[1] if c.id == instance), 0) if last else 0
        self._dispatched[request.request_id] = queued
        if len(self._dispatched) > _MAX_DISPATCHED:
            self._dispatched.popitem(last=False)

    def on_failed(self, request: RouteRequest, instance: str) -> None:
        """The blocks credited as pending there will not come: withdraw them."""
        if request.block_hashes:
            self.recent.withdraw(instance, request.block_hashes)

    def on_first_token(self, request: RouteRequest, instance: str, ttft_s: float, uncached_tokens: int) -> None:
        queued = self._dispatched.pop(request.request_id, 0) if request.request_id else 0
        self.rates.observe(instance, uncached_tokens + queued, ttft_s)

    def on_finished(self, request: RouteRequest, instance: str) -> None:
        if request.request_id:
            self._dispatched.pop(request.request_id, None)
