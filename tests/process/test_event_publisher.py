"""Engine KV events appended to a real Redis stream."""

import asyncio

import orjson
import redis.asyncio as aioredis

from kvroute.router.contract.protocol import REDIS_EVENT_STREAM

PROMPT = "Streams of events reach every router replica through Redis. " * 6


async def test_events_reach_the_redis_stream(start_engine, http, redis_url):
    url, _ = await start_engine(time_scale=0.01, redis=redis_url, instance_id="e-redis")
    async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}) as r:
        assert r.status == 200
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        feed = await r.json()
    client = aioredis.Redis.from_url(redis_url)
    try:
        events = []
        for _ in range(50):
            entries = await client.xrange(REDIS_EVENT_STREAM)
            events = [e for _, fields in entries for e in orjson.loads(fields[b"data"])["events"]]
            if len(events) >= len(feed["events"]):
                break
            await asyncio.sleep(0.05)
        entry = orjson.loads(entries[-1][1][b"data"])
    finally:
        await client.aclose()
    assert events == feed["events"]  # same events, same order, same seq numbers
    assert entry["instance"] == "e-redis" and entry["load"]["instance"] == "e-redis"
    assert any(e["type"] == "stored" for e in events)
