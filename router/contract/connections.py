"""Connection hygiene for every kvroute server (router and engine): a client that opens sockets and
sends nothing, or sends its request head a byte at a time, is closed; excess connections are
refused at once, never the healthy ones.

- `header_timeout_s`: a request head (request line and headers) must be complete this long after
  its first byte, or after the connection opened for the first request. Missed: the connection
  is closed (counted "header_timeout").
- `idle_timeout_s`: a keep-alive connection with no request in flight is closed after this long
  (aiohttp's keep-alive timeout).
- `max_connections` / `max_connections_per_peer`: a connection past either cap is closed as soon
  as it is accepted (counted "over_capacity" / "over_peer_capacity"); open ones are untouched.

`GuardedRunner` is `web.AppRunner` with these rules; the limits come from the app
(`app[CONNECTION_LIMITS]`, defaults when absent) and what it closed is in `app[CONNECTION_GUARD]`.
It hooks aiohttp's request handler at two points, connection open and data received, and reads
its count of parsed request heads; tests/process/test_connections.py holds it to the behaviour.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import resource

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

FD_HEADROOM = 64  # descriptors kept for everything that is not a client connection


def _fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else 1 << 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    max_connections: int = 0  # 0: as many as the process may open, less FD_HEADROOM
    max_connections_per_peer: int = 1024

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("--header-timeout-s and --idle-timeout-s must be positive")
        if self.max_connections < 0 or self.max_connections_per_peer < 1:
            raise ValueError("--max-connections must be >= 0 (0: from the descriptor limit) and "
                             "--max-connections-per-peer >= 1")

    @property
    def connection_cap(self) -> int:
        return self.max_connections or max(_fd_limit() - FD_HEADROOM, 1)


class ConnectionGuard:
    """Who is connected, and what was closed for which rule."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.cap = limits.connection_cap
        self.open = 0
        self.by_peer: collections.Counter[str] = collections.Counter()
        self.closed: collections.Counter[str] = collections.Counter()  # reason -> connections closed

    def admit(self, peer: str) -> str | None:
        """Count a new connection in, or say why it must be closed."""
        if self.open >= self.cap:
            reason = "over_capacity"
        elif self.by_peer[peer] >= self.limits.max_connections_per_peer:
            reason = "over_peer_capacity"
        else:
            self.open += 1
            self.by_peer[peer] += 1
            return None
        self.closed[reason] += 1
        return reason

    def release(self, peer: str) -> None:
        self.open -= 1
        self.by_peer[peer] -= 1
        if not self.by_peer[peer]:
            del self.by_peer[peer]


CONNECTION_LIMITS = web.AppKey("connection_limits", ConnectionLimits)
CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)


class _GuardedHandler(RequestHandler):
    """aiohttp's handler, plus a deadline on each request head and the connection caps."""

    def __init__(self, guard: ConnectionGuard, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._peer: str | None = None
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        if self._guard.admit(peer) is not None:
            transport.abort()  # refused before aiohttp sees it: nothing was read or parsed
            return
        self._peer = peer
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is None and not getattr(self, "_request_in_progress", False) and not self._messages:
            self._await_head()  # the first byte of the next request on a kept-alive connection
        heads = self._request_count
        super().data_received(data)
        if self._request_count > heads and self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._peer is None:
            return  # refused in connection_made
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        self._guard.release(self._peer)
        self._peer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_deadline = self._loop.call_later(self._guard.limits.header_timeout_s, self._head_missed)

    def _head_missed(self) -> None:
        self._head_deadline = None
        self._guard.closed["header_timeout"] += 1
        if self.transport is not None:
            self.transport.abort()


class _GuardedServer(Server):
    def __init__(self, guard: ConnectionGuard, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self._guard, self, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` whose connections follow the app's `ConnectionLimits`."""

    def __init__(self, app: web.Application, **kwargs) -> None:
        limits = app.get(CONNECTION_LIMITS) or ConnectionLimits()
        kwargs.setdefault("keepalive_timeout", limits.idle_timeout_s)
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(limits)
        app[CONNECTION_GUARD] = self.guard

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        guarded = _GuardedServer(self.guard, server.request_handler, request_factory=server.request_factory,
                                 handler_cancellation=server.handler_cancellation, loop=server._loop,
                                 **server._kwargs)
        return guarded
