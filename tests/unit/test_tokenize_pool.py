"""router/contract/tokenize_pool.py: where a prompt is encoded (in place or on a pool thread) and the queue bound."""

import asyncio
import threading

import pytest

from kvroute.router.contract.errors import Overloaded
from kvroute.router.contract.tokenize_pool import TokenizePool


async def where(pool: TokenizePool, chars: int, idle=None) -> str:
    here = threading.get_ident()
    return await pool.run(lambda: "loop" if threading.get_ident() == here else "pool", chars=chars, idle=idle)


async def test_short_prompts_in_place_long_ones_in_place_only_while_nothing_else_is_in_flight():
    pool = TokenizePool(workers=1, inline_chars=100, idle_inline_chars=1000)
    try:
        assert await where(pool, 99) == "loop"  # short: always in place
        assert await where(pool, 99, idle=lambda: False) == "loop"
        assert await where(pool, 500) == "pool"  # long, and nobody says the router is idle
        assert await where(pool, 500, idle=lambda: False) == "pool"  # others in flight
        assert await where(pool, 500, idle=lambda: True) == "loop"  # idle: no thread hop
        assert await where(pool, 1000, idle=lambda: True) == "pool"  # too long to hold the loop for
        pool.pending = 1  # another long prompt is in the pool already
        assert await where(pool, 500, idle=lambda: True) == "pool"
        pool.pending = 0
        off = TokenizePool(workers=1, inline_chars=100, idle_inline_chars=0)
        try:
            assert await where(off, 500, idle=lambda: True) == "pool"  # 0 turns it off
        finally:
            off.close()
    finally:
        pool.close()


async def test_long_prompts_beyond_the_queue_are_refused_before_they_wait():
    pool = TokenizePool(workers=1, max_queued=1, inline_chars=10, idle_inline_chars=0)
    gate = threading.Event()
    try:
        busy = [asyncio.ensure_future(pool.run(gate.wait, chars=50)) for _ in range(2)]  # one running, one queued
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded):
            await pool.run(lambda: None, chars=50)
        gate.set()
        assert await asyncio.gather(*busy) == [True, True]
        assert pool.pending == 0
    finally:
        gate.set()
        pool.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        TokenizePool(idle_inline_chars=-1)


async def test_the_router_tokenizes_a_long_prompt_in_place_only_while_nothing_is_in_flight():
    from kvroute.router.contract.protocol import hash_seed
    from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer
    from kvroute.router.decision.policies import make_policy
    from kvroute.router.fleet.cluster import Cluster
    from kvroute.router.fleet.instance import EngineInfo
    from kvroute.router.index import MemoryIndex
    from kvroute.router.service.config import RouterConfig
    from kvroute.router.service.metrics import RouterMetrics
    from kvroute.router.service.routing import Router

    tok = load_tokenizer(DATA_DIR)
    cluster = Cluster(RouterConfig(engines=("http://127.0.0.1:9000",)), MemoryIndex(), tok.fingerprint,
                      RouterMetrics())
    inst = cluster.instances[0]
    inst.info = EngineInfo("e0", "kvroute-tiny", 16, hash_seed("kvroute-tiny"), tok.fingerprint,
                           max_model_len=32768, vocab_size=tok.vocab_size)
    inst.healthy = inst.reachable = True
    cluster.check_compatibility()
    pool = TokenizePool(workers=1)
    router = Router(cluster, make_policy("kv_aware"), tok, RouterMetrics(), "kv_aware", pool)
    threads = lambda: len(pool._executor._threads)  # noqa: E731 (made on the first job)
    try:
        assert cluster.idle()
        first = await router.prepare({"prompt": "an idle router " * 600, "max_tokens": 1}, "completion")
        assert threads() == 0 and first.num_tokens > 1000  # 9,000 characters, encoded on the loop
        inst.inflight = 1
        assert not cluster.idle()
        second = await router.prepare({"prompt": "a busy router " * 600, "max_tokens": 1}, "completion")
        assert threads() == 1 and second.num_tokens > 1000  # the same size went to the pool
    finally:
        pool.close()
