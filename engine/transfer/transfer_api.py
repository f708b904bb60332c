"""POST /kv/transfer: stream a pinned prefill's blocks to the decode engine that pulls them.

The endpoint reads the engine through `PinnedSource` (what it needs of engine/service/llm_engine.py's
`LLMEngine`), found in the app by the callable the server hands `transfer_handler`: the transfer package
never imports the engine's service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.work import ModelRunner
from kvroute.engine.transfer.kv_transfer import PinnedBlocks, encode_frames
from kvroute.router.contract.errors import BadRequest, Forbidden, NotFound
from kvroute.router.contract.http import prepare_client, read_json, write_client
from kvroute.router.contract.kv_auth import KVAuth


class PinnedSource(Protocol):
    """The engine, as the pull endpoint reads it: the pinned prompts, their blocks, who may pull them."""

    pinned: PinnedBlocks
    block_manager: BlockManager
    runner: ModelRunner
    auth: KVAuth

    def release_pinned(self, request_id: str) -> None: ...


async def read_pinned(engine: PinnedSource, request_id: str, from_block: int) -> list[tuple[int, int, bytes]] | None:
    """(index, hash, payload) of a pinned prompt's blocks from `from_block` on; None if not pinned."""
    seq = engine.pinned.get(request_id)
    if seq is None:
        return None
    bs = engine.block_manager.block_size
    ids = seq.block_table[from_block : -(-seq.num_prompt // bs)]
    data = await asyncio.to_thread(engine.runner.read_blocks, ids)
    size = len(data) // len(ids) if ids else 0
    full = seq.num_prompt // bs
    return [(i, seq.block_hashes[i] if i < full else 0, data[(i - from_block) * size:(i - from_block + 1) * size])
            for i in range(from_block, from_block + len(ids))]


def transfer_handler(engine_of: Callable[[web.Application], PinnedSource]
                     ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The POST /kv/transfer handler of an app whose engine `engine_of(app)` finds."""

    async def handle_transfer(request: web.Request) -> web.StreamResponse:
        return await stream_pinned(engine_of(request.app), request)

    return handle_transfer


async def stream_pinned(engine: PinnedSource, request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    request_id, from_block = body.get("request_id"), body.get("from_block", 0)
    if not isinstance(request_id, str) or isinstance(from_block, bool) or not isinstance(from_block, int) \
            or from_block < 0:
        raise BadRequest("body must be {'request_id': str, 'from_block': int >= 0, 'signature': str}")
    seq = engine.pinned.get(request_id)
    if seq is None:
        raise NotFound(f"no pinned KV for request {request_id!r}: it was pulled already or its TTL expired",
                       code="kv_handle_not_found")
    try:
        engine.auth.check_pull(seq.transfer_signature, body.get("signature"), request.remote)
    except PermissionError as e:
        raise Forbidden(str(e), code="kv_transfer_refused") from None
    frames = await read_pinned(engine, request_id, from_block)
    if frames is None:
        raise NotFound(f"no pinned KV for request {request_id!r}: it was pulled already or its TTL expired",
                       code="kv_handle_not_found")
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await prepare_client(resp, request)
    for frame in encode_frames(frames):
        await write_client(resp, frame)
    await write_client(resp)
    engine.release_pinned(request_id)
    return resp
