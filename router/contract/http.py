"""aiohttp edge helpers shared by engine and router: JSON responses, error mapping, SSE."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import time
from collections.abc import Callable

import orjson
from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from kvroute.router.contract.connections import CONNECTION_GUARD, ConnectionGuard, ConnectionLimits
from kvroute.router.contract.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    KVRouteError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    Unavailable,
)

log = logging.getLogger(__name__)

STATUS = {PayloadTooLarge: 413, RequestTimeout: 408, BadRequest: 400, Unauthorized: 401, Forbidden: 403, NotFound: 404,
          Conflict: 409, Unavailable: 503}
READ_CHUNK = 1 << 16
STARTED = web.RequestKey("started", web.StreamResponse)  # a streamed answer whose head was sent (prepare_client)
CONTROL_BODY_LIMIT = 1 << 20  # admin, transfer and tokenize bodies


def status_of(exc: KVRouteError) -> int:
    if isinstance(exc, Overloaded):
        return 429 if exc.too_many else 503
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def json_response(data, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def error_response(exc: KVRouteError, headers: dict | None = None) -> web.Response:
    headers = dict(headers or {})
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return json_response(exc.to_dict(), status=status_of(exc), headers=headers)


class ClientGone(Exception):
    """The client closed its connection mid-response; nobody else is at fault."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("client closed the connection")
        self.response = response


async def prepare_client(resp: web.StreamResponse, request: web.Request) -> None:
    """Send a streamed response's headers; ClientGone if the client has left (its connection
    may be closing before aiohttp has cancelled the handler)."""
    try:
        await resp.prepare(request)
    except ConnectionResetError:
        raise ClientGone(resp) from None
    request[STARTED] = resp


async def write_client(resp: web.StreamResponse, data: bytes | None = None) -> None:
    """Write to the client (`None`: end the response); ClientGone if it has left."""
    try:
        if data is None:
            await resp.write_eof()
        else:
            await resp.write(data)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one too
        raise ClientGone(resp) from None


def make_error_middleware(on_error: Callable[[int], None] | None = None):
    """Every error leaves as an OpenAI-shaped body; anything unexpected is a logged 500, or,
    in a stream whose head was sent already, an SSE error event and [DONE] ending it (a
    second answer on the connection would leave the client waiting for the rest of the
    first). An error answered before the whole body was read closes the connection (after the
    lingering of router/contract/connections.py), on either front. A client that left gets its
    (already started) response back, which aiohttp closes quietly: no traceback for a client
    that hangs up. `on_error(status)` is told of every error answered here (the router counts
    the requests it rejects itself)."""

    def answered(request: web.Request, response: web.Response) -> web.Response:
        if on_error is not None:
            on_error(response.status)
        if not request.content.is_eof():  # answered before the whole body (413, 408, 401): the connection
            response.force_close()        # reads and drops the rest for LINGER_S, then closes
        return response

    @web.middleware
    async def error_middleware(request: web.Request, handler):
        try:
            return await handler(request)
        except ClientGone as gone:
            return gone.response
        except KVRouteError as exc:
            return answered(request, error_response(exc))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            err = NotFound(exc.reason) if exc.status == 404 else KVRouteError(exc.reason)
            if exc.status == 413:
                err = PayloadTooLarge(exc.reason)
            return answered(request, json_response(err.to_dict(), status=exc.status))
        except asyncio.CancelledError:
            raise  # the client left before any answer (aiohttp cancels the handler)
        except Exception as exc:
            log.exception("unexpected error in %s %s", request.method, request.path)
            err = KVRouteError(f"internal error: {type(exc).__name__}", code="internal_error")
            started = request.get(STARTED)
            if started is not None:
                return await _end_stream(started, err)
            return answered(request, json_response(err.to_dict(), status=500))

    return error_middleware


async def _end_stream(resp: web.StreamResponse, err: KVRouteError) -> web.StreamResponse:
    """End a started stream with `err` as its last event (nothing if the client has left)."""
    try:
        await resp.write(sse_error(err) + SSE_DONE)
        await resp.write_eof()
    except (ConnectionResetError, RuntimeError):
        pass
    return resp


error_middleware = make_error_middleware()


CONTINUE = web.RequestKey("continue", bool)  # an `Expect: 100-continue` that read_body answers
UNGUARDED = ConnectionGuard(ConnectionLimits())  # the rules of an app served without GuardedRunner


async def continue_on_read(request: web.Request) -> None:
    """aiohttp's expect handler for a route whose body is read with read_body: `100 Continue` is left
    to read_body, which sends it once the declared length has passed its limit, just before the first
    read; an oversize body is refused (413) before the client sends it, and an answer that comes
    first (401, 404) goes without it. Any other expectation is 417, as aiohttp's own handler says."""
    if request.version != HttpVersion11:
        return None
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    request[CONTINUE] = True
    return None


def add_body_route(app: web.Application, path: str, handler) -> None:
    """A POST route, its body read with read_body (if at all): `100 Continue` as continue_on_read says."""
    app.router.add_post(path, handler, expect_handler=continue_on_read)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes (from
    Content-Length before reading anything, before `100 Continue`, or while reading a chunked body).
    A body still arriving is bounded by the connection rules (router/contract/connections.py): 408 if
    no byte comes for --body-timeout-s, 503 if it would pass --body-buffer-bytes of bodies being
    received."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} (--max-body-bytes)")
    if request.get(CONTINUE):
        request[CONTINUE] = False
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # as aiohttp's own expect handler: the answer has not begun
    content = request.content
    first = content.read_nowait()
    if content.at_eof():  # the whole body is in already: nothing to wait for
        if len(first) > limit:
            raise _too_large(limit)
        return first
    return await _read_arriving(content, first, limit, request.app.get(CONNECTION_GUARD) or UNGUARDED)


async def _read_arriving(content, chunk: bytes, limit: int, guard: ConnectionGuard) -> bytes:
    parts, taken = [], 0
    timeout_s = guard.limits.body_timeout_s
    try:
        while True:
            if chunk:
                if taken + len(chunk) > limit:
                    raise _too_large(limit)
                if not guard.take_body(len(chunk)):
                    raise Overloaded(f"request bodies being received hold {guard.body_bytes} bytes, the limit of "
                                     f"--body-buffer-bytes: retry shortly", retry_after=1.0)
                taken += len(chunk)
                parts.append(chunk)
            if content.at_eof():
                return b"".join(parts)
            try:
                async with asyncio.timeout(timeout_s):
                    chunk = await content.readany()
            except TimeoutError:
                guard.closed["body_timeout"] += 1
                raise RequestTimeout(f"the request body stalled: no byte of it for {timeout_s:g} s "
                                     f"(--body-timeout-s)") from None
    finally:
        guard.give_body(taken)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes (--max-body-bytes)")


def parse_json(body: bytes) -> dict:
    if not body:
        raise BadRequest("request body is empty: expected a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


async def read_json(request: web.Request, limit: int = CONTROL_BODY_LIMIT) -> dict:
    return parse_json(await read_body(request, limit))


def parse_retry_after(value: str | None, default: float = 1.0) -> float:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date; `default` if absent or bad."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    if when is None:
        return default
    return max(0.0, when.timestamp() - time.time())


def sse_line(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(exc: KVRouteError) -> bytes:
    return sse_line(exc.to_dict())


def query_number(request: web.Request, name: str, default, cast=float, positive: bool = False):
    """A numeric query parameter (`default` when absent): 400 unless it parses and is >= 0 (> 0 if
    `positive`)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be a number, got {raw!r}", param=name) from None
    if (value <= 0) if positive else (value < 0):
        raise BadRequest(f"query parameter {name!r} must be {'positive' if positive else '>= 0'}", param=name)
    return value
