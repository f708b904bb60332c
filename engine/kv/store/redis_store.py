"""`redis://` store: one binary string value per block, `kvroute:kv:{namespace}:{hash:016x}`.

Reads (GET many = one MGET, contains = one pipelined round of EXISTS) use a client
with the engine's short read timeout; writes (pipelined SETs, in chunks) a second
client with a longer one, so a slow write never makes a read wait. A value is
written whole by one SET, so a reader never sees half a block. Entries do not
expire: size the Redis (maxmemory + an LRU policy) for the working set; an entry
Redis dropped is simply a miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis.asyncio as aioredis

from kvroute.router.contract.cancellation import raise_if_cancelled

KEY_PREFIX = "kvroute:kv:"
WRITE_CHUNK = 64  # SETs per pipeline round trip
WRITE_TIMEOUT_S = 5.0


class RedisStore:
    def __init__(self, url: str, namespace: str, store_id: str, timeout_s: float) -> None:
        self.store_id = store_id
        self.prefix = f"{KEY_PREFIX}{namespace}:"
        self.reader = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.writer = aioredis.Redis.from_url(url, socket_timeout=WRITE_TIMEOUT_S,
                                              socket_connect_timeout=WRITE_TIMEOUT_S)

    def key(self, h: int) -> str:
        return f"{self.prefix}{h:016x}"

    async def put_many(self, items: Sequence[tuple[int, bytes]]) -> None:
        for i in range(0, len(items), WRITE_CHUNK):
            pipe = self.writer.pipeline(transaction=False)
            for h, value in items[i:i + WRITE_CHUNK]:
                pipe.set(self.key(h), value)
            await pipe.execute()
            raise_if_cancelled()  # redis-py on Python 3.11 may have swallowed it (router/contract/cancellation.py)

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        if not hashes:
            return []
        # bytes: the client does not decode responses
        values = cast(list[bytes | None], list(await self.reader.mget([self.key(h) for h in hashes])))
        raise_if_cancelled()
        return values

    async def contains_many(self, hashes: Sequence[int]) -> list[bool]:
        if not hashes:
            return []
        pipe = self.reader.pipeline(transaction=False)
        for h in hashes:
            pipe.exists(self.key(h))
        found = [bool(n) for n in await pipe.execute()]
        raise_if_cancelled()
        return found

    async def close(self) -> None:
        await self.reader.aclose()
        await self.writer.aclose()


def ping(url: str, timeout_s: float) -> None:
    """Raise with the reason if the Redis at `url` does not answer (checked before an engine starts)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    finally:
        client.close()
