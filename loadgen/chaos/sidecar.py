"""A sidecar in front of one engine that makes it differ from what the router believes, silently.

The planted mismatches of the silent-miss alarm (router/fleet/silent_miss.py): everything is
relayed to the engine and back unchanged (streams as they come), except

    advertise_block_size   GET /kv/info says this block size instead of the engine's own
                           (an engine started with another --block-size than it advertises)
    cache_salt             every completion body gets this `cache_salt` (a gateway salting the
                           engine's block keys where the router cannot see it)

`Sidecar(engine_url, ...)` is an aiohttp app; `await sidecar.start()` serves it on 127.0.0.1 and
a free port (`url`), `await sidecar.close()` stops it.
"""

from __future__ import annotations

import aiohttp
import orjson
from aiohttp import web

READ_S = 60.0  # an engine silent this long mid-answer is cut off, not waited on for ever
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host", "content-encoding"}


class Sidecar:
    def __init__(self, engine_url: str, advertise_block_size: int | None = None, cache_salt: str | None = None):
        self.engine_url = engine_url.rstrip("/")
        self.advertise_block_size, self.cache_salt = advertise_block_size, cache_salt
        self.url = ""
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> Sidecar:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=READ_S)
        self._session = aiohttp.ClientSession(timeout=timeout)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _body(self, path: str, raw: bytes) -> bytes:
        if self.cache_salt is None or not path.startswith("/v1/") or not raw:
            return raw
        body = orjson.loads(raw)
        return orjson.dumps({**body, "cache_salt": self.cache_salt}) if isinstance(body, dict) else raw

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = self._body(request.path, await request.read())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(request.method, self.engine_url + request.path_qs, data=raw,
                                         headers=headers) as upstream:
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            if request.path == "/kv/info" and upstream.status == 200 and self.advertise_block_size is not None:
                info = await upstream.json()
                return web.json_response({**info, "block_size": self.advertise_block_size})
            resp = web.StreamResponse(status=upstream.status, headers=out)
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
