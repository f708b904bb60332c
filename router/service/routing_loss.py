"""The routing-loss split on live traffic (router/decision/routing_loss.py), fed by two hooks.

    decided(trace, choice, matches)
                             when the request is decided, before it is sent: the best cached prefix any candidate
                             held and the chosen instance's, by the index, kept on the trace (and
                             sent to the client as x-kvroute-best-cached-tokens and
                             x-kvroute-predicted-cached-tokens, so `kvroute loadgen` splits the
                             same way from its side)
    finished(trace)          when it ends: with the engine's reported cached tokens, one sample

A policy that does not read the index (round_robin, ...) gets the index's answer looked up at
decision time, before the request is sent, where the index answers without awaiting (memory; with `--index redis`
such requests have no figures). Only whole requests served by the instance they were routed to
count (a disaggregated request's prefill and decode engines differ; a request without
usage.cached_tokens says nothing). Each
sample goes to the counters below, to a window for GET /router/stats (`routing_loss`), and to
`on_sample` (the silent-miss alarms, router/service/silent_miss.py).

    kvroute_router_routing_tokens_total{part}        prompt, best, predicted, served
    kvroute_router_routing_loss_tokens_total{cause}  workload, balancing, index_unserved, index_unpredicted
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter

from kvroute.router.decision.routing_loss import LossSample, LossSplit, best_and_predicted, held_blocks
from kvroute.router.index.base import PrefixMatch

BEST_HEADER = "x-kvroute-best-cached-tokens"
PREDICTED_HEADER = "x-kvroute-predicted-cached-tokens"


def _nothing(instance: str, sample: LossSample, trace) -> None:
    return None


class RoutingLoss:
    def __init__(self, registry: CollectorRegistry | None = None, horizon_s: float = 600.0,
                 capacity: int = 100_000, on_sample: Callable[[str, LossSample, object], None] = _nothing,
                 clock: Callable[[], float] = time.monotonic) -> None:
        registry = registry or CollectorRegistry()
        self.horizon_s, self.on_sample, self.clock = horizon_s, on_sample, clock
        self._window: collections.deque[tuple[float, LossSample]] = collections.deque(maxlen=capacity)
        tokens = Counter("kvroute_router_routing_tokens", "Prompt tokens of routed requests, and of them the best "
                         "cached prefix any candidate held, the chosen instance's (both by the index) and what "
                         "its engine served from cache.", ["part"], registry=registry)
        lost = Counter("kvroute_router_routing_loss_tokens", "Prompt tokens not served from cache, by cause: "
                       "workload (cached nowhere), balancing (a better-cached instance passed over), "
                       "index_unserved / index_unpredicted (the index predicted a hit not served, or the reverse).",
                       ["cause"], registry=registry)
        self._tokens = {part: tokens.labels(part) for part in ("prompt", "best", "predicted", "served")}
        self._lost = {cause: lost.labels(cause) for cause in ("workload", "balancing", "index_unserved",
                                                              "index_unpredicted")}

    @staticmethod
    def decided(trace, choice, matches: Mapping[str, PrefixMatch] | None) -> None:
        """The request is decided for `choice` (router/service/routing.py `Choice`); `matches`: the
        index's answer for its prompt (None: not known without awaiting, no figures)."""
        if matches is None:
            trace.loss_instance = ""
            return
        inst = choice.instance
        block_size = inst.info.block_size if inst.info is not None else 16
        held = ((c.id, held_blocks(c.id, matches, c.tier_costs)) for c in choice.candidates if c.cache_ok)
        trace.loss_best, trace.loss_predicted = best_and_predicted(held, inst.id, trace.prompt_tokens, block_size)
        trace.loss_instance = inst.id

    @staticmethod
    def headers(trace) -> dict[str, str]:
        if not trace.loss_instance:
            return {}
        return {BEST_HEADER: str(trace.loss_best), PREDICTED_HEADER: str(trace.loss_predicted)}

    def finished(self, trace) -> None:
        usage = trace.usage
        if (trace.status != "200" or usage is None or usage.cached_tokens is None or not trace.loss_instance
                or trace.instance != trace.loss_instance):
            return
        prompt = trace.prompt_tokens
        sample = LossSample(prompt_tokens=prompt, best=trace.loss_best, predicted=trace.loss_predicted,
                            served=min(usage.cached_tokens, prompt))
        self._count(sample)
        self._window.append((self.clock(), sample))
        self.on_sample(trace.instance, sample, trace)

    def _count(self, s: LossSample) -> None:
        for part, n in (("prompt", s.prompt_tokens), ("best", s.best), ("predicted", s.predicted),
                        ("served", s.served)):
            self._tokens[part].inc(n)
        self._lost["workload"].inc(s.prompt_tokens - s.best)
        self._lost["balancing"].inc(s.best - s.predicted)
        if s.predicted > s.served:
            self._lost["index_unserved"].inc(s.predicted - s.served)
        else:
            self._lost["index_unpredicted"].inc(s.served - s.predicted)

    def stats(self, window_s: float) -> dict:
        """The split over the requests that ended in the last `window_s` seconds."""
        now = self.clock()
        while self._window and now - self._window[0][0] > self.horizon_s:
            self._window.popleft()
        total = LossSplit()
        for at, sample in reversed(self._window):
            if now - at > window_s:
                break
            total.add(sample)
        return total.shares()
