"""Limits before work (issue 9): huge bodies, long prompts and out-of-range token ids are
refused before they cost anything, on the router and on the engine."""

import asyncio
import logging

import orjson
import pytest

from kvroute.router.service.app import CLUSTER
from tests.support.raw_client import stream_then_hang_up
from tests.support.router_cluster import cluster, complete, prompt

MB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def post_raw(http, url, data, **kw):
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}, **kw) as r:
        return r.status, await r.read()


@pytest.fixture
async def router_url(start_engine, start_router):
    url, _, engines = await cluster(start_engine, start_router, n=1)
    return url, engines[0][0]


@pytest.mark.parametrize("target", ["router", "engine"])
async def test_50mb_body_is_refused_with_413_and_little_memory(router_url, http, target):
    url = router_url[0] if target == "router" else router_url[1]
    big = b'{"prompt": "' + b"a" * (50 * MB) + b'"}'
    before = rss_bytes()
    small = asyncio.ensure_future(complete(http, router_url[0], prompt(1)))
    status, body = await post_raw(http, url + "/v1/completions", big)
    grown = rss_bytes() - before
    assert status == 413
    err = orjson.loads(body)["error"]
    assert err["code"] == "request_too_large" and "--max-body-bytes" in err["message"]
    assert grown < 200 * MB, f"RSS grew {grown / MB:.0f} MB"
    assert (await small)[0] == 200  # a concurrent small request is unaffected


async def test_chunked_body_is_cut_at_the_limit(router_url, http):
    async def chunks():
        for _ in range(64):
            yield b" " * MB

    status, body = await post_raw(http, router_url[0] + "/v1/completions", chunks())
    assert status == 413 and b"request_too_large" in body


@pytest.mark.parametrize("target", ["router", "engine"])
async def test_prompt_over_the_character_cap_is_refused_before_tokenizing(router_url, http, target):
    url = router_url[0] if target == "router" else router_url[1]
    status, body = await post_raw(http, url + "/v1/completions", orjson.dumps({"prompt": "word " * 7000}))
    assert status == 400
    err = orjson.loads(body)["error"]
    assert err["code"] == "context_length_exceeded" and "characters" in err["message"]
    chat = {"messages": [{"role": "user", "content": "x" * 40_000}]}
    status, body = await post_raw(http, url + "/v1/chat/completions", orjson.dumps(chat))
    assert status == 400 and b"characters" in body


@pytest.mark.parametrize("target", ["router", "engine"])
@pytest.mark.parametrize("bad_id,needle", [(2**32, b"between 0 and"), (8192, b"out of the vocabulary"),
                                           (2**64, b"between 0 and"), (-1, b"between 0 and")])
async def test_out_of_range_token_ids_are_400(router_url, http, target, bad_id, needle):
    url = router_url[0] if target == "router" else router_url[1]
    ids = [5] * 40 + [bad_id]  # the bad id sits inside a full block, so it would be hashed
    status, body = await post_raw(http, url + "/v1/completions", b'{"prompt": %s}' % str(ids).encode())
    assert status == 400, body
    assert needle in body and orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_router_refuses_prompts_beyond_the_context(router_url, http):
    status, body = await post_raw(http, router_url[0] + "/v1/completions", orjson.dumps({"prompt": [5] * 5000}))
    assert status == 400 and orjson.loads(body)["error"]["code"] == "context_length_exceeded"


async def test_limits_follow_the_engines_context(start_engine, start_router):
    _, server, _ = await cluster(start_engine, start_router, n=1)
    limits = server.app[CLUSTER].limits_for("kvroute-tiny")
    assert (limits.max_model_len, limits.vocab_size) == (4096, 8192)
    assert limits.max_prompt_chars == 8 * 4096 and server.app[CLUSTER].max_body_bytes == MB


async def test_long_chat_is_tokenized_off_the_loop(router_url, http):
    """A chat prompt of 30k characters does not stall a concurrent tiny request behind it."""
    chat = {"messages": [{"role": "user", "content": "hello there " * 1000}], "max_tokens": 1}
    results = await asyncio.gather(post_raw(http, router_url[0] + "/v1/chat/completions", orjson.dumps(chat)),
                                   complete(http, router_url[0], "hi", max_tokens=1))
    assert results[0][0] == 200 and results[1][0] == 200


async def test_client_leaving_after_done_logs_no_error(router_url, http, caplog):
    caplog.set_level(logging.WARNING)
    for i in range(10):
        seen = await stream_then_hang_up(router_url[0], {"prompt": prompt(2, i), "max_tokens": 4, "stream": True})
        assert b"[DONE]" in seen
    await asyncio.sleep(0.3)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, [rec.getMessage() for rec in errors]
