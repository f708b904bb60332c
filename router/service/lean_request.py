"""One request as the lean front (router/service/lean_server.py) hands it to the app: what the
app's middlewares and handlers, `read_body` and aiohttp's response classes read of a
`web.Request`, and nothing else."""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web
from aiohttp.http_writer import HttpVersion11, StreamWriter

from kvroute.router.service.upstream import Headers


class LeanBody:
    """The request body as aiohttp's `request.content` gives it to router/contract/http.py `read_body`:
    `read_nowait()` what has arrived, `readany()` waits for more, `at_eof()` once all of it was read.
    The connection feeds it; while `hold` bytes or more are unread, `held_enough` tells the connection
    to stop reading, and the read that takes them calls `resume`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, length: int, hold: int = 1 << 20,
                 resume=lambda: None) -> None:
        self.left = length
        self.hold = hold
        self.unread = 0
        self._loop = loop
        self._resume = resume
        self._parts: list[bytes] = []
        self._waiter: asyncio.Future | None = None

    @property
    def held_enough(self) -> bool:
        return self.unread >= self.hold

    @property
    def complete(self) -> bool:
        return not self.left

    def feed(self, data: bytes) -> bytes:
        """Take the body's share of `data`; the bytes after the body are returned."""
        take = data[: self.left] if len(data) > self.left else data
        if take:
            self._parts.append(take)
            self.unread += len(take)
            self.left -= len(take)
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        return data[len(take):]

    def is_eof(self) -> bool:
        """The whole body has arrived (read or not), as aiohttp's StreamReader says it."""
        return not self.left

    def at_eof(self) -> bool:
        return not self.left and not self._parts

    def read_nowait(self) -> bytes:
        parts = self._parts
        if not parts:
            return b""
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._parts = []
        held, self.unread = self.unread, 0
        if held >= self.hold:
            self._resume()
        return data

    async def readany(self) -> bytes:
        if not self._parts and self.left:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while not self.at_eof():
            parts.append(await self.readany())
        return b"".join(parts)


class LeanRequest:
    """An HTTP/1.1 POST read by the lean front, for the app's handlers and middlewares."""

    version = HttpVersion11
    method = "POST"

    def __init__(self, *, app: web.Application, path: str, headers: Headers, length: int | None,
                 keep_alive: bool, writer: StreamWriter, body: LeanBody) -> None:
        self.app, self.path, self.headers = app, path, headers
        self.content_length = length
        self.content = body
        self._keep_alive = keep_alive
        self._payload_writer = writer
        self.task: asyncio.Task | None = None
        self._state: dict = {}  # what middlewares store on the request (`request[key]`), as aiohttp's

    def __getitem__(self, key):
        return self._state[key]

    def __setitem__(self, key, value) -> None:
        self._state[key] = value

    def __contains__(self, key) -> bool:
        return key in self._state

    def get(self, key, default=None):
        return self._state.get(key, default)

    @property
    def keep_alive(self) -> bool:
        """Kept alive only when the client asked and its whole body was read: an answer sent before
        the body (413) closes the connection."""
        return self._keep_alive and self.content.complete

    async def _prepare_hook(self, response: web.StreamResponse) -> None:  # aiohttp's signal hook: none here
        return None


def with_middlewares(app: web.Application, handler):
    """`handler` wrapped in the app's middlewares, outermost first, as aiohttp runs them."""
    for middleware in reversed(app.middlewares):
        handler = functools.partial(middleware, handler=handler)
    return handler
