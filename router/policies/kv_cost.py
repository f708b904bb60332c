"""The TTFT cost model, learned prefill rate, near-tie breaking and hot-spot guard shared by
kv_aware and approx_kv; they differ only in where a candidate's cached blocks come from
(`credits`). The formula and every parameter are explained in kv_aware.py.
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict
from typing import Callable, Mapping, Sequence

from router.index.base import PrefixMatch
from router.policies.base import Decision, InstanceState, PolicyBase, RouteRequest
from router.policies.rate import PrefillRate, RateConfig
from router.policies.recent import RecentBlocks

_MAX_DISPATCHED = 65536  # request ids whose queue-at-dispatch is remembered until first token


@dataclasses.dataclass(frozen=True, slots=True)
class KvCostConfig:
    """The TTFT cost model and hot-spot guard shared by kv_aware and approx_kv."""

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

    def __post_init__(self) -> None:
        self.rate_config()  # validates the rate fields
        if not 0 <= self.tie_tolerance < 1 or self.share_halflife_s <= 0:
            raise ValueError(f"tie_tolerance must be in [0, 1) and share_halflife_s positive, "
                             f"got {self.tie_tolerance} and {self.share_halflife_s}")
        for name in ("device_credit", "host_credit", "remote_credit"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a fraction of a block's compute, in [0, 1]; got {getattr(self, name)}")
        if min(self.decode_weight_s, self.compute_weight, self.hot_tolerance_s) < 0:
            raise ValueError("decode_weight_s, compute_weight and hot_tolerance_s cannot be negative")
        if self.hot_factor < 1 or self.hot_min_inflight < 1:
            raise ValueError(
                f"hot_factor must be >= 1 and hot_min_inflight >= 1, got {self.hot_factor} and {self.hot_min_inflight}"
            )

    def rate_config(self) -> RateConfig:
        return RateConfig(
            initial=self.prefill_rate,
            alpha=self.rate_alpha,
            min_rate=self.min_prefill_rate,
            max_rate=self.max_prefill_rate,
            min_sample_tokens=self.min_rate_sample_tokens,
            per_instance=self.per_instance_rate,
        )


class KvCostPolicy(PolicyBase):
    """Scores by predicted TTFT from per-candidate credited blocks; subclasses supply the credits."""

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
        self._tier_credit = {"device": config.device_credit, "host": config.host_credit, "remote": config.remote_credit}
        self._last: tuple[RouteRequest, Sequence[InstanceState]] | None = None
        self._dispatched: OrderedDict[str, int] = OrderedDict()
        self._routed: dict[str, tuple[float, float]] = {}  # instance -> (decayed request count, as of)

    def credits(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> dict[str, float]:
        raise NotImplementedError

    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        credits = self.credits(request, candidates, matches)
        cfg, bs, num_tokens, rate_of = self.config, request.block_size, request.num_tokens, self.rates.get
        decode_w, compute_w = cfg.decode_weight_s, cfg.compute_weight
        costs: dict[str, float] = {}
        for c in candidates:
            uncached = max(num_tokens - credits.get(c.id, 0.0) * bs, 0.0)
            load = max(c.running + c.waiting, c.inflight)
            costs[c.id] = ((c.queued_prefill_tokens + (1.0 + compute_w) * uncached) / rate_of(c.id)) + decode_w * load
        best = min(costs.values())
        chosen = self._break_tie([c for c in candidates if costs[c.id] <= best * (1.0 + cfg.tie_tolerance)])
        reason = f"lowest cost {best:.4f} s ({credits.get(chosen.id, 0.0):g} cached blocks credited)"
        spill = self._spill_target(chosen, candidates, costs)
        if spill is not None:
            others = (sum(c.inflight for c in candidates) - chosen.inflight) / (len(candidates) - 1)
            reason = (
                f"hot-spot guard: {chosen.id} has {chosen.inflight} inflight > {cfg.hot_factor:g} x others' mean "
                f"{others:.2f}; spilled to {spill.id} (cost +{costs[spill.id] - best:.4f} s)"
            )
            chosen = spill
        self._last = (request, candidates)
        uncached = round(max(request.num_tokens - credits.get(chosen.id, 0.0) * bs, 0.0))
        return Decision(chosen.id, costs=costs, reason=reason, uncached_tokens=uncached)

    def _break_tie(self, near: list[InstanceState]) -> InstanceState:
        """Among near-equal costs, the instance that was sent the fewest requests lately."""
        if len(near) == 1:
            return near[0]
        now = self.clock()
        shares = {c.id: self._share(c.id, now) for c in near}
        least = min(shares.values())
        return self.rng.choice([c for c in near if shares[c.id] <= least + 1e-9])

    def _share(self, instance: str, now: float) -> float:
        value, since = self._routed.get(instance, (0.0, now))
        return value * 0.5 ** ((now - since) / self.config.share_halflife_s)

    def _spill_target(
        self, best: InstanceState, candidates: Sequence[InstanceState], costs: Mapping[str, float]
    ) -> InstanceState | None:
        cfg = self.config
        if len(candidates) < 2 or best.inflight < cfg.hot_min_inflight:
            return None
        others_mean = (sum(c.inflight for c in candidates) - best.inflight) / (len(candidates) - 1)
        if best.inflight <= cfg.hot_factor * others_mean:
            return None
        cooler = [c for c in candidates if c.inflight < best.inflight]
        if not cooler:
            return None
        cheapest = min(costs[c.id] for c in cooler)
        if cheapest - costs[best.id] > cfg.hot_tolerance_s:
            return None
        return self.rng.choice([c for c in cooler if costs[c.id] == cheapest])

    def on_routed(self, request: RouteRequest, instance: str) -> None:
        now = self.clock()
        self._routed[instance] = (self._share(instance, now) + 1.0, now)
        if request.block_hashes:
            self.recent.record(instance, request.block_hashes, self.clock())
        last, self._last = self._last, None
        if not request.request_id:
            return
        queued = 0
        if last is not None and (last[0] is request or last[0].request_id == request.request_id):
            queued = next((c.queued_prefill_tokens for c in last[1] if c.id == instance), 0)
        self._dispatched[request.request_id] = queued
        if len(self._dispatched) > _MAX_DISPATCHED:
            self._dispatched.popitem(last=False)

    def on_first_token(self, request: RouteRequest, instance: str, ttft_s: float, uncached_tokens: int) -> None:
        queued = self._dispatched.pop(request.request_id, 0) if request.request_id else 0
        self.rates.observe(instance, uncached_tokens + queued, ttft_s)

    def on_finished(self, request: RouteRequest, instance: str) -> None:
        if request.request_id:
            self._dispatched.pop(request.request_id, None)
