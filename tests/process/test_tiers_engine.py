"""KV tiers in running engines over loopback: host hits, store hits and failures, layouts, events, outages."""

import logging
import os

import torch

from kvroute.engine.core.kv_copies import CopyPlan
from kvroute.engine.core.work import SeqWork
from kvroute.engine.kv.store_probe import probe_namespace
from kvroute.engine.runners.torch_runner import TorchRunner
from tests.support.redis_server import RedisServer, free_port
from tests.support.tier_requests import (
    BS,
    GREEDY,
    SESSION,
    at_least,
    complete,
    evict,
    filler,
    metric,
    remote_written,
    wait_for,
)

torch.set_num_threads(1)


def test_host_round_trip_is_bit_identical_and_greedy_equals_a_fresh_compute():
    runner = TorchRunner(num_blocks=32, block_size=BS, host_blocks=8)
    try:
        prompt = SESSION[:64]
        runner.execute_sync([SeqWork(0, tuple(prompt), 0, (0, 1, 2, 3), False, GREEDY)])
        original = runner.read_blocks([0, 1, 2, 3])
        runner.run_copies_sync(CopyPlan(d2h=[(0, 5), (1, 6), (2, 7), (3, 4)]))
        runner.write_blocks([0, 1, 2, 3], bytes(len(original)))  # the device blocks are reused
        runner.run_copies_sync(CopyPlan(h2d=[(5, 10), (6, 11), (7, 12), (4, 13)]))
        assert runner.read_blocks([10, 11, 12, 13]) == original
        nxt = (SESSION[64],)
        loaded = [runner.execute_sync([SeqWork(1, nxt, 64, (10, 11, 12, 13, 14), True, GREEDY)])[0]]
        fresh = [runner.execute_sync([SeqWork(2, tuple(prompt) + nxt, 0, (20, 21, 22, 23, 24), True, GREEDY)])[0]]
        for table, out in (((10, 11, 12, 13, 14), loaded), ((20, 21, 22, 23, 24), fresh)):
            for i in range(5):
                out.append(runner.execute_sync([SeqWork(3, (out[-1],), 65 + i, table, True, GREEDY)])[0])
        assert loaded == fresh
        reads = runner.run_copies_sync(CopyPlan(host_reads=[(5, None)], device_reads=[(10, None)]))
        assert reads.payloads == [original[:len(original) // 4]] * 2
    finally:
        runner.close()


async def test_host_hit_is_copied_back_and_greedy_output_is_unchanged(start_engine, http):
    url, _ = await start_engine(backend="torch", num_blocks=24, host_blocks=64)
    text, first = await complete(http, url, SESSION)
    assert first["cached_tokens"] == 0
    await evict(http, url)
    again, details = await complete(http, url, SESSION)
    assert again == text
    assert details["cached_tokens_by_tier"] == {"device": 0, "host": 144, "remote": 0}
    assert details["cached_tokens"] == 144
    assert await metric(http, url, "kvroute_engine_kv_recoveries_total", 'choice="load_host"') == 1
    assert await metric(http, url, "kvroute_engine_kv_transfer_bytes_total", 'direction="h2d"') == 9 * 32768


async def test_store_entries_corrupt_truncated_or_missing_are_recomputed_never_used(start_engine, http, tmp_path):
    store = f"file://{tmp_path}"
    url, server = await start_engine(backend="torch", num_blocks=24, kv_store=store)
    text, _ = await complete(http, url, SESSION)
    await wait_for(lambda: at_least(remote_written(http, url), 10))
    await server.close()
    namespaces = set(os.listdir(tmp_path))
    probes = {probe_namespace(ns) for ns in namespaces} & namespaces  # the start-up measurement's own entries
    assert len(probes) == 1 and len(namespaces) == 2
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
                   if probes.isdisjoint(os.path.relpath(d, tmp_path).split(os.sep)))
    assert len(files) == 10
    entries = {}
    for path in files:  # one file per block, named by hash: order them by chain position via the fresh engine
        entries[int(os.path.basename(path)[:16], 16)] = path
    from kvroute.router.contract.protocol import block_hashes, hash_seed

    chain = [entries[h] for h in block_hashes(SESSION, BS, hash_seed("kvroute-tiny"))]
    data = bytearray(open(chain[3], "rb").read())
    data[-7] ^= 0x01  # corrupt block 3's payload
    open(chain[3], "wb").write(bytes(data))
    open(chain[5], "wb").write(open(chain[5], "rb").read()[:-1000])  # truncate block 5
    os.remove(chain[7])  # lose block 7
    fresh, _ = await start_engine(backend="torch", num_blocks=24, kv_store=store)
    again, details = await complete(http, fresh, SESSION)
    assert again == text  # correct output: the bad block and everything after it recomputed
    assert details["cached_tokens_by_tier"]["remote"] == 3 * BS
    assert await metric(http, fresh, "kvroute_engine_kv_store_rejected_entries_total") >= 1


async def test_an_engine_with_another_layout_never_reads_the_entries(start_engine, http, tmp_path):
    store = f"file://{tmp_path}"
    url, _ = await start_engine(backend="sim", time_scale=0.01, kv_store=store)
    await complete(http, url, SESSION)
    await wait_for(lambda: at_least(remote_written(http, url), 10))
    for other in ({"block_size": 32}, {"served_model_name": "another-model"}):
        other_url, _ = await start_engine(backend="sim", time_scale=0.01, kv_store=store, **other)
        _, details = await complete(http, other_url, SESSION)
        assert details["cached_tokens"] == 0
        assert await metric(http, other_url, "kvroute_engine_kv_store_lookup_blocks_total", 'result="hit"') == 0
        assert await metric(http, other_url, "kvroute_engine_kv_store_lookup_blocks_total", 'result="miss"') > 0
    same_url, _ = await start_engine(backend="sim", time_scale=0.01, kv_store=store)
    _, details = await complete(http, same_url, SESSION)
    assert details["cached_tokens_by_tier"]["remote"] == 144


async def test_tiers_in_events_snapshot_info_load_and_usage(start_engine, http, tmp_path):
    url, _ = await start_engine(backend="sim", time_scale=0.01, num_blocks=24, host_blocks=64,
                                kv_store=f"file://{tmp_path}")
    await complete(http, url, SESSION)
    await evict(http, url)
    _, details = await complete(http, url, SESSION)
    assert details["cached_tokens_by_tier"]["host"] == 144
    await wait_for(lambda: at_least(remote_written(http, url), 10 + 2 * 18))  # store writes run in the background
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        events = (await r.json())["events"]
    async with http.get(url + "/kv/snapshot") as r:
        snap = await r.json()
    kinds = {(e["type"], e["tier"]) for e in events}
    assert {("stored", "device"), ("stored", "host"), ("removed", "host"), ("stored", "remote")} <= kinds
    remote = [e for e in events if e["tier"] == "remote"]
    assert all(e["store"] == snap["store"] and "#" in e["store"] for e in remote)
    assert set(snap["tiers"]) == {"device", "host", "remote"} and snap["tiers"]["host"]
    for path in ("/kv/info", "/load"):
        async with http.get(url + path) as r:
            tiers = (await r.json())["kv_tiers"]
        assert set(tiers["links"]) == {"h2d", "d2h", "store_read", "store_write"}
        assert tiers["host"]["blocks"] == 64 and tiers["remote"]["store"] == snap["store"]


def test_a_store_down_at_start_is_one_clear_error_line(capsys):
    from kvroute.engine.service.cli import main

    port = free_port()
    assert main(["--backend", "sim", "--kv-store", f"redis://127.0.0.1:{port}/0", "--log-level", "ERROR"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvroute engine: cannot use --kv-store redis://127.0.0.1:{port}/0:")


async def test_a_store_going_down_degrades_to_recompute_without_failing_requests(start_engine, http, caplog):
    port = free_port()
    redis = RedisServer(port)
    try:
        url, _ = await start_engine(backend="sim", time_scale=0.01, num_blocks=24, kv_store=redis.url,
                                    kv_store_timeout_s=0.2)
        await complete(http, url, SESSION)
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="kvroute.engine.kv.store.guard"):
            for seed in range(3, 9):  # new prompts (writes) and a returning one (lookup) while it is down
                await complete(http, url, filler(seed))
            _, details = await complete(http, url, SESSION + [7])
        assert details["cached_tokens_by_tier"]["remote"] == 0
        assert await metric(http, url, "kvroute_engine_kv_store_errors_total") >= 1
        assert await metric(http, url, "kvroute_engine_kv_store_up") == 0
        assert len([r for r in caplog.records if "unavailable" in r.message]) == 1
    finally:
        redis.stop()


async def test_router_explains_cached_tokens_by_tier_and_the_time_each_saves(start_engine, start_router, http,
                                                                           tmp_path):
    from kvroute.router.service.app import CLUSTER

    tiers = dict(backend="sim", time_scale=0.01, num_blocks=24, host_blocks=64, kv_store=f"file://{tmp_path}")
    (a, _), (b, _) = await start_engine(**tiers), await start_engine(**tiers)
    url, server = await start_router([a, b])
    instances = server.app[CLUSTER].instances
    await wait_for(lambda: _true(all(i.routable and not i.needs_resync for i in instances)))
    await complete(http, a, SESSION)
    await evict(http, a)

    async def explained():
        async with http.post(url + "/router/explain", json={"prompt": SESSION, "max_tokens": 2}) as r:
            rows = {row["instance"]: row for row in (await r.json())["instances"]}
        return rows["e0"]["cached_tokens_by_tier"].get("host") == 160 and \
            rows["e1"]["cached_tokens_by_tier"].get("remote") == 160 and rows  # e1: the store e0 wrote

    await wait_for(explained)
    rows = await explained()
    for row in rows.values():  # a load costs something: it saves less than the device compute would
        saved = row["time_saved_s_by_tier"]
        tier = "host" if row["instance"] == "e0" else "remote"
        assert 0 < saved[tier] < 10 * 16 / 1e4 and row["credited_blocks"] < 10
    assert rows["e0"]["credited_blocks"] > rows["e1"]["credited_blocks"]  # host beats store + host link


async def _true(value):
    return value


async def test_entries_the_store_dropped_are_announced_as_removed(start_engine, http, tmp_path):
    import shutil

    url, _ = await start_engine(backend="sim", time_scale=0.01, num_blocks=24, kv_store=f"file://{tmp_path}")
    await complete(http, url, SESSION)
    await evict(http, url)
    await wait_for(lambda: at_least(remote_written(http, url), 10 + 2 * 18))  # the session and the fillers
    for entry in tmp_path.iterdir():  # someone pruned the store
        shutil.rmtree(entry)
    _, details = await complete(http, url, SESSION)
    assert details["cached_tokens"] == 0
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        events = (await r.json())["events"]
    from kvroute.router.contract.protocol import block_hashes, hash_seed

    removed = [h for e in events if e["tier"] == "remote" and e["type"] == "removed" for h in e["blocks"]]
    assert removed == block_hashes(SESSION, BS, hash_seed("kvroute-tiny"))[:9]  # the lookup's misses
    await wait_for(lambda: at_least(remote_written(http, url), 10 + 2 * 18 + 9))  # recomputed and written again
