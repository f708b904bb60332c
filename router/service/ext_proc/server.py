"""The endpoint picker's gRPC server on grpcio's asyncio server (ext_proc_server "grpcio", the
fallback to the lean default, router/service/ext_proc/grpc_server.py): Envoy's
`envoy.service.ext_proc.v3.ExternalProcessor/Process` and the gRPC health service
(router/service/ext_proc/health_book.py's rules), over the same `Exchange`.

This module is imported only with --ext-proc-server grpcio.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvroute.router.service.ext_proc.exchange import Exchange
from kvroute.router.service.ext_proc.health_book import (
    HEALTH_INTERVAL_S,
    LIVENESS,
    READY_NAMES,
    STOP_GRACE_S,
    ready_status,
)

log = logging.getLogger(__name__)


class Processor(pb_grpc.ExternalProcessorServicer):
    """One ext_proc stream per HTTP request: Envoy's messages through its `Exchange`, answers back."""

    def __init__(self, exchange: Callable[[], Exchange]) -> None:
        self.exchange = exchange

    async def Process(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        exchange = self.exchange()
        try:
            async for request in request_iterator:
                for answer in await exchange.on(request):
                    yield answer
        finally:
            exchange.close()


class ExtProcServer:
    """The gRPC server's life: `start` binds and serves (the port bound is `port`), `stop` ends it."""

    def __init__(self, exchange: Callable[[], Exchange], ready: Callable[[], bool], host: str, port: int) -> None:
        self.exchange, self.ready, self.host, self.port = exchange, ready, host, port
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        pb_grpc.add_ExternalProcessorServicer_to_server(Processor(self.exchange), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        bound = self.server.add_insecure_port(f"{host}:{self.port}")
        if not bound:  # the port asked for, not the 0 grpc answers
            raise OSError(f"cannot listen for ext_proc on {host}:{self.port}")
        self.port = bound
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._mark()
        await self.server.start()
        self._watch = asyncio.create_task(self._watch_loop(), name="ext-proc-health")
        log.info("ext_proc endpoint picker listening on %s:%d (grpcio server)", host, self.port)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self.server is not None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(STOP_GRACE_S)

    async def _mark(self) -> None:
        status = ready_status(self.ready())
        for name in READY_NAMES:
            await self.health.set(name, status)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self._mark()
