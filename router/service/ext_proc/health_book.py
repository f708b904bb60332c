"""The endpoint picker's gRPC health (grpc.health.v1.Health), one set of rules for both servers:
`liveness` is SERVING while the process answers; `readiness`, the ext_proc service's name and ""
are SERVING while the router has a routable instance, NOT_SERVING otherwise (checked every
HEALTH_INTERVAL_S), as the Endpoint Picker Protocol asks; on stop, all NOT_SERVING."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READY_NAMES = ("", "readiness", SERVICE)
HEALTH_INTERVAL_S = 1.0
STOP_GRACE_S = 5.0  # calls in flight get this long when the router stops (as its HTTP requests do), either server
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def ready_status(ready: bool) -> int:
    return SERVING if ready else NOT_SERVING


class HealthBook:
    """The lean server's statuses by service name; Watch handlers wait on `changed`."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {LIVENESS: SERVING}
        self._changed: asyncio.Future | None = None
        self.stopped = False

    def mark(self, ready: bool) -> None:
        if not self.stopped:
            self._set(dict.fromkeys(READY_NAMES, ready_status(ready)))

    def shutdown(self) -> None:
        """Every service NOT_SERVING for good (the server stops)."""
        self._set(dict.fromkeys(self.statuses, NOT_SERVING))
        self.stopped = True

    def _set(self, statuses: dict[str, int]) -> None:
        if any(self.statuses.get(name) != status for name, status in statuses.items()):
            self.statuses.update(statuses)
            if self._changed is not None and not self._changed.done():
                self._changed.set_result(None)
            self._changed = None

    async def changed(self) -> None:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._changed)
