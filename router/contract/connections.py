"""Connection rules for every kvroute server (router and engine), each phase of a connection bounded:
a client that opens sockets and sends nothing, sends its head or body a byte at a time or not at
all, or holds connections from many addresses, is closed; the healthy ones are served meanwhile.

- `header_timeout_s`: a request head (request line and headers) must be complete this long after
  its first byte, or after the connection opened for the first request. Missed: the connection
  is closed (counted "header_timeout").
- `body_timeout_s`: once the head is in, each wait for more of the body is bounded by this (as
  nginx's `client_body_timeout`: the time between two reads, not the whole body). Missed: 408 and
  the connection closed (router/contract/http.py `read_body`, counted "body_timeout").
- An answer sent before the whole body was read (413, 408, 401, ...) is followed by reading and
  dropping the rest of the body for up to LINGER_S, so the client reads the answer rather than a
  reset, then the connection closes unless the body ended meanwhile (413 and 408 close it always).
- `idle_timeout_s`: a keep-alive connection with no request in flight is closed after this long
  (aiohttp's keep-alive timeout).
- `connection_buffer_bytes`: what one connection reads ahead of its handler (a body not asked for
  yet, pipelined requests); past it, reading pauses until the handler takes them.
- `body_buffer_bytes`: request bodies being received, all connections together. A body whose next
  bytes would pass it is refused (503 with Retry-After, counted in `body_buffer_refused`). Once
  they held TRIM_HIGH and are down to TRIM_LOW, the free heap is given back to the system
  (router/contract/free_memory.py), so the memory a burst of stalled bodies took returns.
- `max_connections_per_peer`: a connection past it is closed as soon as it is accepted (counted
  "over_peer_capacity"). `max_connections`: a new connection past it takes the place of the open
  connection that has waited longest on its client (its head or body not complete, or idle between
  requests), which is closed ("displaced"); only when every open connection has a request being
  served is the new one refused ("over_capacity"). Connections from many addresses can hold the
  server for no longer than it takes a newcomer to arrive.

`GuardedRunner` is `web.AppRunner` with these rules; the limits come from the app
(`app[CONNECTION_LIMITS]`, defaults when absent) and what it closed is in `app[CONNECTION_GUARD]`.
aiohttp's side is router/contract/guarded_handler.py; tests/process/test_connections.py and
tests/unit/test_front_cases.py hold the servers to the behaviour.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import resource
from typing import Protocol

from aiohttp import web
from aiohttp.web_server import Server

from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE, at_least
from kvroute.router.contract.free_memory import release_free_memory
from kvroute.router.contract.guarded_handler import GuardedServer
from kvroute.router.contract.malformed import MalformedLog
from kvroute.router.contract.settings import check_settings, setting

FD_HEADROOM = 64  # descriptors kept for everything that is not a client connection
MAX_HEADERS = 128  # header lines a request head may have (aiohttp's default, passed to it explicitly)
LINGER_S = 2.0  # after an answer sent before its whole body: how long the rest is read and dropped before closing
MIB = 1 << 20
TRIM_HIGH = 16 * MIB  # bodies being received held this much at once: once they are down to TRIM_LOW,
TRIM_LOW = MIB        # the free heap goes back to the system (router/contract/free_memory.py)
TRIM_DELAY_S = LINGER_S + 1.0  # after the connections that held them have lingered and closed


def _fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else 1 << 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """connections (docs/router.md#connections)"""

    header_timeout_s: float = setting(10.0, "close a connection whose request head is not complete this long after "
                                            "it began", check=POSITIVE)
    body_timeout_s: float = setting(30.0, "answer 408 and close when a request body sends no byte for this long (as "
                                          "nginx's client_body_timeout)", check=POSITIVE)
    idle_timeout_s: float = setting(75.0, "close a keep-alive connection idle this long", check=POSITIVE)
    connection_buffer_bytes: int = setting(256 << 10, "bytes one connection reads ahead of its handler (a body not "
                                                      "taken yet, pipelined requests); past it, reading pauses",
                                           check=at_least(4096))
    body_buffer_bytes: int = setting(64 * MIB, "request bodies being received, all connections together; a body past "
                                               "it is refused (503 + Retry-After)", check=at_least(MIB))
    max_connections: int = setting(0, "connections at most; a new one past it displaces the connection waiting "
                                      "longest on its client, or is refused when none waits",
                                   check=NOT_NEGATIVE, default_text="0: the descriptor limit less 64")
    max_connections_per_peer: int = setting(1024, "refuse a client address's connections past this many",
                                            check=at_least(1))

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def connection_cap(self) -> int:
        return self.max_connections or max(_fd_limit() - FD_HEADROOM, 1)


class Displaceable(Protocol):
    def displace(self) -> None:
        """Close now, released from the guard at once: a newer connection takes this one's place."""


class ConnectionGuard:
    """Who is connected, who waits on its client, the request bodies being received, and what was
    closed for which rule. Connections tell it when they wait on their client (`wait`, again at
    each sign of progress: the longest waiting goes first) and when a whole request is in hand
    (`work`)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.cap = limits.connection_cap
        self.open = 0
        self.by_peer: collections.Counter[str] = collections.Counter()
        self.closed: collections.Counter[str] = collections.Counter()  # reason -> connections closed
        self.waiting: dict[Displaceable, None] = {}  # connections waiting on their clients, longest first
        self.body_bytes = 0  # request body bytes being received now (read_body)
        self.body_bytes_high = 0  # the most since the heap was last trimmed
        self.body_buffer_refused = 0
        self.malformed = MalformedLog()

    def admit(self, peer: str, conn: Displaceable) -> str | None:
        """Count a new connection in (waiting for its first head), or say why it must be closed."""
        if self.by_peer[peer] >= self.limits.max_connections_per_peer:
            reason = "over_peer_capacity"
        elif self.open >= self.cap and not self._displace_one():
            reason = "over_capacity"
        else:
            self.open += 1
            self.by_peer[peer] += 1
            self.waiting[conn] = None
            return None
        self.closed[reason] += 1
        return reason

    def release(self, peer: str, conn: Displaceable) -> None:
        self.open -= 1
        self.by_peer[peer] -= 1
        if not self.by_peer[peer]:
            del self.by_peer[peer]
        self.waiting.pop(conn, None)

    def wait(self, conn: Displaceable) -> None:
        """`conn` waits on its client from now: the next head, the rest of a body."""
        waiting = self.waiting
        waiting.pop(conn, None)
        waiting[conn] = None

    def work(self, conn: Displaceable) -> None:
        """`conn` has a whole request in hand: never displaced while it is served."""
        self.waiting.pop(conn, None)

    def _displace_one(self) -> bool:
        conn = next(iter(self.waiting), None)  # the one that has waited longest on its client
        if conn is None:
            return False
        self.closed["displaced"] += 1
        conn.displace()
        return True

    def take_body(self, n: int) -> bool:
        """Count `n` more body bytes in, unless they would pass `body_buffer_bytes`."""
        if self.body_bytes + n > self.limits.body_buffer_bytes:
            self.body_buffer_refused += 1
            return False
        self.body_bytes += n
        self.body_bytes_high = max(self.body_bytes_high, self.body_bytes)
        return True

    def give_body(self, n: int) -> None:
        self.body_bytes -= n
        if self.body_bytes <= TRIM_LOW and self.body_bytes_high >= TRIM_HIGH:
            self.body_bytes_high = self.body_bytes
            asyncio.get_running_loop().call_later(TRIM_DELAY_S, release_free_memory)


CONNECTION_LIMITS = web.AppKey("connection_limits", ConnectionLimits)
CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` whose connections follow the app's `ConnectionLimits`."""

    def __init__(self, app: web.Application, **kwargs) -> None:
        limits = app.get(CONNECTION_LIMITS) or ConnectionLimits()
        kwargs.setdefault("keepalive_timeout", limits.idle_timeout_s)
        kwargs.setdefault("max_headers", MAX_HEADERS)
        kwargs.setdefault("lingering_time", LINGER_S)
        kwargs.setdefault("read_bufsize", limits.connection_buffer_bytes // 2)  # aiohttp pauses at twice this
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(limits)
        app[CONNECTION_GUARD] = self.guard

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        return GuardedServer(self.guard, server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation, loop=server._loop, **server._kwargs)
