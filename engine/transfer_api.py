"""POST /kv/transfer: stream a pinned prefill's blocks to the decode engine that pulls them."""

from __future__ import annotations

from aiohttp import web

from engine.kv_transfer import encode_frames
from router.errors import BadRequest, NotFound
from router.http import read_json


async def handle_transfer(request: web.Request) -> web.StreamResponse:
    from engine.server import ENGINE

    engine = request.app[ENGINE]
    body = await read_json(request)
    request_id, from_block = body.get("request_id"), body.get("from_block", 0)
    if not isinstance(request_id, str) or not isinstance(from_block, int) or from_block < 0:
        raise BadRequest("body must be {'request_id': str, 'from_block': int >= 0}")
    frames = await engine.read_pinned(request_id, from_block)
    if frames is None:
        raise NotFound(f"no pinned KV for request {request_id!r}: it was pulled already or its TTL expired",
                       code="kv_handle_not_found")
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await resp.prepare(request)
    for frame in encode_frames(frames):
        await resp.write(frame)
    await resp.write_eof()
    engine.release_pinned(request_id)
    return resp
