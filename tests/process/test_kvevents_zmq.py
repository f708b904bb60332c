"""The router's ZeroMQ KV event subscriber against a publisher written from vLLM's format.

Real pyzmq sockets on 127.0.0.1: PUB/SUB for events, ROUTER/DEALER for replay.
"""

import asyncio
import random
import time

import pytest
from prometheus_client import CollectorRegistry

from kvroute.loadgen.chaos.scenarios.feeds import deep_nesting_payload
from kvroute.router.contract.protocol import block_hashes, hash_seed
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.kvevents.follower import ZmqFollower
from kvroute.router.kvevents.sources import EventSource
from tests.support.vllm_publisher import VllmPublisher, cleared, encode_batch, engine_hashes, removed, stored

SEED = hash_seed("m")
rng = random.Random(1)
TOKENS = [rng.randrange(5, 8000) for _ in range(256)]


class Feed:
    """One instance fed only by ZeroMQ events, with its index and metrics registry."""

    def __init__(self, pub, replay=True, timeout_s=1.0, block_size=16):
        self.pub = pub
        self.inst = Instance("http://127.0.0.1:1")
        self.inst.info = EngineInfo("e1", "m", block_size, SEED, "fp")
        self.index = MemoryIndex()
        self.registry = CollectorRegistry()
        source = EventSource(pub.endpoint, pub.replay_endpoint if replay else None)
        self.follower = ZmqFollower([self.inst], self.index, {self.inst.url: (source,)}, "", timeout_s, self.registry)
        self.feed = self.follower.feeds[0]
        self.task = None

    async def __aenter__(self):
        self.task = asyncio.create_task(self.follower.run())
        await asyncio.to_thread(self.pub.wait_subscribed)
        await self.until(lambda: self.stats.state == "live")  # the history replay (of nothing) is done
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.follower.close()
        self.pub.close()

    @property
    def stats(self):
        return self.feed.subscribers[0].stats

    def cached(self, tokens=TOKENS, bs=16):
        match = self.index.lookup_sync(block_hashes(tokens, bs, SEED)).get("e1")
        return dict(match.by_tier) if match else {}

    def metric(self, name, **labels):
        return self.registry.get_sample_value(name, {"instance": "e1", **labels})

    async def until(self, check, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; stats {self.stats}")
            await asyncio.sleep(0.01)


def chain(tokens, bs=16, parent=None, kind="int", **kw):
    hashes = engine_hashes(tokens, bs, parent, kind)
    return hashes, stored(hashes, parent, tokens[: len(hashes) * bs], bs, **kw)


@pytest.mark.parametrize("events", ["array", "map"])
@pytest.mark.parametrize("batch", ["array", "map"])
@pytest.mark.parametrize("kind", ["int", "bytes"])
async def test_both_encodings_and_hash_kinds(events, batch, kind):
    async with Feed(VllmPublisher(events=events, batch=batch)) as f:
        first, ev1 = chain(TOKENS[:64], kind=kind)
        second, ev2 = chain(TOKENS[64:96], parent=first[-1], kind=kind)
        f.pub.publish([ev1])
        f.pub.publish([ev2, removed(first[3:])])
        await f.until(lambda: f.stats.batches == 2)
        assert f.cached() == {"device": 3}
        assert f.index.size_sync() == 5 and f.inst.blocks_indexed == 5
        assert f.stats.gaps == 0 and f.stats.rebuilds == 0
        if kind == "int":
            assert any(h >= 2**63 for h in first + second)  # unsigned 64-bit, beyond the signed range


async def test_replay_after_a_forced_gap():
    async with Feed(VllmPublisher()) as f:
        hashes = engine_hashes(TOKENS[:96], 16)
        f.pub.publish([stored(hashes[:2], None, TOKENS[:32])])
        f.pub.publish([stored(hashes[2:4], hashes[1], TOKENS[32:64])], send=False)  # lost on the way
        f.pub.publish([stored(hashes[4:], hashes[3], TOKENS[64:96])])
        await f.until(lambda: f.stats.batches == 3)
        assert f.pub.replay_requests == [0, 1]  # the history on joining, then the gap
        assert f.cached() == {"device": 6}
        assert (f.stats.gaps, f.stats.replays, f.stats.replay_failures, f.stats.rebuilds) == (1, 2, 0, 0)
        assert f.metric("kvroute_router_zmq_replays_total") == 2
        assert f.feed.to_dict()["state"] == "live"


async def test_a_gap_replay_cannot_cover_clears_and_rebuilds():
    async with Feed(VllmPublisher(buffer_steps=2)) as f:
        a, ev_a = chain(TOKENS[:32])
        b, ev_b = chain(TOKENS[128:160])
        f.pub.publish([ev_a])
        await f.until(lambda: f.stats.batches == 1)
        f.pub.publish([removed(a)], send=False)  # lost, and gone from the two-batch replay buffer
        f.pub.publish([], send=False)
        f.pub.publish([ev_b], send=False)
        f.pub.publish([])
        await f.until(lambda: f.stats.rebuilds == 1 and f.stats.batches == 3)
        assert f.cached() == {} and f.cached(TOKENS[128:160]) == {"device": 2}  # a's removal was lost: cleared
        assert f.stats.replay_failures == 1
        view = f.feed.to_dict()
        assert view["state"] == "rebuilt" and "replay buffer starts at seq 3" in view["last_rebuilds"][0]["reason"]
        assert f.metric("kvroute_router_zmq_rebuilds_total") == 1


async def test_a_gap_without_a_replay_endpoint_rebuilds_from_live_events():
    async with Feed(VllmPublisher(replay=False), replay=False) as f:
        a, ev_a = chain(TOKENS[:32])
        f.pub.publish([ev_a])
        await f.until(lambda: f.stats.batches == 1)
        f.pub.publish([removed(a)], send=False)
        b, ev_b = chain(TOKENS[128:160])
        f.pub.publish([ev_b])
        await f.until(lambda: f.stats.rebuilds == 1 and f.stats.batches == 2)
        assert f.cached() == {} and f.cached(TOKENS[128:160]) == {"device": 2}


async def test_history_published_before_the_router_joined_is_replayed():
    pub = VllmPublisher()
    hashes, ev = chain(TOKENS[:48])
    pub.publish([ev], send=False)  # nobody was listening
    pub.publish([removed(hashes[2:])], send=False)
    async with Feed(pub) as f:
        await f.until(lambda: f.stats.batches == 2)
        assert f.cached() == {"device": 2} and f.stats.rebuilds == 0 and f.pub.replay_requests == [0]


async def test_publisher_restart_resets_the_instance():
    async with Feed(VllmPublisher()) as f:
        _, ev = chain(TOKENS[:32])
        for _ in range(3):
            f.pub.publish([])
        f.pub.publish([ev])
        await f.until(lambda: f.stats.batches == 4)
        f.pub.restart()
        _, ev2 = chain(TOKENS[128:160])
        f.pub.publish([ev2])
        await f.until(lambda: f.stats.rebuilds == 1 and f.stats.batches == 5)
        assert f.cached() == {} and f.cached(TOKENS[128:160]) == {"device": 2}


async def test_all_blocks_cleared_and_removal_through_the_hash_map():
    async with Feed(VllmPublisher(events="map")) as f:
        hashes, ev = chain(TOKENS[:64], kind="bytes")
        f.pub.publish([ev, removed([hashes[1]])])
        await f.until(lambda: f.stats.batches == 1)
        assert f.cached() == {"device": 1} and f.index.size_sync() == 3
        f.pub.publish([cleared()])
        await f.until(lambda: f.stats.batches == 2)
        assert f.index.size_sync() == 0 and f.inst.blocks_indexed == 0 and len(f.feed.block_map) == 0


async def test_page_size_one_events_are_aggregated():
    """SGLang: page size 1, the radix tree's inserts chained token by token."""
    async with Feed(VllmPublisher()) as f:
        parent, start = None, 0
        for size in (5, 20, 15):
            chunk, start = TOKENS[start:start + size], start + size
            pages = engine_hashes(chunk, 1, parent)
            f.pub.publish([stored(pages, parent, chunk, 1, medium="GPU")])
            parent = pages[-1]
        await f.until(lambda: f.stats.batches == 3)
        assert f.cached() == {"device": 2}
        assert f.feed.to_dict()["engine_block_size"] == 1 and len(f.feed.block_map) == 40


async def test_unknown_medium_is_counted_and_ignored():
    async with Feed(VllmPublisher()) as f:
        hashes, ev = chain(TOKENS[:32])
        f.pub.publish([ev, stored(hashes, None, TOKENS[:32], medium="CPU"),
                       stored(hashes, None, TOKENS[:32], medium="NVME_OVER_FABRIC"),
                       removed(hashes, medium="NVME_OVER_FABRIC")])
        await f.until(lambda: f.stats.batches == 1)
        assert f.cached() == {"device": 2}
        assert f.index.lookup_sync(block_hashes(TOKENS[:32], 16, SEED))["e1"].by_tier == {"device": 2}
        view = f.feed.to_dict()
        assert view["unknown_media"] == {"NVME_OVER_FABRIC": 2} and view["blocks"]["unknown_medium"] == 2
        assert f.metric("kvroute_router_zmq_blocks_total", outcome="unknown_medium") == 2


async def test_malformed_frames_and_payloads_are_logged_and_skipped(caplog):
    async with Feed(VllmPublisher()) as f:
        f.pub.send_raw([b"kv@test", b"\x00" * 8])  # two frames
        f.pub.send_raw([b"kv@test", b"\x00\x01", b"x"])  # a 2-byte seq
        f.pub.publish([], raw_payload=b"\xc1 not msgpack")  # seq 0: undecodable
        f.pub.publish([], raw_payload=encode_batch([])[:-1] + b"\x91")  # seq 1: truncated
        f.pub.publish([], raw_payload=b"\x93\xcb" + b"\x00" * 8 + b"\x92\x92\xa5Bogus\x01\x91\xb0AllBlocksCleared\xc0")
        hashes, ev = chain(TOKENS[:32])
        f.pub.publish([ev, ("BlockStored", {"block_hashes": "not a list"})])
        await f.until(lambda: f.stats.batches == 2)
        assert f.cached() == {"device": 2}
        s = f.stats
        assert (s.malformed_frames, s.malformed_payloads, s.skipped_events) == (2, 2, 2)
        assert s.gaps == 0 and s.rebuilds == 0 and not f.task.done()
        assert "malformed" in caplog.text


async def test_cleared_while_down_rebuilds_by_replay_and_readmission_keeps_the_index():
    async with Feed(VllmPublisher()) as f:
        _, ev = chain(TOKENS[:48])
        f.pub.publish([ev])
        await f.until(lambda: f.stats.batches == 1)
        f.inst.needs_resync = True  # re-admitted after health-check failures: the stream lost nothing
        await f.until(lambda: not f.inst.needs_resync)
        assert f.cached() == {"device": 3} and f.pub.replay_requests == [0] and not f.feed.rebuilds
        await f.index.clear("e1")  # what the cluster does after --clear-grace-s down
        f.inst.blocks_indexed, f.inst.needs_resync = 0, True
        await f.until(lambda: f.cached() == {"device": 3})
        assert f.pub.replay_requests == [0, 0] and "cleared while it was down" in f.feed.rebuilds[0]["reason"]


async def test_a_deeply_nested_event_is_one_bad_message_and_the_feed_goes_on():
    """A 100,000-deep extra_keys used to raise RecursionError, kill the subscriber task silently and
    freeze the index; now it is counted and skipped, and the next valid batch is applied."""
    async with Feed(VllmPublisher()) as f:
        f.pub.publish([], raw_payload=deep_nesting_payload())
        await f.until(lambda: f.stats.malformed_payloads == 1)
        assert f.metric("kvroute_router_zmq_malformed_payloads_total") == 1
        _, ev = chain(TOKENS[:32])
        f.pub.publish([ev])
        await f.until(lambda: f.cached() == {"device": 2}, timeout_s=1.0)
        assert not f.task.done() and f.feed.stale is None and f.feed.restarts == 0


async def test_a_batch_that_cannot_be_applied_is_skipped_not_fatal(monkeypatch):
    async with Feed(VllmPublisher()) as f:
        real = f.feed.block_map.apply
        calls = []

        def explode_once(event):
            calls.append(1)
            if len(calls) == 1:
                raise KeyError("a bug in the translation")
            return real(event)

        monkeypatch.setattr(f.feed.block_map, "apply", explode_once)
        _, ev = chain(TOKENS[:32])
        f.pub.publish([ev])
        await f.until(lambda: f.stats.failed_batches == 1)
        f.pub.publish([ev])
        await f.until(lambda: f.cached() == {"device": 2}, timeout_s=1.0)
        assert f.metric("kvroute_router_zmq_failed_batches_total") == 1


async def test_a_dead_feed_is_marked_stale_routed_on_load_and_restarted(monkeypatch):
    async with Feed(VllmPublisher()) as f:
        _, ev = chain(TOKENS[:32])
        f.pub.publish([ev])
        await f.until(lambda: f.cached() == {"device": 2})
        sub, feed = f.feed.subscribers[0], f.feed
        real_handle, real_begin = sub.handle, feed._begin

        async def broken(*args):  # a bug in the task itself, not a bad message: the task ends
            raise RuntimeError("feed bug")

        monkeypatch.setattr(sub, "handle", broken)
        monkeypatch.setattr(feed, "_begin", broken)  # and every restart fails too, until mended
        f.pub.publish([ev])
        await f.until(lambda: feed.restarts >= 2)
        assert feed.stale is not None and f.inst.feed_stale == feed.stale
        assert not f.inst.cache_ok and not f.inst.state().cache_ok  # its index entries earn no credit
        assert f.metric("kvroute_router_zmq_feed_stale") == 1
        assert feed.to_dict()["state"] == "stale"
        monkeypatch.setattr(sub, "handle", real_handle)
        monkeypatch.setattr(feed, "_begin", real_begin)
        await f.until(lambda: feed.stale is None and f.stats.state == "live", timeout_s=10.0)
        assert f.inst.cache_ok and f.metric("kvroute_router_zmq_feed_stale") == 0
        await f.until(lambda: f.cached() == {"device": 2}, timeout_s=2.0)  # rebuilt from the replay
        assert f.metric("kvroute_router_zmq_feed_restarts_total") >= 2


async def test_an_oversized_frame_is_refused_and_the_feed_recovers():
    """A frame over MAX_MESSAGE_BYTES is dropped by ZeroMQ unread (the peer is disconnected and comes
    back); the feed then rebuilds from the live stream."""
    from kvroute.router.contract.kv_wire import MAX_MESSAGE_BYTES

    async with Feed(VllmPublisher(replay=False)) as f:
        f.pub.publish([], raw_payload=b"\x00" * (MAX_MESSAGE_BYTES + 1))
        _, ev = chain(TOKENS[:32])
        deadline = time.monotonic() + 10
        while f.cached() != {"device": 2}:  # messages sent while the SUB reconnects are lost: resend
            assert time.monotonic() < deadline, f.stats
            f.pub.publish([ev])
            await asyncio.sleep(0.2)
        assert f.stats.malformed_payloads == 0  # never read, so never decoded
        assert f.feed.restarts >= 1  # the dropped connection was noticed and the feed restarted


async def test_an_instance_that_stores_more_than_it_advertises_is_capped():
    """1M stored blocks for a 4,096-block engine used to grow the map and index without bound; now an
    instance keeps at most CAP_FACTOR x its advertised blocks, the oldest going first."""
    from kvroute.router.kvevents.follower import CAP_FACTOR

    async with Feed(VllmPublisher()) as f:
        f.inst.kind_state["num_blocks"] = 16  # what discovery read from the engine: cap 64 engine blocks
        cap = CAP_FACTOR * 16
        prompts = [[rng.randrange(5, 8000) for _ in range(64)] for _ in range(100)]  # 400 blocks
        events = [chain(tokens)[1] for tokens in prompts]
        for i in range(0, 100, 10):
            f.pub.publish(events[i:i + 10])
        await f.until(lambda: f.stats.batches == 10)
        assert len(f.feed.block_map) <= cap
        assert f.inst.blocks_indexed <= cap and f.index.size_sync() <= cap
        assert f.metric("kvroute_router_zmq_blocks_total", outcome="overflow_evicted") == 400 - cap
        match = f.index.lookup_sync(block_hashes(prompts[-1], 16, SEED)).get("e1")
        assert match is not None and match.blocks == 4  # the newest chain is still credited
        assert "e1" not in f.index.lookup_sync(block_hashes(prompts[0], 16, SEED))
