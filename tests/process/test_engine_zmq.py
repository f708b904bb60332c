"""kvroute engines publishing vLLM's ZeroMQ format: read independently, and by the router."""

import asyncio
import random
import time

import msgpack
import pytest
import zmq

from kvroute.engine.config import EngineConfig
from kvroute.router.contract.settings_values import build

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def text(seed, words=120):
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(words))


def fetch_replay(endpoint, start=0):
    """Everything the replay socket holds from `start`, decoded with plain msgpack."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    try:
        while True:
            assert sock.poll(5000), "replay did not answer"
            empty, seq, payload = sock.recv_multipart()
            if seq == b"\xff" * 8:
                return out
            out.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    finally:
        sock.close()
        ctx.term()


async def post(http, url, body):
    async with http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def get(http, url):
    async with http.get(url) as r:
        return await r.json()


@pytest.mark.parametrize("encoding", ["map", "array", "map-batch"])
async def test_engine_publishes_vllms_format(start_engine, http, encoding):
    url, _ = await start_engine(kv_events_zmq="tcp://127.0.0.1:0", kv_events_replay="tcp://127.0.0.1:0",
                                kv_events_encoding=encoding)
    info = await get(http, url + "/kv/info")
    prompt = text(1)
    await post(http, url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    tokens = (await post(http, url + "/tokenize", {"prompt": prompt}))["tokens"]
    batches = await asyncio.to_thread(fetch_replay, info["kv_events_replay"])
    assert [seq for seq, _ in batches] == list(range(len(batches)))
    events = []
    for _, batch in batches:
        if encoding == "map-batch":
            assert set(batch) == {"ts", "events", "data_parallel_rank"}
            events += [(e["type"], e) for e in batch["events"]]
        elif encoding == "map":
            ts, evs, rank = batch
            events += [(e["type"], e) for e in evs]
        else:
            ts, evs, rank = batch
            assert isinstance(ts, float) and rank == 0
            events += [(e[0], dict(zip(["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                         "lora_id", "medium"], e[1:]))) for e in evs]
    assert events[0][0] == "AllBlocksCleared"
    stored = [e for kind, e in events if kind == "BlockStored"]
    hashes = [h for e in stored for h in e["block_hashes"]]
    snapshot = (await get(http, url + "/kv/snapshot"))["tiers"]["device"]
    assert sorted(hashes) == sorted(snapshot) and len(hashes) == len(tokens) // 16 - (len(tokens) % 16 == 0)
    assert stored[0]["parent_block_hash"] is None and stored[0]["block_size"] == 16 and stored[0]["medium"] == "GPU"
    assert [t for e in stored for t in e["token_ids"]] == tokens[:16 * len(hashes)]
    assert all(0 <= h < 2**64 for h in hashes)


@pytest.mark.parametrize("bad", [{"kv_events_zmq": "127.0.0.1:5557"}, {"kv_events_replay": "tcp://127.0.0.1:1"},
                                 {"kv_events_zmq": "tcp://127.0.0.1:1", "kv_events_encoding": "json"}])
def test_engine_flag_validation(bad):
    with pytest.raises(ValueError):
        build(EngineConfig, **bad)


async def test_round_trip_routes_exactly_as_the_kv_events_feed(start_engine, start_router, http):
    """Routers fed only by ZeroMQ and only by /kv/events see the same caches and choose the same."""
    engines = []
    for i in range(3):
        url, _ = await start_engine(num_blocks=48, kv_events_zmq="tcp://127.0.0.1:0",
                                    kv_events_replay="tcp://127.0.0.1:0",
                                    kv_events_encoding=("map", "array", "map-batch")[i])
        engines.append((url, await get(http, url + "/kv/info")))
    urls = [u for u, _ in engines]
    zmq_router, _ = await start_router(
        urls, engine_kinds=("kvroute",),
        kv_event_sources=tuple(f"{u}={i['kv_events_zmq']}" for u, i in engines),
        kv_event_replay_sources=tuple(f"{u}={i['kv_events_replay']}" for u, i in engines))
    poll_router, _ = await start_router(urls)
    prompts = [text(100 + g) + " " + text(200 + q, 8) for g in range(6) for q in range(2)]
    r = random.Random(0)
    for prompt in prompts:  # straight to the engines: 48 blocks each, so some get evicted
        await post(http, r.choice(urls) + "/v1/completions", {"prompt": prompt, "max_tokens": 2})

    async def views():
        out = []
        for router in (zmq_router, poll_router):
            rows = (await get(http, router + "/router/instances"))["instances"]
            out.append({row["id"]: row["blocks_indexed"] for row in rows})
        return out

    deadline = time.monotonic() + 10
    while (v := await views())[0] != v[1] or not any(v[0].values()):
        assert time.monotonic() < deadline, v
        await asyncio.sleep(0.05)
    for prompt in prompts + [text(999)]:
        a = await post(http, zmq_router + "/router/explain", {"prompt": prompt})
        b = await post(http, poll_router + "/router/explain", {"prompt": prompt})
        assert {x["instance"]: x["cached_tokens"] for x in a["instances"]} == \
               {x["instance"]: x["cached_tokens"] for x in b["instances"]}
        assert (a["choice"], a["predicted_cached_tokens"]) == (b["choice"], b["predicted_cached_tokens"])
    async with http.get(poll_router + "/metrics") as resp:
        metrics = await resp.text()
    removed = [line for line in metrics.splitlines()
               if line.startswith('kvroute_router_kv_events_total{type="removed"}')]
    assert removed and float(removed[0].split()[-1]) > 0  # evictions happened, and both saw them
    feeds = [row["kv_events"] for row in (await get(http, zmq_router + "/router/instances"))["instances"]]
    assert all(f["state"] == "live" and f["rebuilds"] == 0 and f["blocks"].get("unknown_removed", 0) == 0
               for f in feeds), feeds
    prompt = prompts[3]
    predicted = (await post(http, zmq_router + "/router/explain", {"prompt": prompt}))["predicted_cached_tokens"]
    answer = await post(http, zmq_router + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == predicted > 0
