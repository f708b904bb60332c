"""The endpoint picker's default gRPC server (ext_proc_server "lean"): HTTP/2 on an asyncio server in
the router's own event loop, no polling thread, serving Process, Health/Check and Health/Watch
(grpc_methods.py) on one port. Each connection is an H2Connection (grpc_connection.py).

Stopping: health NOT_SERVING, the port closed, GOAWAY on every connection; calls in flight get
STOP_GRACE_S to finish, then their connections close (their exchanges end as cancelled)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kvroute.router.service.ext_proc.exchange import Exchange
from kvroute.router.service.ext_proc.grpc_connection import H2Connection
from kvroute.router.service.ext_proc.grpc_methods import methods
from kvroute.router.service.ext_proc.health_book import HEALTH_INTERVAL_S, STOP_GRACE_S, HealthBook

log = logging.getLogger(__name__)



class LeanServer:
    """`start` binds and serves (the port bound is `port`), `stop` ends it."""

    def __init__(self, exchange: Callable[[], Exchange], ready: Callable[[], bool], host: str, port: int) -> None:
        self.ready, self.host, self.port = ready, host, port
        self.health = HealthBook()
        self.methods = methods(exchange, self.health)
        self.connections: set[H2Connection] = set()
        self.server: asyncio.Server | None = None
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        self.health.mark(self.ready())
        self.server = await self._listen(self.port)
        ports = {sock.getsockname()[1] for sock in self.server.sockets}
        if len(ports) > 1:  # port 0 on a host of several addresses (IPv4 and IPv6): each got its own port
            port = self.server.sockets[0].getsockname()[1]
            self.server.close()
            self.server = await self._listen(port)  # all on the first one's: one port to report
        self.port = self.server.sockets[0].getsockname()[1]
        self._watch = asyncio.create_task(self._watch_loop(), name="ext-proc-health")
        log.info("ext_proc endpoint picker listening on %s:%d (lean HTTP/2 server)", self.host, self.port)

    async def _listen(self, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: H2Connection(self), self.host, port, reuse_port=True)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        self.health.shutdown()
        if self.server is None:
            return
        self.server.close()
        for conn in list(self.connections):
            conn.goaway()
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.streams for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        await asyncio.sleep(0)  # the closed connections' calls are cancelled: let them end

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            self.health.mark(self.ready())
