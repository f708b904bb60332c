"""An engine serving LoRA adapters over loopback (sim backend: adapters named without weights): what it
lists, how it keys each adapter's blocks (the router's "seeded" rule, from the shared contract), errors."""

from kvroute.router.contract.block_keys import KEY_RULES, RequestKeys
from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.tokenizer import load_tokenizer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8
ADAPTERS = dict(lora_modules=("sql", "chat"), max_loras=1, time_scale=0.01)


async def post(http, url, body):
    async with http.post(url, json=body) as r:
        return r.status, await r.json()


async def get(http, url):
    async with http.get(url) as r:
        return r.status, await r.json()


async def cached(http, url, model, **extra) -> int:
    status, body = await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "model": model,
                                                             **extra})
    assert status == 200, body
    assert body["model"] == model
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_models_info_and_load_list_the_adapters(start_engine, http):
    url, _ = await start_engine(**ADAPTERS)
    _, models = await get(http, url + "/v1/models")
    cards = {c["id"]: c for c in models["data"]}
    assert list(cards) == ["kvroute-tiny", "sql", "chat"]
    assert cards["kvroute-tiny"]["parent"] is None and cards["sql"]["parent"] == "kvroute-tiny"
    status, card = await get(http, url + "/v1/models/chat")
    assert status == 200 and card["parent"] == "kvroute-tiny"
    _, info = await get(http, url + "/kv/info")
    assert info["adapters"] == ["sql", "chat"] and info["max_loras"] == 1
    _, load = await get(http, url + "/load")
    assert load["adapters"] == [] and load["adapter_slots"] == 1
    await cached(http, url, "sql")
    _, load = await get(http, url + "/load")
    assert load["adapters"] == ["sql"]
    status, tok = await post(http, url + "/tokenize", {"prompt": "hello", "model": "chat"})
    assert status == 200 and tok["count"] > 0
    async with http.get(url + "/metrics") as r:
        assert 'kvroute_engine_adapter_loads_total{model_name="kvroute-tiny"} 1.0' in await r.text()


async def test_an_unknown_model_is_a_404_naming_what_is_served(start_engine, http):
    url, _ = await start_engine(**ADAPTERS)
    for path, body in (("/v1/completions", {"prompt": "x", "model": "nope"}),
                       ("/tokenize", {"prompt": "x", "model": "nope"})):
        status, err = await post(http, url + path, body)
        assert status == 404 and err["error"]["code"] == "model_not_found"
        assert "'kvroute-tiny' and its adapters 'sql', 'chat'" in err["error"]["message"]
    status, _ = await get(http, url + "/v1/models/nope")
    assert status == 404
    plain, _ = await start_engine(time_scale=0.01)
    status, err = await post(http, plain + "/v1/completions", {"prompt": "x", "model": "sql"})
    assert status == 404 and err["error"]["message"] == "model 'sql' does not exist; this engine serves 'kvroute-tiny'"
    _, load = await get(http, plain + "/load")
    assert load["adapter_slots"] == 0 and load["adapters"] == []  # serves none: a router prices that


async def test_each_adapters_blocks_are_keyed_as_the_routers_seeded_rule_and_never_shared(start_engine, http):
    url, _ = await start_engine(**ADAPTERS)
    assert await cached(http, url, "sql") == 0
    assert await cached(http, url, "kvroute-tiny") == 0  # the same tokens under the base model: not its blocks
    assert await cached(http, url, "chat") == 0
    assert await cached(http, url, "sql") > 0
    assert await cached(http, url, "sql", cache_salt="tenant-a") == 0
    _, feed = await get(http, url + "/kv/events?since=0")
    stored = {h for e in feed["events"] if e["type"] == "stored" for h in e["blocks"]}
    data = Encoding.of(load_tokenizer().encode(PROMPT)).data
    rule = KEY_RULES["seeded"]
    keyed = [set(rule.request_hashes(data, 16, "kvroute-tiny", RequestKeys(adapter=a, salt=s)))
             for a, s in (("sql", None), (None, None), ("chat", None), ("sql", "tenant-a"))]
    assert all(k and k <= stored for k in keyed)  # every request's blocks, as the router hashes them
    assert sum(len(k) for k in keyed) == len(set().union(*keyed)) == len(stored)  # and no two share one
