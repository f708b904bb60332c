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
