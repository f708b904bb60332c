"""Router Prometheus metrics (kvroute_router_*), on a registry of the app's own.

Per-request metrics labelled by `model` and `instance` (the engine's instance id), as a
client sees them through the router:

    kvroute_router_request_duration_seconds        request arrival at the router -> last byte relayed
    kvroute_router_time_to_first_token_seconds     forwarded -> first byte from the engine (streamed)
    kvroute_router_time_per_output_token_seconds   (last byte - first byte) / (completion tokens - 1)
    kvroute_router_output_tokens_total             usage.completion_tokens reported by the engine
    kvroute_router_usage_prompt_tokens_total       usage.prompt_tokens, of requests that report cached tokens
    kvroute_router_cached_tokens_total             usage.prompt_tokens_details.cached_tokens (actual hits)

Actual cache hit rate = cached_tokens / usage_prompt_tokens; the router's prediction is
predicted_cached_tokens / prompt_tokens. `kvroute_router_rejected_requests_total{status}`
counts requests the router answered itself with an error (never forwarded), and
`kvroute_router_requests_total{status="cancelled"}` a client that left mid-request.
TTFT uses vLLM's buckets; TPOT adds 1-5 ms buckets below vLLM's (router/contract/metric_buckets.py).

Nothing is looked up by label per request. `kvroute_router_inflight` is read off the instances
at scrape time (`watch_inflight`); `kvroute_router_requests_total` is a plain tally the scrape
turns into the counter (`count_request`, the tally's `count`); the per-request series of a
(model, instance) pair are bound once and kept together (`series`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvroute.router.contract.metric_buckets import DURATION_BUCKETS, FINE_TPOT_BUCKETS, TTFT_BUCKETS
from kvroute.router.contract.plain_metrics import PlainCounter, PlainHistogram
from kvroute.router.service.usage import Usage

DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self._children: dict[tuple, object] = {}
        self._series: dict[tuple[str, str], RequestSeries] = {}
        self._tally = _RequestTally()
        self.count_request = self._tally.count  # (instance, policy, status): one request ended there
        self._inflight = _InflightGauge()
        r.register(self._tally)
        r.register(self._inflight)
        self.decision_seconds = PlainHistogram("kvroute_router_decision_seconds",
                                          "Routing decision time: tokenize + hash + lookup + score.",
                                          buckets=DECISION_BUCKETS, registry=r)
        self.lookup_seconds = PlainHistogram("kvroute_router_index_lookup_seconds", "Index lookup time.",
                                        buckets=DECISION_BUCKETS, registry=r)
        self.cached_ratio = PlainHistogram("kvroute_router_cached_token_ratio",
                                      "Share of a routed prompt's tokens cached on the chosen instance (predicted).",
                                      buckets=RATIO_BUCKETS, registry=r)
        self.prompt_tokens = PlainCounter("kvroute_router_prompt_tokens", "Prompt tokens routed.", registry=r)
        self.cached_tokens = PlainCounter("kvroute_router_predicted_cached_tokens",
                                     "Prompt tokens predicted cached on the chosen instance.", registry=r)
        self.index_size = Gauge("kvroute_router_index_entries", "(block, instance) entries in the index.",
                                registry=r)
        self.event_lag = Histogram("kvroute_router_event_lag_seconds",
                                   "Age of an engine's load record when its events arrive.",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.events = Counter("kvroute_router_kv_events",
                              "KV events applied to the index, by type (duplicate: another replica had).", ["type"],
                              registry=r)
        self.resyncs = Counter("kvroute_router_resyncs", "Instances reloaded from their snapshot.", registry=r)
        self.retries = PlainCounter("kvroute_router_retries", "Requests retried on another instance.", registry=r)
        self.errors = Counter("kvroute_router_errors", "Errors, by kind.", ["kind"], registry=r)
        self.request_keys = Counter("kvroute_router_request_keys", "Requests whose block keys carried an adapter, a "
                                    "salt or images (image: images seen; image_unhashed_REASON: requests routed on "
                                    "the text before an image without a local hash).", ["key"], registry=r)
        self.ejections = Counter("kvroute_router_ejections", "Instances ejected by health checks.", registry=r)
        self.stalls = Counter("kvroute_router_stalls", "Instances taken out of routing for holding work without "
                              "progress for --first-byte-timeout-s.", registry=r)
        self.registry_refused = Counter("kvroute_router_registry_refused",
                                        "Fleet registry records not believed, by reason (unsigned, bad_signature, "
                                        "expired, future, stale, replayed, kind_mismatch).", ["reason"], registry=r)
        self.healthy = Gauge("kvroute_router_instance_routable", "1 when the instance takes requests.",
                             ["instance"], registry=r)
        self.mismatch = Gauge("kvroute_router_instance_mismatch",
                              "1 when the instance's block size, hash seed or tokenizer differ (load-only routing).",
                              ["instance"], registry=r)
        per_request = ["model", "instance"]
        self.request_duration = PlainHistogram("kvroute_router_request_duration_seconds",
                                          "Request arrival at the router to the last byte relayed.", per_request,
                                          buckets=DURATION_BUCKETS, registry=r)
        self.time_to_first_token = PlainHistogram("kvroute_router_time_to_first_token_seconds",
                                             "Forwarded to the first byte from the engine (streamed requests).",
                                             per_request, buckets=TTFT_BUCKETS, registry=r)
        self.time_per_output_token = PlainHistogram("kvroute_router_time_per_output_token_seconds",
                                               "Per request: (last byte - first byte) / (completion tokens - 1).",
                                               per_request, buckets=FINE_TPOT_BUCKETS, registry=r)
        self.output_tokens = PlainCounter("kvroute_router_output_tokens", "Completion tokens, as the engines reported.",
                                     per_request, registry=r)
        self.usage_prompt_tokens = PlainCounter("kvroute_router_usage_prompt_tokens",
                                           "Prompt tokens of requests whose engine reported cached tokens.",
                                           per_request, registry=r)
        self.actual_cached_tokens = PlainCounter("kvroute_router_cached_tokens",
                                            "Prompt tokens the engines reported cached (actual prefix-cache hits).",
                                            per_request, registry=r)
        self.rejected = PlainCounter("kvroute_router_rejected_requests",
                                "Requests the router answered itself with an error, by HTTP status.", ["status"],
                                registry=r)

    def bound(self, metric, *labels):
        """metric.labels(*labels), looked up once: the hot path pays a dict lookup, not the
        client library's validation and lock."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def watch_inflight(self, inflight: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """`kvroute_router_inflight{instance}` is what `inflight()` (instance id, requests in flight)
        says at scrape time: the request path keeps its count on the instance and nothing else."""
        self._inflight.source = inflight

    def forget_instance(self, instance: str) -> None:
        """An instance left: drop its series and the children bound for it."""
        for gauge in (self.healthy, self.mismatch):
            try:
                gauge.remove(instance)
            except KeyError:
                pass
        self._children = {k: v for k, v in self._children.items() if instance not in k[1]}
        self._series = {k: v for k, v in self._series.items() if k[1] != instance}

    def series(self, model: str, instance: str) -> RequestSeries:
        """The per-request series of (model, instance), bound once."""
        series = self._series.get((model, instance))
        if series is None:
            series = self._series[model, instance] = RequestSeries(self, model, instance)
        return series

    def observe_first_token(self, model: str, instance: str, seconds: float) -> None:
        self.series(model, instance).ttft.observe(seconds)

    def observe_finished(self, model: str, instance: str, duration_s: float, usage: Usage | None,
                         first_token_s: float | None = None, end_s: float | None = None) -> None:
        """One request relayed to its end. `first_token_s` and `end_s` (monotonic times of the first
        and last byte) give its TPOT when the engine reported more than one completion token."""
        series = self.series(model, instance)
        series.duration.observe(duration_s)
        if usage is None:
            return
        series.output_tokens.inc(usage.completion_tokens)
        if usage.cached_tokens is not None:
            series.usage_prompt_tokens.inc(usage.prompt_tokens)
            series.cached_tokens.inc(usage.cached_tokens)
        if first_token_s is not None and end_s is not None and usage.completion_tokens > 1:
            tpot = (end_s - first_token_s) / (usage.completion_tokens - 1)
            series.tpot.observe(max(0.0, tpot))

    def observe_rejected(self, status: int) -> None:
        self.bound(self.rejected, str(status)).inc()


class RequestSeries:
    """The per-request series of one (model, instance) pair."""

    __slots__ = ("duration", "ttft", "tpot", "output_tokens", "usage_prompt_tokens", "cached_tokens")

    def __init__(self, m: RouterMetrics, model: str, instance: str) -> None:
        self.duration = m.request_duration.labels(model, instance)
        self.ttft = m.time_to_first_token.labels(model, instance)
        self.tpot = m.time_per_output_token.labels(model, instance)
        self.output_tokens = m.output_tokens.labels(model, instance)
        self.usage_prompt_tokens = m.usage_prompt_tokens.labels(model, instance)
        self.cached_tokens = m.actual_cached_tokens.labels(model, instance)


class _RequestTally:
    """kvroute_router_requests_total{instance, policy, status}, counted as plain numbers by the
    request path and written as a counter at scrape time (no _created series, as every other metric)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}

    def count(self, instance: str, policy: str, status: str) -> None:
        """One request ended at `instance` with `status`."""
        key = (instance, policy, status)
        self.counts[key] = self.counts.get(key, 0) + 1

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily("kvroute_router_requests", "Requests routed, by instance, policy and outcome.",
                                     labels=["instance", "policy", "status"])
        for key, n in list(self.counts.items()):
            family.add_metric(key, n)
        yield family


class _InflightGauge:
    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, int]]] = lambda: ()

    def describe(self):
        return []

    def collect(self):
        family = GaugeMetricFamily("kvroute_router_inflight", "Requests in flight, by instance.", labels=["instance"])
        for instance, n in self.source():
            family.add_metric([instance], n)
        yield family
