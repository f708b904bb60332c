"""Router Prometheus metrics (kvroute_router_*), on a registry of the app's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.requests = Counter("kvroute_router_requests", "Requests routed, by instance, policy and outcome.",
                                ["instance", "policy", "status"], registry=r)
        self.decision_seconds = Histogram("kvroute_router_decision_seconds",
                                          "Routing decision time: tokenize + hash + lookup + score.",
                                          buckets=DECISION_BUCKETS, registry=r)
        self.lookup_seconds = Histogram("kvroute_router_index_lookup_seconds", "Index lookup time.",
                                        buckets=DECISION_BUCKETS, registry=r)
        self.cached_ratio = Histogram("kvroute_router_cached_token_ratio",
                                      "Share of a routed prompt's tokens cached on the chosen instance (predicted).",
                                      buckets=RATIO_BUCKETS, registry=r)
        self.prompt_tokens = Counter("kvroute_router_prompt_tokens", "Prompt tokens routed.", registry=r)
        self.cached_tokens = Counter("kvroute_router_predicted_cached_tokens",
                                     "Prompt tokens predicted cached on the chosen instance.", registry=r)
        self.ttft = Histogram("kvroute_router_ttft_seconds", "Time to first byte from the engine, as routed.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.index_size = Gauge("kvroute_router_index_entries", "(block, instance) entries in the index.",
                                registry=r)
        self.event_lag = Histogram("kvroute_router_event_lag_seconds",
                                   "Age of an engine's load record when its events arrive.",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.events = Counter("kvroute_router_kv_events", "KV events applied to the index, by type (duplicate: another replica had).",
                              ["type"],
                              registry=r)
        self.resyncs = Counter("kvroute_router_resyncs", "Instances reloaded from their snapshot.", registry=r)
        self.retries = Counter("kvroute_router_retries", "Requests retried on another instance.", registry=r)
        self.errors = Counter("kvroute_router_errors", "Errors, by kind.", ["kind"], registry=r)
        self.ejections = Counter("kvroute_router_ejections", "Instances ejected by health checks.", registry=r)
        self.healthy = Gauge("kvroute_router_instance_routable", "1 when the instance takes requests.",
                             ["instance"], registry=r)
        self.mismatch = Gauge("kvroute_router_instance_mismatch",
                              "1 when the instance's block size, hash seed or tokenizer differ (load-only routing).",
                              ["instance"], registry=r)
        self.inflight = Gauge("kvroute_router_inflight", "Requests in flight, by instance.", ["instance"],
                              registry=r)
