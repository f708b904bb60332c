"""One client request as the router saw it, end to end, and a window of recent ones.

A `RequestTrace` follows a request across its attempts (and, disaggregated, across its
prefill and decode engines): when the first token reached the client, the bytes relayed
after it, the engine's `usage`. When the request ends, `Router.finish` turns it into
metrics and adds it to `RecentRequests`, the window the planner reads at GET /router/stats
(TTFT and TPOT percentiles, SLO attainment and token rates per model).

TPOT is (last byte - first token) / (completion tokens - 1), with the engine's reported
completion tokens when the stream carries usage, else the SSE events relayed (one per
token for kvroute and vLLM engines).
"""

from __future__ import annotations

import collections
import dataclasses
import time

from router.planner.demand import estimate
from router.service.usage import StreamUsage, Usage, usage_from_body


@dataclasses.dataclass(slots=True)
class RequestTrace:
    model: str
    stream: bool
    prompt_tokens: int
    started: float = dataclasses.field(default_factory=time.perf_counter)
    max_tokens: int = -1  # as asked (-1: not given)
    predicted_cached: int = 0  # the router's prediction, when the engine reports no usage
    decided: bool = False  # its routing decision time was recorded
    instance: str = ""  # where the tokens came from (the decode engine, disaggregated)
    first_token: float | None = None
    last_byte: float | None = None
    events: int = 0  # SSE data events relayed after the first token
    usage: Usage | None = None
    status: str = ""
    scanner: StreamUsage = dataclasses.field(default_factory=StreamUsage)

    def first(self, instance: str) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter()
        self.instance = instance

    def relayed(self, chunk: bytes) -> None:
        self.events += chunk.count(b"data: ")
        self.scanner.feed(chunk)
        self.last_byte = time.perf_counter()

    def body(self, raw: bytes, instance: str) -> None:
        """A whole (non-streamed) answer arrived."""
        self.instance = instance
        self.last_byte = time.perf_counter()
        self.usage = usage_from_body(raw)

    def end(self, status: str) -> None:
        self.status = status
        if self.stream and self.usage is None:
            self.usage = self.scanner.usage

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None or not self.stream else self.first_token - self.started

    @property
    def output_tokens(self) -> int:
        if self.usage is not None:
            return self.usage.completion_tokens
        return max(0, self.events - 1) + (1 if self.first_token is not None else 0)  # minus [DONE]

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if not self.stream or self.first_token is None or self.last_byte is None or n < 2:
            return None
        return (self.last_byte - self.first_token) / (n - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
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


class RecentRequests:
    """Finished requests of the last `horizon_s` seconds (at most `capacity`)."""

    def __init__(self, horizon_s: float = 600.0, capacity: int = 100_000) -> None:
        self.horizon_s = horizon_s
        self.items: collections.deque[Finished] = collections.deque(maxlen=capacity)
        self.arrivals: collections.deque[tuple[float, str, int, int]] = collections.deque(maxlen=capacity)

    def arrived(self, trace: RequestTrace) -> None:
        """A request was routed: its prompt and asked output are demand before it finishes."""
        self.arrivals.append((time.time(), trace.model, trace.prompt_tokens, trace.max_tokens))

    def add(self, trace: RequestTrace) -> None:
        now = time.time()
        reported = trace.usage.cached_tokens if trace.usage is not None else None
        cached = reported if reported is not None else trace.predicted_cached
        self.items.append(Finished(now, trace.model, trace.status == "200", trace.ttft, trace.tpot,
                                   trace.prompt_tokens, trace.output_tokens, cached, trace.max_tokens))
        while self.items and self.items[0].at < now - self.horizon_s:
            self.items.popleft()
        while self.arrivals and self.arrivals[0][0] < now - self.horizon_s:
            self.arrivals.popleft()

    def stats(self, window_s: float, slo_ttft: float | None = None, slo_tpot: float | None = None) -> dict:
        """Per model and overall ("*"): rates, TTFT/TPOT percentiles, SLO attainment in the window."""
        since = time.time() - window_s
        recent = [f for f in self.items if f.at >= since]
        arrived = [a for a in self.arrivals if a[0] >= since]
        out = {"window_s": window_s, "models": {}}
        for model in sorted({f.model for f in recent} | {a[1] for a in arrived}) + ["*"]:
            rows = [f for f in recent if model in ("*", f.model)]
            asked = [(a[2], a[3]) for a in arrived if model in ("*", a[1])]
            out["models"][model] = _summary(rows, asked, window_s, slo_ttft, slo_tpot)
        return out


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
