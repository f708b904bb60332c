"""No client can steer an engine's K/V (docs/architecture.md#trust-rules): client
`kv_transfer_params` are stripped by the router and refused by engines unless signed
with the fleet's secret or coming from a configured peer."""

import asyncio

import torch

from kvroute.engine.service.server import ENGINE
from kvroute.router.contract.kv_auth import make_grant
from tests.support.kv_transfer_fakes import SECRET, Listener, evil_prefill, forged_handle, ids, post, sign_handle
from tests.support.loopback import LoopbackServer
from tests.support.waiting import wait_for

torch.set_num_threads(1)


async def test_client_handle_never_makes_an_engine_connect(start_engine, start_router, http):
    listener = Listener()
    address = await listener.start() + "/anything?x=1"
    try:
        both_url, _ = await start_engine(time_scale=0.01, role="both")
        decode_url, _ = await start_engine(time_scale=0.01, role="decode", kv_secret=SECRET)
        router_url, _ = await start_router([both_url])
        prompt = ids(1, 64)
        body = {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": forged_handle(address, prompt)}
        for url in (both_url, decode_url):
            status, out = await post(http, url, body)
            assert status == 403 and out["error"]["code"] == "kv_transfer_refused"
        forged = forged_handle(address, prompt, signature="0" * 64)  # a made-up signature
        status, _ = await post(http, decode_url, {**body, "kv_transfer_params": forged})
        assert status == 403
        await wait_for(lambda: False, timeout=0.2)
        status, out = await post(http, router_url, body)  # through the router: the field is stripped
        assert status == 200 and out["usage"]["completion_tokens"] == 2
        await asyncio.sleep(0.2)
        assert listener.connections == 0
    finally:
        await listener.close()


async def test_cache_poisoning_sequence_leaves_victims_output_clean(start_engine, start_router, http):
    victim_url, victim = await start_engine(backend="torch", role="both", instance_id="victim")
    clean_url, _ = await start_engine(backend="torch", role="both", instance_id="clean")
    router_url, _ = await start_router([victim_url])
    async with http.get(victim_url + "/kv/info") as r:
        info = await r.json()
    p_ids = ids(2, 96)
    payload_bytes = victim.app[ENGINE].runner.transfer_payload_bytes
    evil = await LoopbackServer(evil_prefill(info, p_ids, payload_bytes)).start()
    try:
        attack = {"prompt": p_ids, "max_tokens": 1, "kv_transfer_params": forged_handle(evil.url, p_ids)}
        for url in (victim_url, router_url):
            await post(http, url, attack)
        tenant = {"prompt": p_ids + ids(3, 20), "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        status, got = await post(http, router_url, tenant)
        _, want = await post(http, clean_url, tenant)
        assert status == 200 and got["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        await evil.close()


async def test_bad_frame_from_a_signed_handle_ends_the_request_and_frees_its_blocks(start_engine, http):
    victim_url, victim = await start_engine(backend="torch", role="decode", instance_id="dv", kv_secret=SECRET)
    clean_url, _ = await start_engine(backend="torch", role="both", instance_id="clean2")
    engine = victim.app[ENGINE]
    async with http.get(victim_url + "/kv/info") as r:
        info = await r.json()
    p_ids = ids(4, 100)
    evil = await LoopbackServer(evil_prefill(info, p_ids, engine.runner.transfer_payload_bytes,
                                             length_delta=-8)).start()
    try:
        params = forged_handle(evil.url, p_ids)
        params["handle"]["signature"] = sign_handle(params["handle"])
        body = {"prompt": p_ids, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        results = await asyncio.wait_for(asyncio.gather(*(post(http, victim_url, {**body, "kv_transfer_params": params})
                                                          for _ in range(3))), timeout=30)
        _, ref = await post(http, clean_url, {**body, "prompt": p_ids + [7], "max_tokens": 3})
        for status, out in results:  # computed locally instead: correct output, the request ended
            assert status == 200 and out["usage"]["completion_tokens"] == 4
            assert out["choices"][0]["text"].endswith(ref["choices"][0]["text"])
        assert await wait_for(lambda: not engine.scheduler.running and not engine.requests)
        assert engine.block_manager.num_used == 0
    finally:
        await evil.close()


async def test_client_do_remote_decode_pins_nothing(start_engine, start_router, http):
    p_url, p = await start_engine(backend="sim", time_scale=0.01, role="prefill", instance_id="pp", kv_secret=SECRET,
                                  num_blocks=128)
    engine = p.app[ENGINE]
    router_url, _ = await start_router([p_url], kv_secret=SECRET)
    body = {"prompt": ids(5, 600), "max_tokens": 3}
    for grant in ({"do_remote_decode": True}, make_grant("wrong-secret", "pp", p_url),
                  make_grant(SECRET, "someone-else", p_url), make_grant(SECRET, "pp", p_url, ttl_s=-1)):
        status, out = await post(http, p_url, {**body, "kv_transfer_params": grant})
        assert status == 403, out
    status, _ = await post(http, router_url, {**body, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200
    assert not engine.pinned.pinned and engine.block_manager.num_used == 0
    good = make_grant(SECRET, "pp", p_url)
    status, pre = await post(http, p_url, {**body, "kv_transfer_params": good})
    assert status == 200 and len(engine.pinned.pinned) == 1
    status, _ = await post(http, p_url, {**body, "kv_transfer_params": good})
    assert status == 403  # a grant is used once
    async with http.post(p_url + "/kv/transfer", json={"request_id": pre["id"]}) as r:
        assert r.status == 403  # no signature: nobody else reads the pinned K/V


async def test_configured_peers_disaggregate_without_a_secret(start_engine, start_router, http):
    p_url, _ = await start_engine(backend="torch", role="prefill", instance_id="p0", kv_peers=("127.0.0.1",))
    d_url, _ = await start_engine(backend="torch", role="decode", instance_id="d0", kv_peers=("127.0.0.1",))
    router_url, server = await start_router([p_url, d_url])
    body = {"prompt": ids(6, 400), "max_tokens": 4, "stream": True, "ignore_eos": True}
    async with http.post(router_url + "/v1/completions", json=body) as r:
        assert r.status == 200 and r.headers.get("x-kvroute-prefill-instance") == "p0"
        assert b"[DONE]" in await r.read()


async def test_a_handle_replayed_with_another_tail_is_computed_locally(start_engine, http):
    """A captured, unused handle for prompt P, used with a prompt that shares P's full blocks and has
    another tail, used to make the decode engine write P's partial-block K/V into that request."""
    p_url, _ = await start_engine(backend="torch", role="prefill", instance_id="hp", kv_secret=SECRET)
    d_url, decode = await start_engine(backend="torch", role="decode", instance_id="hd", kv_secret=SECRET)
    clean_url, _ = await start_engine(backend="torch", role="both", instance_id="hc")
    full = ids(7, 96)  # six full blocks
    p_prompt, q_prompt = full + ids(8, 9), full + ids(9, 9)  # same full blocks, another partial block
    status, pre = await post(http, p_url, {"prompt": p_prompt, "max_tokens": 1, "temperature": 0,
                                           "kv_transfer_params": make_grant(SECRET, "hp", p_url)})
    assert status == 200
    handle = pre["kv_transfer_params"]
    body = {"prompt": q_prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, got = await post(http, d_url, {**body, "kv_transfer_params": handle})
    _, want = await post(http, clean_url, body)
    assert status == 200 and got["choices"][0]["text"] == want["choices"][0]["text"]
    metrics = decode.app[ENGINE].metrics
    assert metrics.kv_pull_failures.labels("HandleMismatch")._value.get() == 1
    assert metrics.kv_pull_blocks._value.get() == 0  # nothing of P was pulled into Q
