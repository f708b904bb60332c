"""The proxy's per-request record and its client (router/service/proxy.py `Dispatch`, `Router.observe_choice`,
`_post`), on a live router over loopback stubs: a dispatch ends once and sees its first byte once, a
streamed or unflagged one never waits in the non-streamed set, the instance that answered is the
one the request's trace and duration carry, the predicted cached tokens reach the metrics and the
recent-request stats, and plain-http engines get the router's lean client at their own host."""

import orjson
from aiohttp import web

from kvroute.router.service.app import CLUSTER, ROUTER
from kvroute.router.service.charges import Dispatch
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import answer_ok, close_all, stub_engine, stub_router
from tests.support.waiting import wait_for

CHUNK = b'data: {"choices": [{"index": 0, "text": "ok"}]}\n\n'
PROMPT = " ".join(f"w{i}" for i in range(200))


async def metric_lines(http, url, name):
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")}


async def test_a_dispatch_ends_once_and_sees_its_first_byte_once(start_router):
    url, server, stubs = await stub_router(start_router, answer_ok)
    router, inst = server.app[ROUTER], server.app[CLUSTER].by_id("s0")
    try:
        prepared = await router.prepare({"prompt": PROMPT, "max_tokens": 1}, "completion")
        choice = await router.decide(prepared, record=False)
        progress = []
        dispatch = Dispatch(router, prepared, choice, on_progress=lambda: progress.append(1))
        assert not inst.nonstreamed  # not flagged whole: its prefill is released by its first byte
        assert inst.inflight == 1 and inst.queued_prefill_tokens == choice.uncached_tokens > 0
        dispatch.first_byte()
        dispatch.first_byte()
        assert inst.queued_prefill_tokens == 0 and progress == [1]
        dispatch.end("200")
        dispatch.end("200")
        assert inst.inflight == 0 and inst.queued_prefill_tokens == 0 and progress == [1, 1]
        streamed = Dispatch(router, prepared, choice, whole_body=False)
        assert not inst.nonstreamed
        streamed.end("cancelled")
        whole = Dispatch(router, prepared, choice, whole_body=True)
        assert len(inst.nonstreamed) == 1
        whole.end("200")
        assert inst.inflight == 0 and inst.queued_prefill_tokens == 0
    finally:
        await close_all(stubs)


async def test_the_answering_instance_is_on_the_requests_duration(start_router, http):
    url, server, stubs = await stub_router(start_router, answer_ok)
    try:
        for stream in (False, True):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                                "stream": stream}) as r:
                assert r.status == 200
                await r.read()
        counts = await metric_lines(http, url, "kvroute_router_request_duration_seconds_count")
        assert [(k.split('instance="')[1].split('"')[0], v) for k, v in counts.items()] == [("s0", 2.0)]
    finally:
        await close_all(stubs)


async def test_predicted_cached_tokens_reach_the_metrics_and_the_recent_stats(start_router, http):
    url, server, stubs = await stub_router(start_router, answer_ok)
    router, cluster = server.app[ROUTER], server.app[CLUSTER]
    try:
        prepared = await router.prepare({"prompt": PROMPT, "max_tokens": 1}, "completion")
        assert await wait_for(lambda: not cluster.by_id("s0").needs_resync)  # its (empty) snapshot is in
        held = prepared.route.block_hashes[:4]  # the index says s0 holds the prompt's first 4 blocks
        await cluster.index.add("s0", "device", list(held))
        async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as r:
            assert r.status == 200
        cached, tokens = 4 * prepared.route.block_size, prepared.num_tokens
        assert await metric_lines(http, url, "kvroute_router_predicted_cached_tokens_total") == {
            "kvroute_router_predicted_cached_tokens_total": float(cached)}
        assert await metric_lines(http, url, "kvroute_router_cached_token_ratio_sum") == {
            "kvroute_router_cached_token_ratio_sum": cached / tokens}
        async with http.get(url + "/router/stats?window=100") as r:
            assert r.status == 200
            stats = orjson.loads(await r.read())
        everyone = stats["models"]["*"]  # the engine reported no usage: the prediction stands in
        assert round(everyone["prefill_tokens_per_s"] * 100) == tokens - cached
    finally:
        await close_all(stubs)


async def test_plain_http_engines_get_the_lean_client_at_their_own_host(start_router, http):
    seen = []

    async def records(request):
        seen.append(dict(request.headers))
        return await answer_ok(request)

    stub = await LoopbackServer(stub_engine("s0", records)).start()
    try:
        url, server = await start_router([stub.url])
        assert await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
        for stream in (False, True):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                                "stream": stream}) as r:
                assert r.status == 200
        host = stub.url.removeprefix("http://")
        assert [h["Host"] for h in seen] == [host, host]
        assert not any("User-Agent" in h for h in seen)  # aiohttp's client would name itself
    finally:
        await stub.close()


async def test_an_engine_url_with_a_path_prefix_is_posted_to_under_it(start_router, http):
    outer = web.Application()
    outer.add_subapp("/pX", stub_engine("s0", answer_ok))
    stub = await LoopbackServer(outer).start()
    try:
        url, server = await start_router([stub.url + "/pX/"])
        assert await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
        for stream in (False, True):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                                "stream": stream}) as r:
                assert r.status == 200, await r.text()
    finally:
        await stub.close()


async def test_answers_whole_or_streamed_leave_their_connection_for_the_next(start_router, http):
    peers = []

    async def records(request):
        peers.append(request.transport.get_extra_info("peername"))
        if (await request.json()).get("max_tokens") == 2:
            return web.json_response({"error": {"message": "no"}}, status=400)
        return await answer_ok(request)

    url, server, stubs = await stub_router(start_router, records)
    try:
        for stream, max_tokens in ((False, 1), (False, 1), (True, 1), (True, 2), (False, 2), (True, 1)):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": max_tokens,
                                                                "stream": stream}) as r:
                assert r.status == (200 if max_tokens == 1 else 400)
                await r.read()
        assert len(peers) == 6 and len(set(peers)) == 1  # one kept-alive connection, reused each time
    finally:
        await close_all(stubs)
