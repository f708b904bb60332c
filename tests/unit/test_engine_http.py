"""The engine's HTTP API over real loopback sockets (sim backend unless stated)."""

import asyncio
import json

import pytest

from tests.support.sse import sse_events

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8  # several full blocks


async def post(http, url, body):
    async with http.post(url, json=body) as r:
        return r.status, await r.json(), r.headers


async def test_completion_reports_cached_tokens_on_repeat(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    status, first, headers = await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    assert status == 200 and headers["x-kvroute-instance"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["usage"]["completion_tokens"] == 4 and first["choices"][0]["finish_reason"] == "length"
    _, second, _ = await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0 and cached < second["usage"]["prompt_tokens"]


async def test_streaming_chunks_and_final_usage(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(r)
    assert events[-1] == b"[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert "cached_tokens" in chunks[-1]["usage"]["prompt_tokens_details"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert len(chunks) >= 4  # role chunk, at least one content chunk, final chunk, usage chunk


async def test_events_and_snapshot_after_a_request(start_engine, http):
    from kvroute.router.contract.protocol import block_hashes, hash_seed
    from kvroute.router.contract.tokenizer import load_tokenizer

    url, _ = await start_engine(time_scale=0.01)
    await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        feed = await r.json()
    stored = [h for e in feed["events"] if e["type"] == "stored" for h in e["blocks"]]
    ids = load_tokenizer().encode(PROMPT)
    expected = block_hashes(ids, 16, hash_seed("kvroute-tiny"))
    assert stored[: len(expected)] == expected  # the router can compute the same hashes
    assert [e["seq"] for e in feed["events"]] == list(range(1, feed["seq"] + 1))
    async with http.get(url + "/kv/snapshot") as r:
        snap = await r.json()
    assert set(expected) <= set(snap["tiers"]["device"]) and snap["seq"] == feed["seq"]
    assert snap["epoch"] == feed["epoch"]


async def test_events_long_poll_wakes_and_resyncs(start_engine, http):
    url, _ = await start_engine(time_scale=0.01, event_buffer=4)
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        base = (await r.json())["seq"]
    poll = asyncio.ensure_future(http.get(url + "/kv/events", params={"since": base, "timeout": 10}))
    await asyncio.sleep(0.1)
    assert not poll.done()
    await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    async with await asyncio.wait_for(poll, 5) as r:
        woke = await r.json()
    assert woke["events"] and not woke["resync"]
    for i in range(6):  # push the first events out of the 4-event buffer
        await post(http, url + "/v1/completions", {"prompt": f"{i} " + PROMPT, "max_tokens": 2})
    async with http.get(url + "/kv/events", params={"since": 1}) as r:
        stale = await r.json()
    assert stale["resync"] is True and stale["events"] == []
    async with http.get(url + "/kv/events", params={"since": 0, "epoch": 1}) as r:
        assert (await r.json())["resync"] is True  # another epoch


async def test_abort_on_disconnect_frees_blocks(start_engine, http):
    url, server = await start_engine(time_scale=20.0)  # slow steps so the request is still running
    from kvroute.engine.service.server import ENGINE

    engine = server.app[ENGINE]
    body = {"prompt": PROMPT, "max_tokens": 500, "stream": True, "ignore_eos": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        await r.content.readline()  # first chunk: it is running
        assert engine.block_manager.num_used > 0
    for _ in range(100):
        if engine.block_manager.num_used == 0 and not engine.scheduler.running:
            break
        await asyncio.sleep(0.05)
    assert engine.block_manager.num_used == 0 and not engine.requests


async def test_load_and_info_and_models(start_engine, http):
    url, _ = await start_engine(time_scale=0.01, instance_id="e7", role="both")
    async with http.get(url + "/kv/info") as r:
        info = await r.json()
    for key in ("instance_id", "model", "block_size", "hash_seed", "tokenizer", "role", "cluster_id"):
        assert key in info
    assert info["instance_id"] == "e7" and info["cluster_id"] == "e7" and info["block_size"] == 16
    async with http.get(url + "/load") as r:
        load = await r.json()
    assert load["instance"] == "e7" and load["kv_total_blocks"] == 4096 and load["running"] == 0
    assert load["kv_free_blocks"] == 4096 and load["kv_evictable"] == []
    status, _, _ = await post(http, url + "/v1/completions", {"prompt": [7] * 100, "max_tokens": 2})
    async with http.get(url + "/load") as r:
        load = await r.json()
    assert status == 200 and sum(n for n, _ in load["kv_evictable"]) == 6  # 100 prompt tokens: 6 full blocks cached
    assert load["kv_free_blocks"] == 4096 - 6 and all(idle >= 0 for _, idle in load["kv_evictable"])
    async with http.get(url + "/v1/models") as r:
        assert (await r.json())["data"][0]["id"] == "kvroute-tiny"
    async with http.get(url + "/get_load") as r:
        assert (await r.json())["num_reqs"] == 0
    async with http.get(url + "/get_model_info") as r:
        assert (await r.json())["is_generation"] is True
    async with http.get(url + "/get_server_info") as r:
        assert (await r.json())["block_size"] == 16
    status, tok, _ = await post(http, url + "/tokenize", {"prompt": "hello world"})
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 0


async def test_server_info_lists_the_settings_without_credentials(start_engine, http):
    url, _ = await start_engine(admin_key="admin-s3cret", kv_secret="kv-s3cret", num_blocks=64)
    async with http.get(url + "/get_server_info") as r:
        text = await r.text()
    info = json.loads(text)
    assert info["num_blocks"] == 64 and info["backend"] == "sim" and info["instance_id"] == "e0"
    assert "s3cret" not in text and "admin_key" not in info and "kv_secret" not in info


async def test_metrics_use_vllm_names(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    await post(http, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"):
        assert name in text
    hits = [line for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    assert float(hits[0].split()[-1]) > 0


async def test_stop_string_truncates(start_engine, http):
    url, _ = await start_engine(backend="torch")
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    _, full, _ = await post(http, url + "/v1/completions", body)
    text = full["choices"][0]["text"]
    stop = text[4:7]
    assert stop.strip(), "need a visible stop string"
    _, cut, _ = await post(http, url + "/v1/completions", {**body, "stop": [stop]})
    assert cut["choices"][0]["text"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


async def test_torch_greedy_is_deterministic_and_seeded_sampling_repeats(start_engine, http):
    url, _ = await start_engine(backend="torch")
    greedy = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    a = (await post(http, url + "/v1/completions", greedy))[1]["choices"][0]["text"]
    b = (await post(http, url + "/v1/completions", greedy))[1]["choices"][0]["text"]  # served from cache
    assert a == b
    seeded = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 42}
    c = (await post(http, url + "/v1/completions", seeded))[1]["choices"][0]["text"]
    d = (await post(http, url + "/v1/completions", seeded))[1]["choices"][0]["text"]
    assert c == d


BAD = [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", b'{"max_tokens": 3}', 400, "'prompt' is required"),
    ("/v1/chat/completions", b'{"max_tokens": 3}', 400, "'messages' is required"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "non-empty list"),
    ("/v1/completions", b'{"prompt": 5}', 400, "'prompt' must be"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, "at least 1"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', 400, "integer"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 5000}', 400, "context of 4096"),
    ("/v1/completions", b'{"prompt": [1, 99999]}', 400, "vocabulary"),
    ("/v1/completions", b'{"prompt": "x", "model": "gpt-9"}', 404, "does not exist"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', 400, "boolean"),
    ("/v1/nothing", b"{}", 404, ""),
]


@pytest.mark.parametrize("path,body,status,message", BAD)
async def test_bad_input_gets_openai_error(start_engine, http, path, body, status, message):
    url, _ = await start_engine(time_scale=0.01)
    async with http.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        err = (await r.json())["error"]
    assert message in err["message"] and err["type"] and "code" in err


async def test_prompt_beyond_context_and_pool(start_engine, http):
    url, _ = await start_engine(time_scale=0.01, num_blocks=8)
    status, body, _ = await post(http, url + "/v1/completions", {"prompt": [5] * 5000})
    assert status == 400 and "4096" in body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    status, body, _ = await post(http, url + "/v1/completions", {"prompt": [5] * 200})
    assert status == 400 and "pool holds 128" in body["error"]["message"]
    status, _, _ = await post(http, url + "/v1/completions", {"prompt": [5] * 20, "max_tokens": 2})
    assert status == 200  # the server is still alive


async def test_full_queue_gets_503_with_retry_after(start_engine, http):
    url, _ = await start_engine(time_scale=50.0, max_running=1, max_waiting=1)
    body = {"prompt": PROMPT, "max_tokens": 100, "ignore_eos": True}
    tasks = []
    for _ in range(2):  # one running, then one waiting
        tasks.append(asyncio.ensure_future(post(http, url + "/v1/completions", body)))
        await asyncio.sleep(0.2)
    async with http.get(url + "/load") as r:
        load = await r.json()
    assert (load["running"], load["waiting"]) == (1, 1)
    status, err, headers = await post(http, url + "/v1/completions", body)
    assert status == 503 and int(headers["Retry-After"]) >= 1 and "queue is full" in err["error"]["message"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
