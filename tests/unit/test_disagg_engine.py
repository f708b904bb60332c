"""Prefill/decode disaggregation at the engine level (torch backend, loopback HTTP)."""

import asyncio
import random

import pytest
import torch

torch.set_num_threads(1)

BS = 16
SECRET = "test-fleet-secret"


def grant(p_url, instance):
    from kvroute.router.contract.kv_auth import make_grant

    return make_grant(SECRET, instance, p_url)


def prompt_ids(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(5, 8192) for _ in range(n)]


async def post(http, url, body):
    async with http.post(url + "/v1/completions", json=body) as r:
        return r.status, await r.json()


async def disaggregated(http, p_url, d_url, body, prefill_id="p0"):
    status, pre = await post(http, p_url, {**body, "kv_transfer_params": grant(p_url, prefill_id)})
    assert status == 200, pre
    params = pre["kv_transfer_params"]
    assert params["handle"]["address"] == p_url and params["handle"]["signature"]
    status, out = await post(http, d_url, {**body, "kv_transfer_params": params})
    return status, pre, out


async def metric(http, url, name):
    async with http.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


@pytest.fixture
async def pd(start_engine):
    p_url, p = await start_engine(backend="torch", role="prefill", instance_id="p0", kv_secret=SECRET)
    d_url, d = await start_engine(backend="torch", role="decode", instance_id="d0", kv_secret=SECRET)
    c_url, _ = await start_engine(backend="torch", role="both", instance_id="c0", kv_secret=SECRET)
    return p_url, d_url, c_url, p, d


async def test_disaggregated_greedy_equals_colocated(pd, http):
    p_url, d_url, c_url, _, _ = pd
    body = {"prompt": prompt_ids(1, 150), "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    _, colocated = await post(http, c_url, body)
    status, pre, out = await disaggregated(http, p_url, d_url, body)
    assert status == 200
    handle = pre["kv_transfer_params"]["handle"]
    assert handle["num_tokens"] == 150 and len(handle["block_hashes"]) == 150 // BS
    assert pre["usage"]["completion_tokens"] == 1
    assert out["choices"][0]["text"] == colocated["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 12
    assert await metric(http, d_url, "kvroute_engine_kv_pull_blocks_total") == -(-150 // BS)
    assert await metric(http, d_url, "kvroute_engine_kv_pull_bytes_total") > 0


async def test_decode_pulls_only_blocks_it_lacks(pd, http):
    p_url, d_url, _, _, _ = pd
    ids = prompt_ids(2, 100)  # 6 full blocks + a 4-token tail
    await post(http, d_url, {"prompt": ids[:40], "max_tokens": 1})  # d0 caches 2 full blocks of the prefix
    status, _, out = await disaggregated(http, p_url, d_url, {"prompt": ids, "max_tokens": 4, "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] == 4
    assert await metric(http, d_url, "kvroute_engine_kv_pull_skipped_blocks_total") == 2
    assert await metric(http, d_url, "kvroute_engine_kv_pull_blocks_total") == 7 - 2


async def test_mismatched_link_is_refused(start_engine, http):
    p_url, _ = await start_engine(backend="torch", role="prefill", instance_id="p32", block_size=32, kv_secret=SECRET)
    d_url, _ = await start_engine(backend="torch", role="decode", instance_id="d16", kv_secret=SECRET)
    status, _, out = await disaggregated(http, p_url, d_url, {"prompt": prompt_ids(3, 80), "max_tokens": 3}, "p32")
    assert status == 400
    assert "cannot link" in out["error"]["message"] and "block_size 32" in out["error"]["message"]
    assert out["error"]["code"] == "kv_link_mismatch"


async def test_pinned_blocks_expire(start_engine, http):
    from kvroute.engine.service.server import ENGINE

    p_url, p = await start_engine(backend="torch", role="prefill", instance_id="pt", kv_pin_ttl_s=0.3,
                                  kv_secret=SECRET)
    engine = p.app[ENGINE]
    status, pre = await post(http, p_url, {"prompt": prompt_ids(4, 64), "max_tokens": 5,
                                            "kv_transfer_params": grant(p_url, "pt")})
    assert status == 200 and engine.block_manager.num_used > 0 and len(engine.pinned.pinned) == 1
    for _ in range(40):
        await asyncio.sleep(0.1)
        if not engine.pinned.pinned:
            break
    assert engine.block_manager.num_used == 0
    assert await metric(http, p_url, "kvroute_engine_kv_pins_expired_total") == 1
    signature = pre["kv_transfer_params"]["handle"]["signature"]
    async with http.post(p_url + "/kv/transfer", json={"request_id": pre["id"], "signature": signature}) as r:
        assert r.status == 404  # gone: a late pull is refused, not served stale


async def test_pull_from_a_dead_prefill_falls_back_to_local_compute(start_engine, http):
    p_url, p = await start_engine(backend="torch", role="prefill", instance_id="pdead", kv_secret=SECRET)
    d_url, _ = await start_engine(backend="torch", role="decode", instance_id="dlive", kv_secret=SECRET)
    c_url, _ = await start_engine(backend="torch", role="both", instance_id="cref")
    body = {"prompt": prompt_ids(5, 90), "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    _, pre = await post(http, p_url, {**body, "kv_transfer_params": grant(p_url, "pdead")})
    await p.close()  # dies before the pull
    params = pre["kv_transfer_params"]
    status, out = await post(http, d_url, {**body, "kv_transfer_params": params})
    _, ref = await post(http, c_url, body)
    assert status == 200 and out["choices"][0]["text"] == ref["choices"][0]["text"]
    assert await metric(http, d_url, "kvroute_engine_kv_pull_failures_total") == 1


async def test_role_checks(pd, http):
    p_url, d_url, _, _, _ = pd
    status, out = await post(http, d_url, {"prompt": [5, 6, 7], "kv_transfer_params": grant(d_url, "d0")})
    assert status == 400 and "role prefill or both" in out["error"]["message"]
    _, pre = await post(http, p_url, {"prompt": [5] * 20, "max_tokens": 2, "kv_transfer_params": grant(p_url, "p0")})
    status, out = await post(http, p_url, {"prompt": [5] * 20, "kv_transfer_params": pre["kv_transfer_params"]})
    assert status == 400 and "role decode or both" in out["error"]["message"]


async def test_decode_without_room_waits_then_503(start_engine, http):
    p_url, _ = await start_engine(backend="sim", role="prefill", instance_id="pbig", time_scale=0.01, kv_secret=SECRET)
    d_url, _ = await start_engine(backend="sim", role="decode", instance_id="dsmall", num_blocks=300,
                                  kv_admit_timeout_s=0.5, time_scale=5.0, kv_secret=SECRET)
    hog = {"prompt": prompt_ids(6, 4000), "max_tokens": 20, "ignore_eos": True}  # 252 of the 300 blocks
    hog_task = asyncio.ensure_future(post(http, d_url, hog))
    await asyncio.sleep(1.0)  # it is running and holds its blocks
    body = {"prompt": prompt_ids(7, 1000), "max_tokens": 4}  # needs 63 blocks: more than are free
    _, pre = await post(http, p_url, {**body, "kv_transfer_params": grant(p_url, "pbig")})
    params = pre["kv_transfer_params"]
    async with http.post(d_url + "/v1/completions", json={**body, "kv_transfer_params": params}) as r:
        assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
        assert "no free KV blocks" in (await r.json())["error"]["message"]
    status, _ = await hog_task
    assert status == 200
