"""What a server's connection rules did (router/contract/connections.py), read from its
ConnectionGuard at scrape time; the router's metrics are `kvroute_router_*`, the engine's
`kvroute_engine_*`:

    {prefix}_connections                          client connections open now
    {prefix}_connections_closed_total{reason}     closed by a rule: header_timeout, body_timeout,
                                                  displaced, over_capacity, over_peer_capacity
    {prefix}_body_buffer_bytes                    request body bytes being received now
    {prefix}_body_buffer_refused_total            bodies refused past --body-buffer-bytes (503)
    {prefix}_malformed_requests_total{reason}     heads the HTTP parser refused (400), by error class
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvroute.router.contract.connections import ConnectionGuard

CLOSE_REASONS = ("header_timeout", "body_timeout", "displaced", "over_capacity", "over_peer_capacity")


class ConnectionCollector:
    def __init__(self, guard_of: Callable[[], ConnectionGuard | None], prefix: str = "kvroute_router") -> None:
        self.guard_of = guard_of  # the runner makes the guard after the app
        self.prefix = prefix

    def describe(self):
        return []

    def collect(self):
        guard = self.guard_of()
        if guard is None:
            return
        p = self.prefix
        open_now = GaugeMetricFamily(f"{p}_connections", "Client connections open now.")
        open_now.add_metric([], guard.open)
        closed = CounterMetricFamily(f"{p}_connections_closed",
                                     "Connections closed by the connection rules, by reason.", labels=["reason"])
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], guard.closed[reason])
        buffered = GaugeMetricFamily(f"{p}_body_buffer_bytes", "Request body bytes being received now.")
        buffered.add_metric([], guard.body_bytes)
        refused = CounterMetricFamily(f"{p}_body_buffer_refused", "Request bodies refused past --body-buffer-bytes.")
        refused.add_metric([], guard.body_buffer_refused)
        malformed = CounterMetricFamily(f"{p}_malformed_requests", "Request heads the HTTP parser refused (400), "
                                        "by error class.", labels=["reason"])
        for reason, n in sorted(guard.malformed.counts.items()):
            malformed.add_metric([reason], n)
        yield from (open_now, closed, buffered, refused, malformed)
