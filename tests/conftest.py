import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.redis_server import RedisServer  # noqa: E402


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """A clean database on the session's redis-server."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


class LoopbackServer:
    """An aiohttp app served the way `kvroute` serves it, on 127.0.0.1 and a free port."""

    def __init__(self, app):
        self.app = app
        self.runner = None
        self.url = ""

    async def start(self, port: int = 0):
        from aiohttp import web

        from router.contract.connections import GuardedRunner

        self.runner = GuardedRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self):
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@pytest.fixture
async def start_engine():
    """Start engine apps on loopback; yields a factory returning (base URL, server)."""
    from engine.core.config import EngineConfig
    from engine.service.server import create_app

    servers = []

    async def start(port=0, **overrides):
        overrides.setdefault("instance_id", f"e{len(servers)}")
        overrides.setdefault("backend", "sim")
        overrides.setdefault("num_threads", 1)
        server = await LoopbackServer(create_app(EngineConfig(port=port, **overrides))).start(port)
        servers.append(server)
        return server.url, server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def http():
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def start_router():
    """Start router apps on loopback over given engine URLs; yields (base URL, server)."""
    from router.service.app import create_app
    from router.service.config import RouterConfig

    servers = []

    async def start(engines, **overrides):
        overrides.setdefault("health_interval_s", 0.2)
        overrides.setdefault("load_interval_s", 0.05)
        overrides.setdefault("events_timeout_s", 0.5)
        overrides.setdefault("seed", 0)
        server = await LoopbackServer(create_app(RouterConfig(engines=tuple(engines), port=0, **overrides))).start()
        servers.append(server)
        return server.url, server

    yield start
    for server in servers:
        await server.close()
