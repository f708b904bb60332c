"""The few HTTP calls the fleet makes to an engine: discovery and load polling, bounded by the connect
timeout, and the event feeds' reads of /kv/events and /kv/snapshot (router/kvevents/engine_feed.py).

GETs of plain http:// engines (these and the feeds) go through a `LeanGet` when one is given (the router
passes its lean keep-alive client, router/service/upstream.py): a load poll, 40 a second on 4 engines at the default
--load-interval-s, costs the router about half the CPU it costs through aiohttp's client (the figures, and
the command that measures them: docs/router.md, "Failures and timeouts")."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Protocol
from urllib.parse import urlencode, urlsplit

import aiohttp
import orjson

from kvroute.router.fleet.upstream_errors import BadAnswer

MAX_BODY_BYTES = 8 * 1024 * 1024  # a /metrics page or a /v1/models list; more is not an engine's answer


class NotServed(ValueError):
    """The engine answered, but not this path (404/405/501): try another way."""


class LeanAnswer(Protocol):
    status: int

    async def read(self, n: int = -1) -> bytes: ...

    def close(self) -> None: ...


class LeanGet(Protocol):
    """A keep-alive HTTP/1.1 client for plain http:// engines; errors are aiohttp's types."""

    async def get(self, host: str, port: int, path: str, connect_timeout_s: float,
                  read_timeout_s: float | None) -> LeanAnswer: ...


@functools.lru_cache(maxsize=1024)
def plain_target(url: str) -> tuple[str, int, str] | None:
    """(host, port, path with query) of a plain http:// URL, port 80 when it names none: what the
    router's lean keep-alive client sends to (load polls, event feeds, the proxy's requests). None for
    any other (https, credentials in the URL, no host, a bad port): aiohttp sends those, or says why not."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.username or parts.password:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _check_status(method: str, url: str, status: int) -> None:
    """NotServed for a path the engine does not serve, ValueError for any other answer than 200."""
    if status in (404, 405, 501):
        raise NotServed(f"{method} {url} answered HTTP {status}")
    if status != 200:
        raise ValueError(f"{method} {url} answered HTTP {status}")


def _bounded(method: str, url: str, body: bytes) -> bytes:
    """`body`, read to MAX_BODY_BYTES + 1: ValueError when it is over the bound."""
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"{method} {url} answered more than {MAX_BODY_BYTES} bytes")
    return body


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineHTTP:
    session: aiohttp.ClientSession | None  # None: a cluster driven by hand (tests), that fetches nothing
    timeout_s: float
    lean: LeanGet | None = None  # plain http:// GETs (load polls, discovery); None: all through `session`

    async def _read(self, method: str, url: str, json: dict | None = None) -> bytes:
        target = plain_target(url) if self.lean is not None and method == "GET" else None
        if target is not None:
            return await self._lean_get(url, *target)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        assert self.session is not None, "made without a session: nothing is fetched"
        async with self.session.request(method, url, json=json, timeout=timeout) as r:
            _check_status(method, url, r.status)
            return _bounded(method, url, await r.content.read(MAX_BODY_BYTES + 1))

    async def _lean_get(self, url: str, host: str, port: int, path: str) -> bytes:
        """`_read` of a GET through the lean client: the same checks, the same errors, the same bound."""
        assert self.lean is not None
        async with asyncio.timeout(self.timeout_s):
            r = await self.lean.get(host, port, path, self.timeout_s, None)
            try:
                _check_status("GET", url, r.status)
                body = await r.read(MAX_BODY_BYTES + 1)
            finally:
                r.close()
        return _bounded("GET", url, body)

    async def text(self, url: str) -> str:
        return (await self._read("GET", url)).decode("utf-8", errors="replace")

    async def json(self, url: str, body: dict | None = None) -> dict | list:
        raw = await self._read("POST" if body is not None else "GET", url, body)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"{url} did not answer JSON: {e}") from None

    async def feed(self, url: str, path: str, params: dict | None = None, wait_s: float = 0.0) -> dict:
        """GET one of a kvroute engine's feed endpoints (/kv/events, a long poll of up to `wait_s`;
        /kv/snapshot): its JSON, whole (a snapshot is the engine's whole cache, so no size cap here).
        BadAnswer for an error status or a body that is not JSON."""
        target = plain_target(url + path) if self.lean is not None else None
        if target is not None:
            return await self._lean_feed(path, *target, params, wait_s)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + wait_s)
        assert self.session is not None, "made without a session: nothing is fetched"
        async with self.session.get(url + path, params=params or None, timeout=timeout) as r:
            if r.status != 200:
                raise BadAnswer(f"GET {path} answered HTTP {r.status}")
            try:
                return await r.json(content_type=None, loads=orjson.loads)
            except ValueError:
                raise BadAnswer(f"GET {path} did not answer JSON") from None

    async def _lean_feed(self, path: str, host: str, port: int, target: str, params: dict | None,
                         wait_s: float) -> dict:
        """`feed` through the lean client: the same bound, the same BadAnswer."""
        assert self.lean is not None
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        async with asyncio.timeout(self.timeout_s + wait_s):
            r = await self.lean.get(host, port, target, self.timeout_s, None)
            try:
                if r.status != 200:
                    raise BadAnswer(f"GET {path} answered HTTP {r.status}")
                raw = await r.read()
            finally:
                r.close()
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise BadAnswer(f"GET {path} did not answer JSON") from None


async def optional(awaitable, default):
    """What an optional probe returns, or `default` when the engine does not serve it usefully."""
    try:
        return await awaitable
    except ValueError:
        return default
