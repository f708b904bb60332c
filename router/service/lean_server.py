"""A lean HTTP/1.1 front for the router's proxy path, on the same socket as aiohttp's server.

`POST /v1/completions` and `POST /v1/chat/completions` (HTTP/1.1, a Content-Length body or
none) are read by an asyncio protocol, the head parsed by httptools (llhttp), and run through
the app's own middlewares (errors, keys) and handlers; the answer is written by aiohttp's own
response classes (a stream unbuffered, with back-pressure). Every other request, and whatever
this front does not take (HTTP/1.0, chunked or `Expect` bodies, upgrades, heads over 8190 bytes
or malformed), goes with its connection to aiohttp's server, which reads its bytes as sent.

The connection rules of router/contract/connections.py hold on both: one ConnectionGuard (caps at
accept, the request-head deadline), the idle keep-alive timeout; a client that hangs up cancels
its handler, as aiohttp's `handler_cancellation` does, so it ends `cancelled`, never the
engine's fault. A body the handler has not asked for yet (it checks the size first) is held
to MAX_PENDING bytes, then reading pauses until it does. One difference: an answer sent before the
whole body was read (413) ends the connection (aiohttp reads the rest and keeps it): the answer
goes out with `Connection: close`, then the connection stops writing and reads and drops the rest
of the body for up to LINGER_S before it closes, so the client reads the answer instead of a reset
(closing with the client's bytes unread would send one). Pipelined requests wait for the one in
flight, as on aiohttp.
Without httptools the router serves everything with aiohttp (`available()`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_writer import StreamWriter

from router.contract.connections import ConnectionGuard
from router.service.lean_request import LeanBody, LeanRequest
from router.service.upstream import Headers

try:
    import httptools
except ImportError:  # pragma: no cover - httptools is a dependency; aiohttp serves without it
    httptools = None

log = logging.getLogger(__name__)

MAX_HEAD = 8190  # aiohttp's line limit: a longer head is aiohttp's to judge
MAX_PENDING = 1 << 20  # pipelined bytes, or body bytes not yet asked for, held for a request; past it, reading pauses
SHUTDOWN_S = 5.0  # what requests in flight get to finish when the server stops (as run_app's aiohttp)
REFUSED_HEADERS = ("transfer-encoding", "expect", "upgrade")
LINGER_S = 2.0  # after an answer sent before its whole body: how long the rest is read and dropped
Handler = Callable[[LeanRequest], Awaitable[web.StreamResponse]]


def available() -> bool:
    return httptools is not None


def with_middlewares(app: web.Application, handler) -> Handler:
    """`handler` wrapped in the app's middlewares, outermost first, as aiohttp runs them."""
    for middleware in reversed(app.middlewares):
        handler = functools.partial(middleware, handler=handler)
    return handler


def whole_response(resp: web.StreamResponse, keep_alive: bool) -> bytes | None:
    """A plain `web.Response` with a bytes body, as aiohttp writes it to an HTTP/1.1 client (status
    line, its headers, Content-Length, Date, Server, `Connection: close` when not kept alive), in
    one buffer; None for anything else (a stream, a payload, cookies, compression), which aiohttp's
    own classes write."""
    # `resp.cookies` would make an empty cookie jar per answer (aiohttp makes it on first read)
    if type(resp) is not web.Response or resp.prepared or getattr(resp, "_cookies", None) or resp.compression:
        return None
    body = resp.body
    if not isinstance(body, bytes) or resp.keep_alive is False:
        return None
    lines = [f"HTTP/1.1 {resp.status} {resp.reason}"]
    seen = set()
    for name, value in resp.headers.items():
        if "\n" in value or "\r" in value:
            return None  # a header value with a line break: aiohttp's writer refuses it
        lower = name.lower()
        seen.add(lower)
        if lower != "content-length":
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    if body and "content-type" not in seen:
        lines.append("Content-Type: application/octet-stream")
    if "date" not in seen:
        lines.append(f"Date: {rfc822_formatted_time()}")
    if "server" not in seen:
        lines.append(f"Server: {SERVER_SOFTWARE}")
    if not keep_alive:
        lines.append("Connection: close")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8") + body


class _Head:
    """httptools' callbacks for one request head."""

    __slots__ = ("url", "headers")

    def __init__(self) -> None:
        self.url = b""
        self.headers = Headers()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))


class LeanFront:
    """What the lean connections share: the app, its wrapped handlers by path, the guard,
    aiohttp's protocol factory for the requests handed over, and the open connections."""

    def __init__(self, app: web.Application, handlers: dict[str, Handler], guard: ConnectionGuard,
                 aiohttp_server: Callable[[], asyncio.Protocol], idle_timeout_s: float) -> None:
        self.app, self.guard, self.aiohttp_server = app, guard, aiohttp_server
        self.handlers = {path: with_middlewares(app, h) for path, h in handlers.items()}
        self.idle_timeout_s = idle_timeout_s
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
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        if self.front.guard.admit(peer) is not None:
            transport.abort()  # refused before anything was read
            return
        self.peer = peer
        self.front.connections.add(self)
        self._await_head()

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        self._stop_timers()
        self.front.connections.discard(self)
        if self.peer is not None:
            self.front.guard.release(self.peer)
            self.peer = None
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its request ends cancelled

    def data_received(self, data: bytes) -> None:
        if self.linger_left is not None:  # the answer is out: the rest of its body is dropped
            self.linger_left -= len(data)
            if self.linger_left <= 0:
                self.close()
            return
        if self.task is not None:  # a request in flight: its body, then what comes after it
            if self.body is not None and not self.body.complete:
                data = self.body.feed(data)
                if self.body.held_enough and self.transport is not None:
                    self.transport.pause_reading()  # nothing more until the handler has checked its size
            self.pending += data
            if len(self.pending) > MAX_PENDING and self.transport is not None:
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
            if len(buf) > MAX_HEAD:
                return self._hand_over(buf)
            if self.head_deadline is None:  # the next request on a kept-alive connection began, in pieces
                self._await_head()
            self.buf = buf
            return
        self.buf = b""
        head = self._parse(buf[: end + 4]) if end + 4 <= MAX_HEAD else None
        if head is None:
            return self._hand_over(buf)
        handler, path, headers, length, keep_alive = head
        if self.head_deadline is not None:  # a head that came whole needs none (none is made for it)
            self.head_deadline.cancel()
            self.head_deadline = None
        self.body = body = LeanBody(self._loop, length or 0, hold=MAX_PENDING, resume=self._resume_body)
        rest = body.feed(buf[end + 4:]) if length else buf[end + 4:]
        self.pending = rest
        request = LeanRequest(app=self.front.app, path=path, headers=headers, length=length,
                              keep_alive=keep_alive, writer=StreamWriter(self, self._loop), body=body)
        self.task = request.task = self._loop.create_task(self._serve(handler, request))

    def _parse(self, head: bytes):
        """(handler, path, headers, Content-Length, keep-alive) of a head this front serves, else None."""
        callbacks = _Head()
        parser = httptools.HttpRequestParser(callbacks)
        try:
            parser.feed_data(head)
        except httptools.HttpParserError:
            return None
        path = callbacks.url.decode("latin-1")
        handler = self.front.handlers.get(path)
        headers = callbacks.headers
        if (handler is None or parser.get_method() != b"POST" or parser.get_http_version() != "1.1"
                or not headers.keys().isdisjoint(REFUSED_HEADERS)):
            return None
        length = dict.get(headers, "content-length")  # names are lower-cased already
        return handler, path, headers, int(length) if length is not None else None, parser.should_keep_alive()

    async def _serve(self, handler: Handler, request: LeanRequest) -> None:
        try:
            resp = await handler(request)
            keep_alive = request.keep_alive
            whole = whole_response(resp, keep_alive)
            if whole is not None:
                if self.transport is None or self.transport.is_closing():
                    return
                self.transport.write(whole)
            else:
                if not resp.prepared:
                    await resp.prepare(request)
                await resp.write_eof()
                keep_alive = resp.keep_alive
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
        if len(pending) > MAX_PENDING:
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
        self._stop_timers()  # an idle check armed in an earlier spell: lingering ends the connection
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.idle = self._loop.call_later(LINGER_S, self.close)

    def _resume_body(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and not self.transport.is_reading():
            self.transport.resume_reading()

    def _hand_over(self, buf: bytes) -> None:
        """This connection is aiohttp's from here on, starting with the bytes of `buf`."""
        self._stop_timers()
        self.front.connections.discard(self)
        transport = self.transport
        self.front.guard.release(self.peer)  # aiohttp's handler counts it in again, at once
        self.peer = None
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
                 handlers: dict[str, Handler], host: str = "127.0.0.1", port: int = 0) -> None:
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
        guard = runner.guard
        self.front = front = LeanFront(runner.app, self._handlers, guard, runner.server, guard.limits.idle_timeout_s)
        where = dict(sock=self._sock) if self._sock is not None else dict(host=self._host, port=self._port,
                                                                             reuse_address=True)
        self._server = await loop.create_server(lambda: LeanConnection(front, loop), backlog=self._backlog, **where)

    async def stop(self) -> None:
        await super().stop()
        if self.front is not None:
            await self.front.shutdown(SHUTDOWN_S)
