"""Limits are enforced before the work they bound (router/contract/limits.py, router/contract/http.py),
on real sockets: a body declared or sent past --max-body-bytes is refused before the rest of it
arrives (the client here never sends the rest, so a server that waits for it never answers), and
a prompt of exactly max_model_len tokens is refused by the router, not routed to an engine."""

from __future__ import annotations

import asyncio
import urllib.parse

import numpy as np
import orjson
import pytest
from aiohttp import web

from kvroute.router.contract.errors import BadRequest, ContextTooLong
from kvroute.router.contract.limits import (
    BYTES_PER_CHAR,
    CHARS_PER_TOKEN,
    FALLBACK_MAX_MODEL_LEN,
    MESSAGE_TEMPLATE_CHARS,
    MIN_BODY_BYTES,
    Limits,
    check_prompt_chars,
    check_token_count,
    check_token_ids,
    check_vocabulary,
    prompt_chars,
)
from kvroute.router.contract.openai_request import parse_request
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.waiting import wait_for

LIMIT = 4096
MAX_MODEL_LEN = 64
ANSWER_WITHIN_S = 10.0  # a bound on a wait that should take milliseconds; never reached when correct


class CountingEngine:
    """A kvroute-kind engine advertising a 64-token context; counts the completions it is sent."""

    def __init__(self) -> None:
        self.completions = 0

    def app(self) -> web.Application:
        info = {"instance_id": "small", "model": "kvroute-tiny", "block_size": 16,
                "hash_seed": hash_seed("kvroute-tiny"), "tokenizer": load_tokenizer().fingerprint,
                "role": "both", "max_model_len": MAX_MODEL_LEN, "vocab_size": 8192}
        load = {"instance": "small", "running": 0, "waiting": 0, "kv_used_blocks": 0, "kv_total_blocks": 64,
                "queued_prefill_tokens": 0}

        async def complete(request):
            self.completions += 1
            await request.read()
            return web.json_response({"id": "c", "object": "text_completion", "model": "kvroute-tiny",
                                      "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        async def events(_):
            await asyncio.sleep(0.2)
            return web.json_response({"instance": "small", "epoch": 1, "seq": 0, "resync": False, "events": []})

        app = web.Application()
        app.router.add_get("/kv/info", lambda _: web.json_response(info))
        app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
        app.router.add_get("/load", lambda _: web.json_response(load))
        app.router.add_get("/kv/snapshot", lambda _: web.json_response(
            {"instance": "small", "epoch": 1, "seq": 0, "tiers": {"device": []}}))
        app.router.add_get("/kv/events", events)
        app.router.add_post("/v1/completions", complete)
        return app


async def counted_router(start_router) -> tuple[str, CountingEngine, LoopbackServer]:
    stub = CountingEngine()
    engine = await LoopbackServer(stub.app()).start()
    url, server = await start_router([engine.url], max_body_bytes=LIMIT)
    assert await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    return url, stub, engine


@pytest.fixture
async def router_url(start_router):
    url, stub, engine = await counted_router(start_router)
    yield url, stub
    await engine.close()


@pytest.fixture(params=["router", "engine"])
async def target(request, start_router, start_engine):
    """The base URL of a router over CountingEngine, or of a sim engine; both with --max-body-bytes 4096."""
    if request.param == "engine":
        url, _ = await start_engine(max_body_bytes=LIMIT)
        yield url
        return
    url, _, engine = await counted_router(start_router)
    yield url
    await engine.close()


async def status_of_partial_upload(url: str, headers: dict[str, str], sent: bytes) -> int:
    """POST /v1/completions with `headers` and `sent` of the body, then nothing more; the status
    the server answers while the rest of the body is still due."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": u.netloc, "Content-Type": "application/json",
                                                      **headers}.items())
        writer.write(f"POST /v1/completions HTTP/1.1\r\n{head}\r\n".encode() + sent)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), ANSWER_WITHIN_S)
        return int(status_line.split()[1])
    finally:
        writer.close()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_declared_length_over_the_limit_is_refused_before_any_byte(target):
    assert await status_of_partial_upload(target, {"Content-Length": str(LIMIT + 1)}, b"") == 413


async def test_chunked_body_is_refused_as_soon_as_it_passes_the_limit(target):
    sent = chunk(b" " * (LIMIT // 2)) + chunk(b" " * (LIMIT // 2 + 1))  # and no last chunk, ever
    assert await status_of_partial_upload(target, {"Transfer-Encoding": "chunked"}, sent) == 413


async def test_a_body_up_to_the_limit_is_read(target):
    body = orjson.dumps({"prompt": "hi", "max_tokens": 1})
    assert await status_of_partial_upload(target, {"Content-Length": str(len(body))}, body) == 200
    body += b" " * (LIMIT - len(body))  # exactly the limit
    assert await status_of_partial_upload(target, {"Content-Length": str(len(body))}, body) == 200
    sent = chunk(body[:100]) + chunk(body[100:]) + b"0\r\n\r\n"
    assert await status_of_partial_upload(target, {"Transfer-Encoding": "chunked"}, sent) == 200


def test_token_count_limit_is_exclusive_of_max_model_len():
    limits = Limits.derive(MAX_MODEL_LEN, 8192)
    check_token_count(MAX_MODEL_LEN - 1, limits)
    check_token_ids([5] * (MAX_MODEL_LEN - 1), limits)
    for n in (MAX_MODEL_LEN, MAX_MODEL_LEN + 1):
        with pytest.raises(ContextTooLong):
            check_token_count(n, limits)
        with pytest.raises(ContextTooLong):
            check_token_ids([5] * n, limits)


async def test_prompt_of_exactly_max_model_len_tokens_is_refused_by_the_router(router_url, http):
    url, stub = router_url
    async with http.post(url + "/v1/completions", json={"prompt": [5] * MAX_MODEL_LEN, "max_tokens": 1}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "context_length_exceeded"
    assert stub.completions == 0
    async with http.post(url + "/v1/completions", json={"prompt": [5] * (MAX_MODEL_LEN - 1), "max_tokens": 1}) as r:
        assert r.status == 200
    assert stub.completions == 1


# --- the checks themselves (router/contract/limits.py), every branch and edge ---------------------

def completion(**body):
    return parse_request({"max_tokens": 1, **body}, "chat" if "messages" in body else "completion")


def test_prompt_chars_counts_text_and_the_template_per_message():
    assert prompt_chars(completion(prompt="hello")) == 5
    assert prompt_chars(completion(prompt=[5, 6, 7])) == 0  # token ids: nothing to count
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "text", "text": "de"}]}]
    want = 3 * MESSAGE_TEMPLATE_CHARS + len("user") * 2 + len("assistant") + 5 + 0 + 5
    assert prompt_chars(completion(messages=msgs)) == want
    assert prompt_chars(completion(messages=msgs[2:])) == MESSAGE_TEMPLATE_CHARS + 4 + 5


def test_prompt_chars_limit_is_inclusive_and_names_the_field():
    limits = Limits.derive(64, 8192, prompt_chars=10)
    assert check_prompt_chars(completion(prompt="x" * 10), limits) == 10
    with pytest.raises(ContextTooLong) as e:
        check_prompt_chars(completion(prompt="x" * 11), limits)
    assert e.value.param == "prompt" and "11 characters" in e.value.message and "limit is 10" in e.value.message
    with pytest.raises(ContextTooLong) as e:
        check_prompt_chars(completion(messages=[{"role": "user", "content": "x"}]), Limits.derive(64, 0, 20))
    assert e.value.param == "messages" and "21 characters" in e.value.message


def test_token_count_error_names_the_prompt_and_the_context():
    with pytest.raises(ContextTooLong) as e:
        check_token_count(MAX_MODEL_LEN, Limits.derive(MAX_MODEL_LEN, 8192))
    assert e.value.param == "prompt"
    assert e.value.message == f"prompt has {MAX_MODEL_LEN} tokens; this model's context is {MAX_MODEL_LEN} tokens"


def test_vocabulary_check_on_lists_and_packed_ids():
    limits = Limits.derive(MAX_MODEL_LEN, 256)
    check_vocabulary([0, 255], limits)
    check_vocabulary([], limits)
    check_vocabulary(b"", limits)
    check_vocabulary([10**6], Limits.derive(MAX_MODEL_LEN, 0))  # no vocabulary advertised: not checked
    for ids in ([3, 256], np.array([3, 300], "<u4").tobytes()):  # packed 300: no byte of it is past 255
        with pytest.raises(BadRequest) as e:
            check_vocabulary(ids, limits)
        assert e.value.param == "prompt" and "out of the vocabulary (size 256)" in e.value.message
    check_vocabulary(np.array([3, 255], "<u4").tobytes(), limits)
    with pytest.raises(BadRequest):
        check_token_ids([1, 256], limits)


def test_limits_derive_from_the_context_or_the_overrides():
    assert Limits.derive(0, 0) == Limits(FALLBACK_MAX_MODEL_LEN, 0, CHARS_PER_TOKEN * FALLBACK_MAX_MODEL_LEN,
                                         BYTES_PER_CHAR * CHARS_PER_TOKEN * FALLBACK_MAX_MODEL_LEN)
    small = Limits.derive(1024, 8192)
    assert small == Limits(1024, 8192, 8192, MIN_BODY_BYTES)  # 32 kB of text still gets 1 MiB of body
    big = Limits.derive(65536, 32000)
    assert (big.max_prompt_chars, big.max_body_bytes, big.vocab_size) == (524288, 2097152, 32000)
    assert Limits.derive(65536, 32000, prompt_chars=100, body_bytes=5000) == Limits(65536, 32000, 100, 5000)
    assert Limits.derive(1024, 1, prompt_chars=1 << 20).max_body_bytes == 4 << 20
