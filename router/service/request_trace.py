"""One client request as the router saw it, end to end, and a window of recent ones.

A `RequestTrace` follows a request across its attempts (and, disaggregated, across its
prefill and decode engines): when the first token reached the client, the bytes relayed
after it, the engine's `usage`. When the request ends, `Router.finish` turns it into
metrics and adds it to `RecentRequests`, the window (router/planner/recent.py) the planner
reads at GET /router/stats (TTFT and TPOT percentiles, SLO attainment and token rates per model).

TPOT is (last byte - first token) / (completion tokens - 1), with the engine's reported
completion tokens when the stream carries usage, else the SSE events relayed (one per
token for kvroute and vLLM engines).
"""

from __future__ import annotations

import time

import msgspec

from kvroute.router.planner.recent import Finished, RecentWindow
from kvroute.router.service.usage import StreamUsage, Usage, usage_from_body


class RequestTrace(msgspec.Struct, kw_only=True):
    model: str
    stream: bool
    prompt_tokens: int
    started: float = msgspec.field(default_factory=time.perf_counter)
    max_tokens: int = -1  # as asked (-1: not given)
    predicted_cached: int = 0  # the router's prediction, when the engine reports no usage
    index_blind: bool = False  # a lookup found the index unavailable: routed on load alone, predicting nothing
    loss_instance: str = ""  # where the routing-loss split's figures were taken (router/service/routing_loss.py)
    loss_best: int = 0  # the best cached prefix any candidate held, servable tokens, by the index
    loss_predicted: int = 0  # the chosen instance's
    decided: bool = False  # its routing decision time was recorded
    instance: str = ""  # where the tokens came from (the decode engine, disaggregated)
    first_token: float | None = None
    last_byte: float | None = None
    events: int = 0  # SSE data events relayed after the first token
    usage: Usage | None = None
    status: str = ""
    scanner: StreamUsage | None = None  # made by the first relayed chunk: whole bodies need none
    whole: bytes | None = None  # a whole answer, its usage read when the request ends (not before it is sent)

    def first(self, instance: str) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter()
        self.instance = instance

    def relayed(self, chunk: bytes) -> None:
        self.events += chunk.count(b"data: ")
        if self.scanner is None:
            self.scanner = StreamUsage()
        self.scanner.feed(chunk)
        self.last_byte = time.perf_counter()

    def body(self, raw: bytes, instance: str) -> None:
        """A whole (non-streamed) answer arrived."""
        self.instance = instance
        self.last_byte = time.perf_counter()
        self.whole = raw

    def end(self, status: str) -> None:
        self.status = status
        if self.whole is not None:
            self.usage, self.whole = usage_from_body(self.whole), None
        elif self.stream and self.usage is None and self.scanner is not None:
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


class RecentRequests:
    """The router's window of recent requests (router/planner/recent.py), fed with its traces."""

    def __init__(self, horizon_s: float = 600.0, capacity: int = 100_000) -> None:
        self.window = RecentWindow(horizon_s, capacity)

    def arrived(self, trace: RequestTrace) -> None:
        """A request was routed: its prompt and asked output are demand before it finishes."""
        self.window.arrived(trace.model, trace.prompt_tokens, trace.max_tokens)

    def add(self, trace: RequestTrace) -> None:
        reported = trace.usage.cached_tokens if trace.usage is not None else None
        cached = reported if reported is not None else trace.predicted_cached
        self.window.add(Finished(at=self.window.clock(), model=trace.model, ok=trace.status == "200",
                                 ttft=trace.ttft, tpot=trace.tpot, prompt_tokens=trace.prompt_tokens,
                                 output_tokens=trace.output_tokens, cached_tokens=cached,
                                 max_tokens=trace.max_tokens))

    def stats(self, window_s: float, slo_ttft: float | None = None, slo_tpot: float | None = None) -> dict:
        return self.window.stats(window_s, slo_ttft, slo_tpot)
