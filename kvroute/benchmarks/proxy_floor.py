"""The floor under the router's added latency: a proxy that does no routing at all.

    python -m kvroute.benchmarks.proxy_floor --server aiohttp|raw --port P --engine http://127.0.0.1:E

It forwards every POST to one engine through kvroute's own upstream client
(router/service/upstream.py) and answers with the engine's body, nothing else: no parsing,
tokenizing, hashing, lookup, metrics or trace. `aiohttp` serves it with aiohttp's
web server (what kvroute's router uses); `raw` with a bare asyncio protocol (HTTP/1.1,
Content-Length bodies only). `python -m kvroute.benchmarks.router latency` measures both next to the
routers, so the share of added latency that is the HTTP server's is a measured figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.parse
from typing import Any

from aiohttp import web

from kvroute.router.contract.serve import install_uvloop
from kvroute.router.service.upstream import Upstream

TIMEOUT_S = 30.0


class RawProxy(asyncio.Protocol):
    """HTTP/1.1 with Content-Length bodies, keep-alive, one request at a time per connection."""

    def __init__(self, forward) -> None:
        self.forward, self.buf = forward, b""
        self.transport: Any = None  # set by connection_made

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in self.buf[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        head, body, self.buf = self.buf[:end], self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
        if head.startswith(b"GET "):  # readiness probes
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        asyncio.get_running_loop().create_task(self._answer(body))

    async def _answer(self, body: bytes) -> None:
        status, out = await self.forward(body)
        self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(out)) + out)


async def serve(server: str, port: int, engine: str) -> None:
    url = urllib.parse.urlsplit(engine)
    host, engine_port = url.hostname or "127.0.0.1", url.port or 80
    upstream = Upstream()

    async def forward(body: bytes) -> tuple[int, bytes]:
        response = await upstream.post(host, engine_port, "/v1/completions", body, TIMEOUT_S, TIMEOUT_S)
        try:
            return response.status, await response.read()
        finally:
            response.close()

    if server == "raw":
        await asyncio.get_running_loop().create_server(lambda: RawProxy(forward), "127.0.0.1", port)
    else:
        async def handle(request: web.Request) -> web.Response:
            status, out = await forward(await request.read())
            return web.Response(body=out, status=status, content_type="application/json")

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/v1/completions", handle)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=("aiohttp", "raw"), required=True, help="the HTTP server in front")
    p.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    p.add_argument("--engine", required=True, help="the engine every request goes to")
    args = p.parse_args(argv)
    install_uvloop()
    try:
        asyncio.run(serve(args.server, args.port, args.engine))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
