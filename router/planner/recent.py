"""The planner's input: a window of recent requests, summarised as the planner reads it.

The router keeps one (router/service/request_trace.py `RecentRequests`, served at GET
/router/stats and read by `kvroute planner`, service.py); the simulator keeps one on its
virtual clock (loadgen/sim/planning.py). Both turn a summary into the planner's
`Observation` with `observation`, so the simulated planner sees what the real one sees.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence

import msgspec

from kvroute.router.planner.decide import EngineView, Observation
from kvroute.router.planner.demand import estimate


class Finished(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    model: str
    ok: bool
    ttft: float | None
    tpot: float | None
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    max_tokens: int = -1


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class RecentWindow:
    """Requests routed (`arrived`) and finished (`add`) in the last `horizon_s` seconds of `clock`."""

    def __init__(self, horizon_s: float = 600.0, capacity: int = 100_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.horizon_s = horizon_s
        self.clock = clock
        self.items: collections.deque[Finished] = collections.deque(maxlen=capacity)
        self.arrivals: collections.deque[tuple[float, str, int, int]] = collections.deque(maxlen=capacity)

    def arrived(self, model: str, prompt_tokens: int, max_tokens: int) -> None:
        """A request was routed: its prompt and asked output are demand before it finishes."""
        self.arrivals.append((self.clock(), model, prompt_tokens, max_tokens))

    def add(self, finished: Finished) -> None:
        now = finished.at
        self.items.append(finished)
        while self.items and self.items[0].at < now - self.horizon_s:
            self.items.popleft()
        while self.arrivals and self.arrivals[0][0] < now - self.horizon_s:
            self.arrivals.popleft()

    def stats(self, window_s: float, slo_ttft: float | None = None, slo_tpot: float | None = None) -> dict:
        """Per model and overall ("*"): rates, TTFT/TPOT percentiles, SLO attainment in the window."""
        since = self.clock() - window_s
        recent = [f for f in self.items if f.at >= since]
        arrived = [a for a in self.arrivals if a[0] >= since]
        models: dict[str, dict] = {}
        out = {"window_s": window_s, "models": models}
        for model in sorted({f.model for f in recent} | {a[1] for a in arrived}) + ["*"]:
            rows = [f for f in recent if model in ("*", f.model)]
            asked = [(a[2], a[3]) for a in arrived if model in ("*", a[1])]
            models[model] = _summary(rows, asked, window_s, slo_ttft, slo_tpot)
        return out


def observation(summary: dict, engines: Sequence[EngineView], now: float, share: int = 1) -> Observation:
    """The planner's input from one model's (or "*") `stats` summary and the engines it plans for;
    `share`: the fraction 1/share of the requests this summary saw (router --workers)."""
    d = summary["demand"]
    return Observation(now, list(engines), share * (summary["requests"] + summary["arrived"]),
                       share * d["prefill_tokens_per_s"], share * d["output_tokens_per_s"],
                       summary["ttft_s"]["p90"], summary["tpot_s"]["p90"],
                       d["mean_context_tokens"], d["mean_prompt_tokens"], d["mean_output_tokens"])


def _summary(rows: list[Finished], asked: list[tuple[int, int]], window_s: float, slo_ttft: float | None,
             slo_tpot: float | None) -> dict:
    ttfts = [f.ttft for f in rows if f.ttft is not None]
    tpots = [f.tpot for f in rows if f.tpot is not None]
    good = [f for f in rows if f.ok and (slo_ttft is None or f.ttft is None or f.ttft <= slo_ttft)
            and (slo_tpot is None or f.tpot is None or f.tpot <= slo_tpot)]  # unmeasured: not held against it
    return {
        "requests": len(rows),
        "errors": sum(not f.ok for f in rows),
        "requests_per_s": len(rows) / window_s,
        "prompt_tokens_per_s": sum(f.prompt_tokens for f in rows) / window_s,
        "prefill_tokens_per_s": sum(max(0, f.prompt_tokens - f.cached_tokens) for f in rows) / window_s,
        "output_tokens_per_s": sum(f.output_tokens for f in rows) / window_s,
        "ttft_s": {q: _pct(ttfts, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "tpot_s": {q: _pct(tpots, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "slo_attainment": len(good) / len(rows) if rows else None,
        "arrived": len(asked),
        "demand": dataclasses.asdict(estimate(asked, [(f.prompt_tokens, f.cached_tokens, f.output_tokens,
                                                       f.max_tokens) for f in rows if f.ok], window_s)),
    }
