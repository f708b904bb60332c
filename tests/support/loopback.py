"""An aiohttp app served on 127.0.0.1 and a free port, the way `kvroute` serves it."""

from aiohttp import web

from kvroute.router.contract.connections import GuardedRunner


class LoopbackServer:
    """An aiohttp app served the way `kvroute` serves it, on 127.0.0.1 and a free port."""

    def __init__(self, app):
        self.app = app
        self.runner = None
        self.url = ""

    async def start(self, port: int = 0):
        self.runner = GuardedRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.listening = site
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self):
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
