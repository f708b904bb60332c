"""What the fleet records in the router's metrics, as a protocol: the router service's `RouterMetrics`
(router/service/metrics.py) satisfies it; the fleet never imports the service."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol


class FleetMetrics(Protocol):
    healthy: Any  # kvroute_router_instance_routable{instance}
    mismatch: Any  # kvroute_router_instance_mismatch{instance}
    ejections: Any  # kvroute_router_ejections
    stalls: Any  # kvroute_router_stalls

    def bound(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), looked up once."""

    def watch_inflight(self, inflight: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """`inflight()` gives kvroute_router_inflight{instance} at scrape time."""

    def forget_instance(self, instance: str) -> None:
        """An instance left: its series go."""
