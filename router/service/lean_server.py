"""A lean HTTP/1.1 front for the router's proxy path, on the same socket as aiohttp's server.

`POST /v1/completions` and `POST /v1/chat/completions` (HTTP/1.1, a Content-Length body or
none) are read by an asyncio protocol, the head parsed by httptools (llhttp), and run through
the app's own middlewares (errors, keys) and handlers; the answer is written by aiohttp's own
response classes (a stream unbuffered, with back-pressure). Every other request, and whatever
this front does not take, goes with its connection to aiohttp's server, which reads its bytes as
sent and answers as it answers any client: HTTP/1.0, chunked or `Expect` bodies, `Upgrade:` and
CONNECT, heads over 8190 bytes, more than MAX_HEADERS headers, a header named twice, no Host, a
bare LF line end, and whatever llhttp refuses. So both fronts answer the same to the same bytes
(tests/unit/test_front_parity.py sends each case to both).

The connection rules of router/contract/connections.py hold on both: one ConnectionGuard (caps at
accept and the displacement of the connection waiting longest on its client, the request-head
deadline), the idle keep-alive timeout; the body timeout and the cap on bodies being received are
read_body's (router/contract/http.py). A client that hangs up cancels its handler, as aiohttp's
`handler_cancellation` does, so it ends `cancelled`, never the engine's fault. Body bytes the
handler has not taken yet are held to --connection-buffer-bytes, then reading pauses until it takes
them. An answer sent before the whole body was read (413, 408) ends the connection, as on aiohttp
(the error middleware closes it there): the answer goes out with `Connection: close`, then the
connection stops writing and reads and drops the rest of the body for up to LINGER_S before it
closes, so the client reads the answer instead of a reset (closing with the client's bytes unread
would send one).
Pipelined requests wait for the one in flight, as on aiohttp.
Without httptools the router serves everything with aiohttp (`available()`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import StreamWriter

from kvroute.router.contract.connections import LINGER_S, ConnectionGuard, GuardedRunner
from kvroute.router.contract.guarded_handler import peer_of
from kvroute.router.service.lean_head import MAX_HEAD, bare_lf, httptools, parse_head
from kvroute.router.service.lean_request import LeanBody, LeanRequest, with_middlewares
from kvroute.router.service.lean_response import whole_response

log = logging.getLogger(__name__)

SHUTDOWN_S = 5.0  # what requests in flight get to finish when the server stops (as run_app's aiohttp)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]  # the app's; called with a LeanRequest


def available() -> bool:
    return httptools is not None


class LeanFront:
    """What the lean connections share: the app, its wrapped handlers by path, the guard,
    aiohttp's protocol factory for the requests handed over, and the open connections."""

    def __init__(self, app: web.Application, handlers: Mapping[str, Handler], guard: ConnectionGuard,
                 aiohttp_server: Callable[[], asyncio.Protocol]) -> None:
        self.app, self.guard, self.aiohttp_server = app, guard, aiohttp_server
        self.handlers = {path: with_middlewares(app, h) for path, h in handlers.items()}
        self.idle_timeout_s = guard.limits.idle_timeout_s
        self.max_pending = guard.limits.connection_buffer_bytes  # read ahead of a handler; past it, reading pauses
        self.connections: set[LeanConnection] = set()
        self.served = 0  # requests answered here (the rest were aiohttp's)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections now; give those with a request in flight `timeout_s` to end."""
        tasks = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        for conn in list(self.connections):
            if conn.task is None or conn.task.done():
                conn.close()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
        for conn in list(self.connections):
            conn.close()


class LeanConnection(BaseProtocol):
    """One client connection: requests on the proxy path served here, one at a time."""

    def __init__(self, front: LeanFront, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.front = front
        self.peer: str | None = None
        self.buf = b""  # bytes of the next request head
        self.pending = b""  # bytes after the body of the request in flight (pipelined)
        self.body: LeanBody | None = None
        self.task: asyncio.Task | None = None
        self.head_deadline: asyncio.TimerHandle | None = None
        self.idle: asyncio.TimerHandle | None = None  # the keep-alive timeout's check, or the end of lingering
        self.idle_since: float | None = None  # loop time the connection last went idle; None while busy
        self.linger_left: int | None = None  # body bytes still to drop after an early answer

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = peer_of(transport)
        if self.front.guard.admit(peer, self) is not None:
            transport.abort()  # refused before anything was read
            return
        self.peer = peer
        self.front.connections.add(self)
        self._await_head()

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        self._stop_timers()
        self.front.connections.discard(self)
        self._release()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its request ends cancelled

    def displace(self) -> None:
        """A newer connection takes this one's place (router/contract/connections.py)."""
        self._release()
        if self.transport is not None:
            self.transport.abort()

    def _release(self) -> None:
        if self.peer is not None:
            self.front.guard.release(self.peer, self)
            self.peer = None

    def data_received(self, data: bytes) -> None:
        if self.linger_left is not None:  # the answer is out: the rest of its body is dropped
            self.linger_left -= len(data)
            if self.linger_left <= 0:
                self.close()
            return
        if self.task is not None:  # a request in flight: its body, then what comes after it
            body = self.body
            if body is not None and not body.complete:
                data = body.feed(data)
                if body.held_enough and self.transport is not None:
                    self.transport.pause_reading()  # nothing more until the handler takes what it has
                self._waiting(not body.complete)
            self.pending += data
            if len(self.pending) > self.front.max_pending and self.transport is not None:
                self.transport.pause_reading()
            return
        self._next(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- one request -------------------------------------------------------------------

    def _next(self, data: bytes) -> None:
        self.idle_since = None  # busy: the keep-alive check, if armed, finds it so and lets go
        buf = self.buf + data if self.buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD or bare_lf(self.buf[-1:], data):
                return self._hand_over(buf)
            if self.head_deadline is None:  # the next request on a kept-alive connection began, in pieces
                self._await_head()
            self.buf = buf
            self._waiting(True)
            return
        self.buf = b""
        head = parse_head(buf[: end + 4], self.front.handlers) if end + 4 <= MAX_HEAD else None
        if head is None:
            return self._hand_over(buf)
        path, headers, length, keep_alive = head
        if self.head_deadline is not None:  # a head that came whole needs none (none is made for it)
            self.head_deadline.cancel()
            self.head_deadline = None
        self.body = body = LeanBody(self._loop, length or 0, hold=self.front.max_pending, resume=self._resume_body)
        rest = body.feed(buf[end + 4:]) if length else buf[end + 4:]
        self.pending = rest
        self._waiting(not body.complete)
        request = LeanRequest(app=self.front.app, path=path, headers=headers, length=length,
                              keep_alive=keep_alive, writer=StreamWriter(self, self._loop), body=body)
        self.task = request.task = self._loop.create_task(self._serve(self.front.handlers[path], request))

    async def _serve(self, handler: Handler, request: LeanRequest) -> None:
        as_request = cast(web.Request, request)  # a LeanRequest has what the handlers and prepare() read
        try:
            resp = await handler(as_request)
            keep_alive = request.keep_alive
            whole = whole_response(resp, keep_alive)
            if whole is not None:
                if self.transport is None or self.transport.is_closing():
                    return
                self.transport.write(whole)
            else:
                if not resp.prepared:
                    await resp.prepare(as_request)
                await resp.write_eof()
                keep_alive = bool(resp.keep_alive)  # prepared: a bool
            self.front.served += 1
        except asyncio.CancelledError:
            return
        except (ConnectionResetError, RuntimeError):  # the client left while the answer was written
            self.close()
            return
        except Exception:  # the error middleware answers everything else: this is a bug
            log.exception("unexpected error serving %s", request.path)
            self.close()
            return
        self._done(keep_alive)

    def _done(self, keep_alive: bool) -> None:
        body = self.body
        self.task = None
        self.body = None
        if self.transport is None or self.transport.is_closing():
            return
        if body is not None and not body.complete:
            return self._linger(body.left)
        if not keep_alive:
            self.close()
            return
        pending, self.pending = self.pending, b""
        if len(pending) > self.front.max_pending:
            self.transport.resume_reading()
        if pending:
            self._next(pending)
        else:
            self._rest()

    def _rest(self) -> None:
        """Idle from now: closed after --idle-timeout-s unless a request comes first. One timer per
        idle spell at most, checked lazily: a request that comes meanwhile only marks the connection
        busy (no timer made and cancelled per request); the check, when it fires, re-arms for what
        is left of the latest idle spell, or lets go while busy (the next spell arms it again)."""
        self.idle_since = now = self._loop.time()
        self._waiting(True)
        if self.idle is None:
            self.idle = self._loop.call_at(now + self.front.idle_timeout_s, self._idle_check)

    def _idle_check(self) -> None:
        self.idle = None
        since = self.idle_since
        if since is None:
            return
        left = since + self.front.idle_timeout_s - self._loop.time()
        if left <= 0:
            self.close()
        else:
            self.idle = self._loop.call_later(left, self._idle_check)

    def _linger(self, left: int) -> None:
        """The answer went out before `left` more body bytes: stop writing, read and drop them
        (LINGER_S at most), then close."""
        self.linger_left = left
        self._waiting(True)
        self._stop_timers()  # an idle check armed in an earlier spell: lingering ends the connection
        assert self.transport is not None  # _done checked it
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.idle = self._loop.call_later(LINGER_S, self.close)

    def _waiting(self, on_client: bool) -> None:
        """Tell the guard whether this connection waits on its client (a head or body not complete,
        idle), or has a whole request in hand."""
        if self.peer is not None:
            if on_client:
                self.front.guard.wait(self)
            else:
                self.front.guard.work(self)

    def _resume_body(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and not self.transport.is_reading():
            self.transport.resume_reading()

    def _hand_over(self, buf: bytes) -> None:
        """This connection is aiohttp's from here on, starting with the bytes of `buf`."""
        self._stop_timers()
        self.front.connections.discard(self)
        transport = self.transport
        assert transport is not None  # the bytes being handed over came in on it
        self._release()  # aiohttp's handler counts it in again, at once
        handler = self.front.aiohttp_server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if buf:
            handler.data_received(buf)

    # -- timers ------------------------------------------------------------------------

    def _await_head(self) -> None:
        self.head_deadline = self._loop.call_later(self.front.guard.limits.header_timeout_s, self._head_missed)

    def _head_missed(self) -> None:
        self.head_deadline = None
        self.front.guard.closed["header_timeout"] += 1
        if self.transport is not None:
            self.transport.abort()

    def _stop_timers(self) -> None:
        for timer in (self.head_deadline, self.idle):
            if timer is not None:
                timer.cancel()
        self.head_deadline = self.idle = None


class LeanSite(web.BaseSite):
    """A site (on a bound socket, or host and port) whose connections meet the lean front first
    (`handlers`: path -> the app's handler for the proxy paths); the runner must be a
    GuardedRunner, whose guard both share."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket | None = None, *,
                 handlers: Mapping[str, Handler], host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(runner)
        self._sock, self._host, self._port = sock, host, port
        self._handlers = handlers
        self.front: LeanFront | None = None

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2] if self._sock is not None else (self._host, self._port)
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        runner = self._runner
        assert isinstance(runner, GuardedRunner) and runner.server is not None  # see the class docstring; started
        guard = runner.guard
        self.front = front = LeanFront(runner.app, self._handlers, guard, runner.server)
        where = dict(sock=self._sock) if self._sock is not None else dict(host=self._host, port=self._port,
                                                                             reuse_address=True)
        self._server = await loop.create_server(lambda: LeanConnection(front, loop), backlog=self._backlog, **where)

    async def stop(self) -> None:
        await super().stop()
        if self.front is not None:
            await self.front.shutdown(SHUTDOWN_S)
