"""KVStore backends (the same suite against a real redis-server and a temporary directory), entries, the guard."""

import asyncio
import logging
import os

import pytest

from kvroute.engine.core.kv_copies import StoredBlock
from kvroute.engine.kv.store import StoreUnavailable, check_reachable, default_store_id, layout_namespace, make_store
from kvroute.engine.kv.store.entry import BadEntry, decode, encode
from kvroute.engine.kv.store.guard import GuardedStore
from tests.support.redis_server import RedisServer, free_port

NS = layout_namespace("m", "float32", 16, 2, 2, 64, 1234)
BLOCK = StoredBlock(0xDEADBEEF12345678, tuple(range(16)), 99)
PAYLOAD = bytes(range(256)) * 8


@pytest.fixture(params=["redis", "file"])
def store_url(request, redis_url, tmp_path):
    return redis_url if request.param == "redis" else f"file://{tmp_path}"


async def test_store_round_trip(store_url):
    store = make_store(store_url, NS, timeout_s=1.0)
    try:
        value = encode(NS, BLOCK, PAYLOAD)
        await store.put_many([(BLOCK.hash, value), (7, b"x" * 10)])
        assert await store.contains_many([BLOCK.hash, 8, 7]) == [True, False, True]
        assert await store.get_many([8, BLOCK.hash]) == [None, value]
        assert decode((await store.get_many([BLOCK.hash]))[0], NS, BLOCK, len(PAYLOAD)) == PAYLOAD
        await store.put_many([(7, b"y")])  # overwrite
        assert await store.get_many([7]) == [b"y"]
        other = make_store(store_url, layout_namespace("m", "float16", 16, 2, 2, 64, 1234), timeout_s=1.0)
        assert await other.contains_many([BLOCK.hash, 7]) == [False, False]  # another layout, other keys
        await other.close()
        assert store.store_id == default_store_id(store_url)
    finally:
        await store.close()


async def test_file_store_writes_by_rename_and_leaves_no_temporary_files(tmp_path):
    store = make_store(f"file://{tmp_path}", NS)
    await store.put_many([(h, bytes([h % 256]) * 100) for h in range(300)])
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert len(files) == 300 and not [f for f in files if f.endswith(".tmp")]
    assert all(os.path.basename(f).endswith(".kv") and f.startswith(str(tmp_path / NS)) for f in files)


def test_entries_refuse_corrupt_truncated_foreign_and_colliding_values():
    value = encode(NS, BLOCK, PAYLOAD)
    assert decode(value, NS, BLOCK, len(PAYLOAD)) == PAYLOAD
    flipped = bytearray(value)
    flipped[-5] ^= 0x40
    cases = {
        "checksum": (bytes(flipped), NS, BLOCK),
        "payload bytes": (value[:-100], NS, BLOCK),
        "shorter than its header": (value[:10], NS, BLOCK),
        "layout": (value, layout_namespace("m", "float32", 32, 2, 2, 64, 1234), BLOCK),
        "after 99, not": (value, NS, StoredBlock(BLOCK.hash, BLOCK.token_ids, 98)),
        "tokens": (value, NS, StoredBlock(BLOCK.hash, tuple(range(1, 17)), 99)),
        "kvroute": (b"garbage" * 20, NS, BLOCK),
    }
    for reason, (v, ns, block) in cases.items():
        with pytest.raises(BadEntry, match=reason):
            decode(v, ns, block, len(PAYLOAD))


def test_a_store_that_cannot_be_used_is_one_clear_error(tmp_path):
    port = free_port()
    with pytest.raises(ValueError, match=f"cannot use --kv-store redis://127.0.0.1:{port}/0: .*"):
        check_reachable(f"redis://user:secret@127.0.0.1:{port}/0", timeout_s=0.5)
    with pytest.raises(ValueError, match="not an existing directory"):
        check_reachable(f"file://{tmp_path}/missing")
    check_reachable(f"file://{tmp_path}")
    assert "secret" not in default_store_id("redis://user:secret@10.0.0.1:6379/2?x=1")


async def test_guard_fails_fast_during_an_outage_logs_once_and_recovers(caplog):
    port = free_port()
    server = RedisServer(port)
    errors = []
    store = GuardedStore(make_store(server.url, NS, timeout_s=0.2), 0.2, retry_s=0.3, on_error=errors.append)
    try:
        await store.put_many([(1, b"a")])
        server.stop()
        with caplog.at_level(logging.WARNING, logger="kvroute.engine.kv.store.guard"):
            for _ in range(5):
                with pytest.raises(StoreUnavailable):
                    await store.get_many([1])
            assert not store.up and len(errors) == 5
            assert len([r for r in caplog.records if "unavailable" in r.message]) == 1
            server = RedisServer(port)
            await asyncio.sleep(0.35)  # past retry_s: the next call tries again
            assert await store.contains_many([1]) == [False]  # a fresh, empty server
            assert store.up and any("is back" in r.message for r in caplog.records)
    finally:
        await store.close()
        server.stop()
