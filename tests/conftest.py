import os
import pathlib

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.support.loopback import LoopbackServer  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

# the test process's memory: what a test leaves for the cyclic collector goes before the next one; the run ends
# with its peak RSS per process (--rss-top N, --rss-each-test, --rss-limit-mb M)
pytest_plugins = ("tests.support.process_memory",)

FOLDER_MARKERS = ("unit", "process")  # tests/unit: in-process; tests/process: start processes or redis-server


def pytest_collection_modifyitems(config, items):
    """Mark every test by its folder, so `-m unit` runs the fast in-process ones."""
    for item in items:
        folder = pathlib.Path(item.path).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(folder)


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


@pytest.fixture
async def start_engine():
    """Start engine apps on loopback; yields a factory returning (base URL, server)."""
    from kvroute.engine.config import EngineConfig
    from kvroute.engine.service.server import create_app
    from kvroute.router.contract.settings_values import build

    servers = []

    async def start(port=0, **overrides):
        overrides.setdefault("instance_id", f"e{len(servers)}")
        overrides.setdefault("backend", "sim")
        overrides.setdefault("num_threads", 1)
        server = await LoopbackServer(create_app(build(EngineConfig, port=port, **overrides))).start(port)
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
    from kvroute.router.contract.settings_values import build
    from kvroute.router.service.app import create_app
    from kvroute.router.service.config import RouterConfig

    servers = []

    async def start(engines, **overrides):
        overrides.setdefault("health_interval_s", 0.2)
        overrides.setdefault("load_interval_s", 0.05)
        overrides.setdefault("events_timeout_s", 0.5)
        overrides.setdefault("seed", 0)
        config = build(RouterConfig, engines=tuple(engines), port=0, **overrides)
        server = await LoopbackServer(create_app(config)).start()
        servers.append(server)
        return server.url, server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def picker(start_router):
    """Routers with their endpoint picker on (tests/support/picker_fleet.py): `await picker(engines, **kw)`
    gives (router URL, server, gRPC channel)."""
    from tests.support.picker_fleet import PickerFleets  # grpc: only for the tests that use it

    fleets = PickerFleets(start_router)
    yield fleets.start
    await fleets.close()
