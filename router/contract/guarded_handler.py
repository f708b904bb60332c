"""aiohttp's request handler under the connection rules of router/contract/connections.py.

It hooks aiohttp's `RequestHandler` where a connection opens, receives bytes, finishes an answer
and answers a malformed request, and reads its queue of parsed requests (`_messages`), count of
parsed heads (`_request_count`) and whether a handler runs (`_request_in_progress`):

- the caps at accept, and the place a displaced connection gives up;
- the deadline on each request head;
- whether the connection waits on its client (a head or body not complete, idle between requests)
  or has a whole request in hand, for the guard's choice of whom to displace;
- a malformed request (aiohttp answers 400 and closes) counted by reason and logged once per window
  (router/contract/malformed.py), not a traceback each.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

if TYPE_CHECKING:
    from kvroute.router.contract.connections import ConnectionGuard


def peer_of(transport: asyncio.BaseTransport) -> str:
    peername = transport.get_extra_info("peername")
    return str(peername[0]) if isinstance(peername, tuple) and peername else "?"


class GuardedHandler(RequestHandler):
    """aiohttp's handler, plus a deadline on each request head, the caps, and the waiting state."""

    def __init__(self, guard: ConnectionGuard, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._peer: str | None = None  # set while the guard counts this connection
        self._made = False
        self._head_deadline: asyncio.TimerHandle | None = None
        self._payload: StreamReader | None = None  # the body of the request last parsed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = peer_of(transport)
        if self._guard.admit(peer, self) is not None:
            cast(asyncio.Transport, transport).abort()  # refused before aiohttp sees it: nothing was read or parsed
            return
        self._peer = peer
        self._made = True
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is None and self._between_requests():
            self._await_head()  # the first byte of the next request on a kept-alive connection
        heads = self._request_count
        super().data_received(data)
        if self._request_count > heads:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            self._payload = self._messages[-1][1] if self._messages else None
        if self._peer is None:
            return
        if self._head_deadline is None and self._payload is not None and self._payload.is_eof():
            self._guard.work(self)
        else:
            self._guard.wait(self)  # a head or a body not complete yet: progress, it goes to the back

    def _between_requests(self) -> bool:
        """No request queued or in progress, and the last one's body read (not lingering after an
        early answer, when the bytes that come are that body's)."""
        payload = self._payload
        return (not self._messages and not self._request_in_progress
                and (payload is None or payload.is_eof()))

    def log_access(self, request, response, time) -> None:
        super().log_access(request, response, time)
        if not self._messages and self._peer is not None:  # the answer is out: idle (or lingering)
            self._guard.wait(self)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None, message: str | None = None):
        if isinstance(exc, HttpProcessingError):
            self._guard.malformed.note(exc, self._peer or "?")
        return super().handle_error(request, status, exc, message)

    def log_exception(self, *args, **kw) -> None:
        if isinstance(kw.get("exc_info"), HttpProcessingError):
            return  # counted and logged by handle_error, once per window
        super().log_exception(*args, **kw)

    def displace(self) -> None:
        self._release()
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._made:
            return  # refused in connection_made
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        if self._peer is not None:
            self._guard.release(self._peer, self)
            self._peer = None

    def _await_head(self) -> None:
        self._head_deadline = self._loop.call_later(self._guard.limits.header_timeout_s, self._head_missed)

    def _head_missed(self) -> None:
        self._head_deadline = None
        self._guard.closed["header_timeout"] += 1
        if self.transport is not None:
            self.transport.abort()


class GuardedServer(Server):
    def __init__(self, guard: ConnectionGuard, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self._guard, self, loop=self._loop, **self._kwargs)
