"""Admission metrics (kvroute_router_admission_*), on the router's registry (docs/metrics.md).

    kvroute_router_admission_queue_depth{tenant,band}            requests waiting in the router now
    kvroute_router_admission_queue_wait_seconds{tenant,band}     time in the queue, admitted or refused
    kvroute_router_admission_requests_total{tenant,band,outcome,reason}
                                                                 admitted (fits, queued) or refused (why)
    kvroute_router_admission_predicted_ttft_seconds{tenant}      the prediction an admitted request went on
    kvroute_router_admission_observed_ttft_seconds{tenant}       its dispatch to first byte (streamed)

Predicted against observed is the calibration to read before trusting admission.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvroute.router.contract.metric_buckets import TTFT_BUCKETS

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        by = ["tenant", "band"]
        self.queue_depth = Gauge("kvroute_router_admission_queue_depth", "Requests waiting in the admission queue.",
                                 by, registry=registry)
        self.queue_wait = Histogram("kvroute_router_admission_queue_wait_seconds",
                                    "Time a request spent in the admission queue (admitted or refused).", by,
                                    buckets=WAIT_BUCKETS, registry=registry)
        self.requests = Counter("kvroute_router_admission_requests", "Admission outcomes, by reason.",
                                [*by, "outcome", "reason"], registry=registry)
        self.predicted_ttft = Histogram("kvroute_router_admission_predicted_ttft_seconds",
                                        "Predicted TTFT of admitted requests, at dispatch.", ["tenant"],
                                        buckets=TTFT_BUCKETS, registry=registry)
        self.observed_ttft = Histogram("kvroute_router_admission_observed_ttft_seconds",
                                       "Observed dispatch-to-first-byte of admitted streamed requests.", ["tenant"],
                                       buckets=TTFT_BUCKETS, registry=registry)

    def depth(self, tenant: str, band: int, delta: int) -> None:
        self.queue_depth.labels(tenant, str(band)).inc(delta)

    def waited(self, tenant: str, band: int, seconds: float) -> None:
        self.queue_wait.labels(tenant, str(band)).observe(seconds)

    def decided(self, tenant: str, band: int, outcome: str, reason: str) -> None:
        self.requests.labels(tenant, str(band), outcome, reason).inc()

    def predicted(self, tenant: str, seconds: float) -> None:
        self.predicted_ttft.labels(tenant).observe(seconds)

    def observed(self, tenant: str, seconds: float) -> None:
        self.observed_ttft.labels(tenant).observe(seconds)
