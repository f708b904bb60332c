"""aiohttp edge helpers shared by engine and router: JSON responses, error mapping, SSE."""

from __future__ import annotations

import logging
import math

import orjson
from aiohttp import web

from router.errors import BadRequest, KVRouteError, NotFound, Overloaded, Unauthorized, Unavailable

log = logging.getLogger(__name__)

STATUS = {BadRequest: 400, Unauthorized: 401, NotFound: 404, Unavailable: 503}


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


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except KVRouteError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = NotFound(exc.reason) if exc.status == 404 else KVRouteError(exc.reason)
        return json_response(err.to_dict(), status=exc.status)


async def read_json(request: web.Request) -> dict:
    body = await request.read()
    if not body:
        raise BadRequest("request body is empty: expected a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def sse_line(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(exc: KVRouteError) -> bytes:
    return sse_line(exc.to_dict())
