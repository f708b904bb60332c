"""The router in front of vLLM- and SGLang-shaped engines: kinds, discovery, load, ZeroMQ events."""

import asyncio
import logging
import time

import pytest

from kvroute.router.contract.prometheus_text import metric_labels, metric_max, metric_sum
from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.config import RouterConfig
from tests.support.foreign_stubs import StubEngine
from tests.support.loopback import LoopbackServer
from tests.support.vllm_publisher import VllmPublisher, engine_hashes, stored

PROMPT = "You are a helpful assistant who answers questions about the solar system. " * 6


@pytest.fixture
async def stubs():
    servers = []

    async def start(kind, **kw):
        stub = StubEngine(kind, kw.pop("tokenizer", None) or load_tokenizer(), **kw)
        server = await LoopbackServer(stub.app()).start()
        servers.append(server)
        return stub, server.url

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
def publishers():
    pubs = []

    def make(**kw):
        pubs.append(VllmPublisher(**kw))
        return pubs[-1]

    yield make
    for pub in pubs:
        pub.close()


async def get(http, url):
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def until(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def instances(http, router):
    return {i["url"]: i for i in (await get(http, router + "/router/instances"))["instances"]}


async def test_vllm_fleet_is_routed_exactly_from_zmq_events(stubs, publishers, start_router, http):
    (stub_a, a), (stub_b, b) = await stubs("vllm"), await stubs("vllm", block_size=16)
    pub_a, pub_b = publishers(events="map", batch="map"), publishers()
    router, _ = await start_router(
        [a, b], engine_kinds=("vllm",),
        kv_event_sources=(f"{a}={pub_a.endpoint}", f"{b}={pub_b.endpoint}"),
        kv_event_replay_sources=(f"{a}={pub_a.replay_endpoint}", f"{b}={pub_b.replay_endpoint}"))
    tokens = load_tokenizer().encode(PROMPT)
    full = len(tokens) // 16 * 16
    hashes = engine_hashes(tokens, 16)
    pub_b.publish([stored(hashes, None, tokens[:full])])  # may race the SUB connect: replay covers it

    async def indexed():
        return (await instances(http, router))[b]["kv_events"]["engine_blocks"] == len(hashes)

    await until(indexed)
    async with http.post(router + "/router/explain", json={"prompt": PROMPT}) as r:
        explain = await r.json()
    view = await instances(http, router)
    assert explain["choice"] == view[b]["id"] and explain["predicted_cached_tokens"] == full
    async with http.post(router + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as r:
        assert r.status == 200 and r.headers["x-kvroute-instance"] == view[b]["id"]
    assert stub_b.completions == 1
    assert view[b]["kind"] == "vllm" and view[b]["model"] == "m" and view[b]["block_size"] == 16
    assert view[b]["engine"]["engine_block_size"] == 16 and view[b]["engine"]["num_blocks"] == 1000
    assert view[b]["kv_events"]["engine_block_size"] == 16 and not view[b]["mismatch"]

    stub_a.running, stub_a.waiting, stub_a.usage = 5, 2, 0.25

    async def loaded():
        load = (await instances(http, router))[a]["load"]
        return load["running"] == 5 and load["waiting"] == 2 and load["kv_used_blocks"] == 250

    await until(loaded)
    async with http.get(router + "/metrics") as r:
        text = await r.text()
    assert f'kvroute_router_zmq_batches_total{{instance="{view[b]["id"]}"}} 1.0' in text


async def test_kinds_are_detected(stubs, start_engine, start_router, http):
    (_, v), (_, s) = await stubs("vllm"), await stubs("sglang")
    k, _ = await start_engine()
    router, _ = await start_router([v, s, k])

    async def discovered():
        return all(i["routable"] for i in (await instances(http, router)).values())

    await until(discovered)
    view = await instances(http, router)
    assert [view[u]["kind"] for u in (v, s, k)] == ["vllm", "sglang", "kvroute"]
    assert view[s]["engine"]["engine_block_size"] == 16 and view[s]["kv_events"] is None
    assert view[k]["without_kv_events"] is None  # a kvroute engine's events come from /kv/events


async def test_a_foreign_engine_without_an_event_source_is_flagged_once(stubs, publishers, start_router, http,
                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="kvroute.router.fleet.cluster")
    (_, v), (_, s), (_, fed) = await stubs("vllm"), await stubs("sglang"), await stubs("vllm")
    pub = publishers()
    router, _ = await start_router([v, s, fed], engine_kinds=(f"{v}=vllm", f"{fed}=vllm"),  # s: detected
                                   kv_event_sources=(f"{fed}={pub.endpoint}",))

    async def discovered():
        return all(i["routable"] for i in (await instances(http, router)).values())

    await until(discovered)
    await asyncio.sleep(0.5)  # more health probes: still one line per engine
    view = await instances(http, router)
    assert view[v]["without_kv_events"] == "a vllm engine without --kv-event-source: no KV events, routed on load alone"
    assert view[s]["without_kv_events"].startswith("a sglang engine without --kv-event-source")
    assert view[fed]["without_kv_events"] is None
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "without --kv-event-source" in r.getMessage()]
    assert len(warned) == 2 and any(v in w for w in warned) and any(s in w for w in warned), warned


async def test_sglang_load_from_metrics_or_get_load(stubs, start_router, http):
    (with_metrics, m), (without, g) = await stubs("sglang"), await stubs("sglang", metrics=False)
    with_metrics.running, with_metrics.usage = 3, 0.5
    without.running, without.waiting = 4, 6
    router, _ = await start_router([m, g], engine_kinds=("sglang",))

    async def loaded():
        view = await instances(http, router)
        return all(view[u]["load"] for u in (m, g))

    await until(loaded)
    view = await instances(http, router)
    assert view[m]["load"]["running"] == 3 and view[m]["load"]["kv_used_blocks"] == 500
    assert view[m]["engine"]["load_source"] == "/metrics"
    assert (view[g]["load"]["running"], view[g]["load"]["waiting"]) == (4, 6)
    assert view[g]["load"]["queued_prefill_tokens"] == 100 and view[g]["engine"]["load_source"] == "/get_load"


class ShiftedTokenizer:
    """An engine tokenizer that disagrees with the router's."""

    def __init__(self, inner):
        self.inner = inner

    def encode(self, text):
        return [i + 1 for i in self.inner.encode(text)]

    def encode_chat(self, messages):
        return self.inner.encode_chat(messages)


async def test_a_tokenizer_mismatch_is_flagged_not_silently_zero(stubs, start_router, http):
    _, url = await stubs("vllm", tokenizer=ShiftedTokenizer(load_tokenizer()))
    router, _ = await start_router([url], engine_kinds=(f"{url}=vllm",))

    async def discovered():
        return (await instances(http, router))[url]["routable"]

    await until(discovered)
    view = (await instances(http, router))[url]
    assert view["mismatch"] and "disagrees on a completion" in view["mismatch"][0]


@pytest.mark.parametrize("overrides,message", [
    ({"engine_kinds": ("tgi",)}, "--engine-kind must be one of"),
    ({"engine_kinds": ("http://h:9=vllm",)}, "not one of the --engine URLs"),
    ({"kv_event_sources": ("http://h:1=tcp://*:5557",)}, "not a wildcard"),
    ({"kv_event_sources": ("http://h:1=localhost:5557",)}, "not a ZeroMQ endpoint"),
    ({"kv_event_sources": ("http://h:1",)}, "URL=ENDPOINT"),
    ({"kv_event_sources": ("http://h:1=tcp://h:1", "http://h:1/=tcp://h:2")}, "given twice"),
    ({"kv_event_replay_sources": ("http://h:1=tcp://h:2",)}, "needs a --kv-event-source"),
    ({"kv_event_sources": ("http://h:1=tcp://h:1,tcp://h:3",), "kv_event_replay_sources": ("http://h:1=tcp://h:2",)},
     "2 event endpoint(s) but 1 replay"),
    ({"kv_event_block_size": 0}, "--kv-event-block-size"),
])
def test_flag_validation(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RouterConfig(engines=("http://h:1",), **overrides)


def test_router_cli_rejects_bad_sources_in_one_line(capsys):
    from kvroute.router.service.cli import main

    assert main(["--engine", "http://h:1", "--kv-event-source", "http://h:2=tcp://h:5557"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not one of the --engine URLs" in err


def test_prometheus_scanner():
    text = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0"} 3\n'
            'vllm:num_requests_running{engine="1"} 2.5 1700000000000\nvllm:num_requests_running_max 9\n'
            'xvllm:num_requests_running 7\nvllm:gpu_cache_usage_perc 0.5\n'
            'vllm:cache_config_info{block_size="32",note="a \\"q\\" b"} 1.0')
    assert metric_sum(text, "vllm:num_requests_running") == 5.5
    assert metric_max(text, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") == 0.5
    assert metric_sum(text, "vllm:num_requests_waiting") is None
    assert metric_labels(text, "vllm:cache_config_info") == {"block_size": "32", "note": 'a \\"q\\" b'}
