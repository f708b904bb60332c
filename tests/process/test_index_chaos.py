"""Two routers feeding one Redis index, with everything that goes wrong between them
(issue 9): late, duplicate and lost deliveries, resyncs racing the other replica's
writes, a partitioned replica, an engine restart. After quiescence the Redis index must
equal the brute-force truth, for every seed. The replicas run the router's own
EventSync and RedisIndex code; only the transport is replaced by a scripted schedule."""

import asyncio
import collections
import random

import pytest
import redis
import redis.asyncio as aioredis

from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.index import RedisIndex
from kvroute.router.kvevents.engine_feed import EventSync
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.metrics import RouterMetrics

BLOCKS = [(i * 0x9E3779B97F4A7C15 + 7) % 2**64 for i in range(1, 31)]
ENGINES = ("e1", "e2")


class Engine:
    """An engine's event log and its true cache contents, snapshot-able at its position."""

    def __init__(self, instance: str, rng: random.Random) -> None:
        self.instance, self.rng = instance, rng
        self.epoch, self.seq = 1, 0
        self.state: dict[int, set[str]] = {}
        self.emit("cleared")

    def emit(self, kind: str, tier: str = "device", blocks: tuple[int, ...] = ()) -> KVEvent:
        self.seq += 1
        if kind == "cleared":
            self.state = {}
        for b in blocks:
            tiers = self.state.setdefault(b, set())
            (tiers.add if kind == "stored" else tiers.discard)(tier)
        self.state = {b: t for b, t in self.state.items() if t}
        return KVEvent(instance=self.instance, epoch=self.epoch, seq=self.seq, type=kind, tier=tier, blocks=blocks)

    def random_event(self) -> KVEvent:
        r, tier = self.rng.random(), self.rng.choice(TIERS)
        if r < 0.03:  # the engine restarts: a new epoch that begins with "cleared"
            self.epoch, self.seq = self.epoch + 1, 0
            return self.emit("cleared")
        pool = [b for b, t in self.state.items() if tier in t] if r < 0.45 else BLOCKS
        blocks = tuple(self.rng.sample(pool, min(len(pool), self.rng.randint(1, 6)))) if pool else ()
        return self.emit("removed" if r < 0.45 else "stored", tier, blocks)

    def snapshot(self) -> dict:
        tiers = collections.defaultdict(list)
        for b, held in self.state.items():
            for t in held:
                tiers[t].append(b)
        return {"epoch": self.epoch, "seq": self.seq, "tiers": dict(tiers)}


class Replica:
    """One router: its own Instance records, EventSync and Redis client on the shared index."""

    def __init__(self, url: str, rng: random.Random, loss: float, max_delay: int) -> None:
        self.rng, self.loss, self.max_delay = rng, loss, max_delay
        self.index = RedisIndex(url)
        self.cluster = Cluster(RouterConfig(engines=tuple(f"http://{e}" for e in ENGINES)), self.index, "fp",
                               RouterMetrics())
        self.sync = EventSync(self.cluster)
        self.insts = {}
        for e in ENGINES:
            inst = Instance(f"http://{e}")
            inst.info = EngineInfo(e, "m", 16, 0, "fp")
            self.insts[e] = inst
        self.inbox: list[tuple[int, int, KVEvent]] = []
        self.partitioned_until = -1

    def offer(self, tick: int, event: KVEvent) -> None:
        if self.rng.random() < self.loss:
            return
        for _ in range(2 if self.rng.random() < 0.1 else 1):  # a duplicate delivery now and then
            self.inbox.append((tick + self.rng.randint(0, self.max_delay), event.seq, event))

    async def step(self, tick: int, engines: dict[str, Engine], final: bool = False) -> None:
        if tick < self.partitioned_until and not final:
            # cut off from the engines: it sees nothing and refreshes nobody, which must not
            # make the index forget them for the replica that still sees them
            await self.index.maintain([], ttl_s=3600)
            return
        due = sorted((x for x in self.inbox if final or x[0] <= tick), key=lambda x: (x[0], x[1]))
        self.inbox = [x for x in self.inbox if not (final or x[0] <= tick)]
        for _, _, event in due:
            inst = self.insts[event.instance]
            if inst.needs_resync:
                await self._resync(inst, engines[event.instance])
            await self.sync.apply(inst, [event])
            await asyncio.sleep(0)
        for name, inst in self.insts.items():
            engine = engines[name]
            if final and (inst.epoch, inst.seq) != (engine.epoch, engine.seq):
                inst.needs_resync = True  # the next poll shows the engine ahead of what arrived
            if inst.needs_resync:
                await self._resync(inst, engine)
        await self.index.maintain(list(self.insts), ttl_s=3600)

    async def _resync(self, inst: Instance, engine: Engine) -> None:
        snap = engine.snapshot()  # taken now; written after yielding, while the other replica works
        for _ in range(self.rng.randint(0, 3)):
            await asyncio.sleep(0)
        await self.sync.load_snapshot(inst, snap)


async def index_state(index: RedisIndex, url: str, instance: str) -> dict[int, set[str]]:
    """What the index holds for `instance`, read raw; the generation's hash and each block's agree."""
    r = aioredis.Redis.from_url(url)  # bytes: block hashes are 8 raw bytes in keys and fields
    try:
        prefix = index.prefix.encode()
        gen = await r.hget(prefix + b"g:" + instance.encode(), "gen")
        if gen is None:
            return {}
        field = instance.encode() + b"@" + gen
        out = {}
        for h, mask in (await r.hgetall(prefix + b"i:" + field)).items():
            if h == b"~":  # keeps the hash in hashtable encoding (router/index/redis_scripts.py)
                continue
            assert await r.hget(prefix + b"b:" + h, field) == mask
            out[int.from_bytes(h, "big")] = {t for i, t in enumerate(TIERS) if int(mask) >> i & 1}
        return out
    finally:
        await r.aclose()


async def run_schedule(url: str, seed: int, ticks: int = 90) -> None:
    rng = random.Random(seed)
    engines = {e: Engine(e, random.Random(seed * 10 + i)) for i, e in enumerate(ENGINES)}
    fast = Replica(url, random.Random(seed + 1000), loss=0.02, max_delay=1)
    slow = Replica(url, random.Random(seed + 2000), loss=0.1, max_delay=6)
    start = rng.randrange(ticks // 2)
    slow.partitioned_until = start + rng.randrange(5, 25)
    try:
        for tick in range(ticks):
            for engine in engines.values():
                event = engine.random_event()
                for replica in (fast, slow):
                    if not (start <= tick < slow.partitioned_until and replica is slow):
                        replica.offer(tick, event)
            await asyncio.gather(fast.step(tick, engines), slow.step(tick, engines))
        # quiescence: everything left is delivered, every replica catches up
        for replica in (fast, slow):
            await replica.step(ticks, engines, final=True)
        for _ in range(50):
            await fast.index.maintain(list(ENGINES), ttl_s=3600, budget=64)
        for name, engine in engines.items():
            assert await index_state(fast.index, url, name) == engine.state, f"seed {seed}: {name} differs"
            for replica in (fast, slow):
                inst = replica.insts[name]
                assert (inst.epoch, inst.seq) == (engine.epoch, engine.seq)
        chain = BLOCKS[:]
        expected = {}
        for name, engine in engines.items():
            n = 0
            while n < len(chain) and chain[n] in engine.state:
                n += 1
            if n:
                counts = collections.Counter(min(engine.state[b], key=TIERS.index) for b in chain[:n])
                expected[name] = dict(counts)
        got = {k: dict(v.by_tier) for k, v in (await slow.index.lookup(chain)).items()}
        assert got == expected, f"seed {seed}"
        assert await slow.index.size() == sum(len(e.state) for e in engines.values())
    finally:
        await fast.index.close()
        await slow.index.close()


@pytest.mark.parametrize("seed", range(16))
async def test_two_replicas_converge_on_the_truth(redis_url, seed):
    await run_schedule(redis_url, seed)
    with redis.Redis.from_url(redis_url, decode_responses=True) as r:
        assert not r.smembers("kvroute:idx:dead")  # garbage collected
        assert not r.zrange("kvroute:idx:staging", 0, -1)
