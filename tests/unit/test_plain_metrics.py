"""The request path's plain-number metrics (router/contract/plain_metrics.py) scrape exactly as
prometheus_client's own classes do."""

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvroute.router.contract.plain_metrics import PlainCounter, PlainGauge, PlainHistogram
from kvroute.router.service.metrics import RouterMetrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = (0.0, 0.0005, 0.001, 0.002, 0.01, 0.5, 1.0, 3.0, float("inf"))


def _text(registry) -> str:
    return re.sub(r"_created(\{[^}]*\})? \S+", r"_created\1 T", generate_latest(registry).decode())


def _fill(counter, gauge, histogram, plain_hist) -> None:
    for i, v in enumerate(VALUES):
        counter.labels("e0" if i % 2 else "e1", "200").inc(i)
        gauge.labels("e0").set(i)
        histogram.labels("m", "e1").observe(v)
        plain_hist.observe(v)
    gauge.labels("e1").inc(2)
    gauge.labels("e1").dec(0.5)


def test_plain_metrics_scrape_as_the_stock_ones():
    texts = []
    for c, g, h in ((Counter, Gauge, Histogram), (PlainCounter, PlainGauge, PlainHistogram)):
        r = CollectorRegistry()
        _fill(c("x_requests", "Requests.", ["instance", "status"], registry=r),
              g("x_inflight", "In flight.", ["instance"], registry=r),
              h("x_seconds", "Seconds.", ["model", "instance"], buckets=BUCKETS, registry=r),
              h("x_ratio", "Ratio.", buckets=BUCKETS, registry=r))
        texts.append(_text(r))
    assert texts[0] == texts[1]
    assert 'x_seconds_bucket{instance="e1",le="0.001",model="m"} 3.0' in texts[1]
    assert 'x_requests_total{instance="e0",status="200"} 16.0' in texts[1]


def test_a_plain_counter_refuses_to_go_down():
    c = PlainCounter("y_total", "Y.", registry=CollectorRegistry())
    with pytest.raises(ValueError):
        c.inc(-1)


def test_router_metrics_keep_their_names_and_labels():
    m = RouterMetrics()
    inflight = {"e0": 3}
    m.watch_inflight(lambda: inflight.items())
    m.count_request("e0", "kv_aware", "200")
    m.observe_finished("tiny", "e0", 0.02, None)
    m.observe_rejected(413)
    value = m.registry.get_sample_value
    assert value("kvroute_router_requests_total", {"instance": "e0", "policy": "kv_aware", "status": "200"}) == 1
    assert value("kvroute_router_inflight", {"instance": "e0"}) == 3
    assert value("kvroute_router_request_duration_seconds_count", {"model": "tiny", "instance": "e0"}) == 1
    assert value("kvroute_router_rejected_requests_total", {"status": "413"}) == 1
    assert value("kvroute_router_requests_created", {"instance": "e0", "policy": "kv_aware", "status": "200"}) is None
    m.count_request("e0", "kv_aware", "200")
    assert value("kvroute_router_requests_total", {"instance": "e0", "policy": "kv_aware", "status": "200"}) == 2
    del inflight["e0"]  # the instance left the cluster
    assert value("kvroute_router_inflight", {"instance": "e0"}) is None
