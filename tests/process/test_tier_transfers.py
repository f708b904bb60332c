"""What the KV tiers move between a running engine's device and host, held on CPU: at most one copy per
direction per step, only the bytes a recovery needs, K/V back from the store bit for bit, and the
link figures measured on the device at start-up rather than taken from presets."""

import torch

from kvroute.engine.kv.links import LINKS
from kvroute.engine.service.app_keys import ENGINE
from kvroute.router.contract.protocol import block_hashes, hash_seed
from tests.support.tier_requests import BS, SESSION, at_least, complete, evict, metric, remote_written, wait_for

torch.set_num_threads(1)


def record_batches(engine) -> list:
    """Wrap the engine's schedule, the runner's step and its tier batches: the list gets ("schedule",),
    ("step",) and ("copies", d2h, h2d) items (an idle engine copies ahead of eviction too: before a schedule)."""
    log, runner, core = [], engine.runner, engine.core
    host, start, execute, begin = runner.host, runner.host.start, runner.execute, core.begin_step

    def counted_start(plan, ahead):
        before = dict(host.transfers)
        start(plan, ahead)
        log.append(("copies", *(host.transfers[d] - before.get(d, 0) for d in ("d2h", "h2d"))))

    async def counted_execute(works):
        log.append(("step",))
        return await execute(works)

    def counted_begin():
        log.append(("schedule",))
        return begin()

    host.start, runner.execute, core.begin_step = counted_start, counted_execute, counted_begin
    return log


async def test_each_step_moves_one_copy_per_direction_at_most_and_recovery_only_the_bytes_it_needs(
        start_engine, http, tmp_path):
    url, server = await start_engine(backend="torch", num_blocks=24, host_blocks=64, kv_store=f"file://{tmp_path}")
    log = record_batches(server.app[ENGINE])
    text, _ = await complete(http, url, SESSION)
    await evict(http, url)
    again, details = await complete(http, url, SESSION)
    assert again == text and details["cached_tokens_by_tier"]["host"] == 144
    batches = [item for item in log if item[0] == "copies"]
    assert batches and all(d2h <= 1 and h2d <= 1 for _, d2h, h2d in batches)
    assert sum(d2h for _, d2h, _ in batches) >= 1 and sum(h2d for _, _, h2d in batches) >= 1
    trace = "".join({"schedule": "S", "copies": "c", "step": "x"}[item[0]] for item in log)
    assert all(after.split("x")[0].count("c") <= 1 for after in trace.split("S")[1:])  # one batch per step
    assert "Scx" in trace
    await wait_for(lambda: at_least(remote_written(http, url), 10))
    fresh, _ = await start_engine(backend="torch", num_blocks=24, kv_store=f"file://{tmp_path}")
    _, details = await complete(http, fresh, SESSION)
    assert details["cached_tokens_by_tier"]["remote"] == 144
    for engine in (url, fresh):
        ratio = await metric(http, engine, "kvroute_engine_kv_recovery_moved_ratio")
        assert 1.0 <= ratio <= 1.05
    needed = await metric(http, fresh, "kvroute_engine_kv_recovery_needed_bytes_total")
    assert needed == 2 * 9 * 32768  # the store read and the copy to the device, each 9 blocks


async def test_kv_back_from_the_store_is_bit_identical(start_engine, http, tmp_path):
    store = f"file://{tmp_path}"
    hashes = block_hashes(SESSION, BS, hash_seed("kvroute-tiny"))[:9]

    def kv_bytes(server) -> bytes:
        engine = server.app[ENGINE]
        return engine.runner.read_blocks([engine.block_manager.cached_block(h).block_id for h in hashes])

    url, first = await start_engine(backend="torch", num_blocks=24, kv_store=store)
    text, _ = await complete(http, url, SESSION)
    await wait_for(lambda: at_least(remote_written(http, url), 10))
    fresh, second = await start_engine(backend="torch", num_blocks=24, kv_store=store)
    again, details = await complete(http, fresh, SESSION)
    assert details["cached_tokens_by_tier"]["remote"] == 144 and again == text
    assert kv_bytes(second) == kv_bytes(first)


async def test_tier_links_are_measured_on_the_device_at_start(start_engine, http, tmp_path):
    async def links(url):
        async with http.get(url + "/kv/info") as r:
            links = (await r.json())["kv_tiers"]["links"]
        return {name: (v["bandwidth_bps"], v["latency_s"]) for name, v in links.items()}

    measured, _ = await start_engine(backend="torch", num_blocks=64, host_blocks=64, kv_store=f"file://{tmp_path}")
    named, _ = await start_engine(backend="torch", num_blocks=64, host_blocks=64, kv_store=f"file://{tmp_path}",
                                  kv_host_link="pcie4", kv_store_link="nvme")
    got, given = await links(measured), await links(named)
    for name, preset in (("h2d", "cpu-memcpy"), ("d2h", "cpu-memcpy"), ("store_read", "cpu-file"),
                         ("store_write", "cpu-file")):
        assert got[name] != LINKS[preset] and got[name][0] > 0
    assert given["h2d"] == given["d2h"] == LINKS["pcie4"] and given["store_read"] == LINKS["nvme"]
    async with http.get(measured + "/kv/info") as r:
        rate = (await r.json())["kv_tiers"]["prefill_tokens_per_s"]
    assert rate != 15_000.0 and rate > 0  # measured, not the runner's hint
