"""LoRA adapters across real engines: the tiers keep each adapter's blocks its own, and a router sends an
adapter's requests where it is resident and credits the blocks cached under it."""

import asyncio

import pytest
import torch

from kvroute.engine.runners.lora_files import write_random_adapter
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.router.service.app import CLUSTER
from tests.support.router_cluster import prompt
from tests.support.tier_requests import SESSION, at_least, evict, remote_written, wait_for

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lora_modules(tmp_path_factory) -> tuple[str, ...]:
    root = tmp_path_factory.mktemp("adapters")
    return tuple(f"{name}={write_random_adapter(root / name, ModelConfig.tiny(), seed=i)}"
                 for i, name in enumerate(("sql", "chat")))


async def complete(http, url, text, model, max_tokens=6, **extra):
    body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "model": model, **extra}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        out = await r.json()
        return out["choices"][0]["text"], out["usage"]["prompt_tokens_details"], r.headers["x-kvroute-instance"]


async def test_the_host_pool_and_the_store_serve_an_adapters_blocks_to_that_adapter_only(
        start_engine, http, tmp_path, lora_modules):
    store = f"file://{tmp_path}"
    engine = dict(backend="torch", num_blocks=24, host_blocks=64, kv_store=store, lora_modules=lora_modules,
                  max_loras=2)
    url, _ = await start_engine(**engine)
    sql_text, first, _ = await complete(http, url, SESSION, "sql")
    await wait_for(lambda: at_least(remote_written(http, url), 9))
    await evict(http, url)  # the session's device blocks go to the host pool
    base_text, base, _ = await complete(http, url, SESSION, "kvroute-tiny")  # the same tokens, the base model
    assert first["cached_tokens"] == base["cached_tokens"] == 0 and base_text != sql_text
    again, host, _ = await complete(http, url, SESSION, "sql")
    assert again == sql_text and host["cached_tokens"] == 144 and host["cached_tokens_by_tier"]["host"] > 0
    other, _ = await start_engine(**engine)  # shares the store, which holds the tokens under sql and the base model
    _, chat_there, _ = await complete(http, other, SESSION, "chat")
    there, remote, _ = await complete(http, other, SESSION, "sql")
    assert chat_there["cached_tokens"] == 0 and remote["cached_tokens_by_tier"]["remote"] == 144
    assert there == sql_text  # the adapter's K/V from the store: its greedy tokens


async def explain(http, url, text, model, **extra) -> dict:
    body = {"prompt": text, "model": model, "max_tokens": 2, **extra}
    async with http.post(url + "/router/explain", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_the_router_sends_an_adapters_requests_where_it_is_resident_and_credits_its_blocks(
        start_engine, start_router, http, lora_modules):
    engines = [(await start_engine(backend="torch", num_blocks=128, lora_modules=lora_modules))[0] for _ in range(2)]
    url, server = await start_router(engines)
    instances = server.app[CLUSTER].instances
    assert await wait_until(lambda: all(i.routable and i.load is not None for i in instances))
    _, first, chosen = await complete(http, url, prompt(1), "sql")
    assert first["cached_tokens"] == 0
    other = next(i.id for i in instances if i.id != chosen)
    assert await wait_until(lambda: all(i.load.adapters == (("sql",) if i.id == chosen else ()) for i in instances))
    assert await wait_until(lambda: next(i for i in instances if i.id == chosen).blocks_indexed > 0)
    seen = await explain(http, url, prompt(1), "sql")
    rows = {row["instance"]: row for row in seen["instances"]}
    assert seen["choice"] == chosen and seen["keys"]["adapter"] == "sql" and seen["keys"]["key_rule"] == "seeded"
    assert rows[chosen]["cached_tokens"] > 0 and rows[other]["cached_tokens"] == 0
    assert rows[chosen]["match"].endswith("tokens cached under the request's keys")
    base = await explain(http, url, prompt(1), "kvroute-tiny")  # the same tokens, the base model: nothing cached
    assert all(row["cached_tokens"] == 0 for row in base["instances"])
    fresh = await explain(http, url, prompt(2), "sql")  # nothing cached anywhere: the adapter's residency decides
    plain = await explain(http, url, prompt(2), "kvroute-tiny")
    wait = {name: {row["instance"]: row["cost_terms"]["wait_s"] for row in e["instances"]}
            for name, e in (("sql", fresh), ("base", plain))}
    assert fresh["choice"] == chosen
    assert wait["sql"][other] - wait["base"][other] == pytest.approx(0.05)  # adapter_load_s, where it is not resident
    assert wait["sql"][chosen] == wait["base"][chosen]
    _, again, where = await complete(http, url, prompt(1), "sql")
    assert where == chosen and again["cached_tokens"] == rows[chosen]["cached_tokens"]


async def test_a_router_reading_zeromq_events_credits_an_adapters_blocks(start_engine, start_router, http):
    url, _ = await start_engine(time_scale=0.01, lora_modules=("sql",), kv_events_zmq="tcp://127.0.0.1:0",
                                kv_events_replay="tcp://127.0.0.1:0")
    async with http.get(url + "/kv/info") as r:
        info = await r.json()
    router, server = await start_router([url], engine_kinds=("kvroute",),
                                        kv_event_sources=(f"{url}={info['kv_events_zmq']}",),
                                        kv_event_replay_sources=(f"{url}={info['kv_events_replay']}",))
    instance = server.app[CLUSTER].instances[0]
    assert await wait_until(lambda: instance.routable)
    await complete(http, url, prompt(3), "sql")
    await complete(http, url, prompt(4), "sql", cache_salt="tenant-a")  # salt and adapter, both in the seed
    assert await wait_until(lambda: instance.blocks_indexed >= 2 * 7)
    for text, extra in ((prompt(3), {}), (prompt(4), {"cache_salt": "tenant-a"})):
        assert (await explain(http, router, text, "sql", **extra))["instances"][0]["cached_tokens"] > 0
        assert (await explain(http, router, text, "kvroute-tiny", **extra))["instances"][0]["cached_tokens"] == 0
    assert (await explain(http, router, prompt(4), "sql"))["instances"][0]["cached_tokens"] == 0  # no salt


async def wait_until(predicate, timeout=15.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()
