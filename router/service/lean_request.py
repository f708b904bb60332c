"""One request as the lean front (router/service/lean_server.py) hands it to the app: what the
app's middlewares and handlers, `read_body` and aiohttp's response classes read of a
`web.Request`, and nothing else."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_writer import HttpVersion11, StreamWriter

from router.service.upstream import Headers


class LeanBody:
    """The request body, `read(n)` as aiohttp's `request.content` answers it: up to `n` bytes per
    call once the body is in, b"" at its end. Until the handler first reads (after it checked the
    body's size, router/contract/http.py `read_body`), the connection holds at most `hold` bytes of
    it: `held_enough` tells the connection to stop reading, and the first `read` calls `resume`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, length: int, hold: int = 1 << 20,
                 resume=lambda: None) -> None:
        self.left = length
        self.hold = hold
        self.reading = False
        self.buffered = 0
        self._resume = resume
        self._parts: list[bytes] = []
        self._data = b""
        self._offset = 0
        self._done = loop.create_future()
        if not length:
            self._done.set_result(None)

    @property
    def held_enough(self) -> bool:
        return not self.reading and self.buffered >= self.hold

    def feed(self, data: bytes) -> bytes:
        """Take the body's share of `data`; the bytes after the body are returned."""
        take = data[: self.left] if len(data) > self.left else data
        self._parts.append(take)
        self.buffered += len(take)
        self.left -= len(take)
        if not self.left:
            self._data = b"".join(self._parts)
            self._parts = []
            self._done.set_result(None)
        return data[len(take):]

    @property
    def complete(self) -> bool:
        return not self.left

    async def read(self, n: int = -1) -> bytes:
        if not self.reading:
            self.reading = True
            self._resume()
        if not self._done.done():
            await asyncio.shield(self._done)
        start = self._offset
        end = len(self._data) if n < 0 else min(len(self._data), start + n)
        self._offset = end
        return self._data[start:end] if start or end < len(self._data) else self._data


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
