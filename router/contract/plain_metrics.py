"""Counters, gauges and histograms for the request path: prometheus_client's own classes (same
names, labels, registry, `labels()` and /metrics text), whose series keep plain Python numbers.

prometheus_client guards every update with a lock and a check that the metric is a series (not
a labelled parent): about a microsecond each, a dozen times per request. The router updates its
request metrics only from its event-loop thread, and the scrape runs on that loop too, so a plain
attribute is enough; a histogram finds its bucket by bisection. The text a scrape reads is the
library's own (`_child_samples` is not overridden): tests/unit/test_plain_metrics.py compares it
with the stock classes'.
"""

from __future__ import annotations

import bisect
import time

from prometheus_client import Counter, Gauge, Histogram


class _Plain:
    """What prometheus_client's value classes offer the samples, as one number."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = value

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> None:
        return None


class PlainCounter(Counter):
    def _metric_init(self) -> None:
        self._value = _Plain()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar=None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value.value += amount


class PlainGauge(Gauge):
    def _metric_init(self) -> None:
        self._value = _Plain()

    def set(self, value: float) -> None:
        self._value.value = float(value)

    def inc(self, amount: float = 1) -> None:
        self._value.value += amount

    def dec(self, amount: float = 1) -> None:
        self._value.value -= amount


class PlainHistogram(Histogram):
    def _metric_init(self) -> None:
        self._created = time.time()
        self._sum = _Plain()
        self._buckets = [_Plain() for _ in self._upper_bounds]

    def observe(self, amount: float, exemplar=None) -> None:
        self._sum.value += amount
        self._buckets[bisect.bisect_left(self._upper_bounds, amount)].value += 1
