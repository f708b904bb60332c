"""The engine server and the simulator report the same load for the same work.

The simulator's load report once mislabelled its fields (state = free blocks, role = the evictable
profile, kv_free_blocks = -1), so every `kvroute sim` run routed without kv_aware's eviction
pricing and nothing noticed. Both drivers now build the record through EngineCore.load_record;
this test drives the engine's LLMEngine (its core stepped by hand, no asyncio loop, no HTTP) and a
SimInstance through the same requests and steps, and requires the same record from each after
every step, every field but the timestamp. A driver that fills a field differently fails here.
"""

import dataclasses
import random

from prometheus_client import CollectorRegistry

from kvroute.engine.config import EngineConfig
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.engine.runners.registry import RUNNERS
from kvroute.engine.service.llm_engine import LLMEngine
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.loadgen.sim.instance import SimEngine, SimInstance
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.settings_values import build

CONFIG = build(EngineConfig, instance_id="e0", backend="sim", num_blocks=64, block_size=16, max_running=4,
                      max_batched_tokens=256, num_threads=1)
SEED = hash_seed("kvroute-tiny")


def _comparable(record) -> dict:
    """Every field but the clock's: `ts`, and the evictable profile's idle seconds and their bucketing
    (the engine's clock is time.monotonic, the simulator's virtual); its evictable blocks must match."""
    d = dataclasses.asdict(record)
    del d["ts"]
    d["kv_evictable"] = sum(blocks for blocks, _ in record.kv_evictable)
    return d


def test_engine_and_simulator_report_the_same_load_through_a_run():
    runner = RUNNERS["sim"](CONFIG.runner, CONFIG.batch, CONFIG.tiers)
    engine = LLMEngine(CONFIG, runner, frozenset(), EngineMetrics("kvroute-tiny", CollectorRegistry()))
    sim = SimInstance(0, SimEngine(batch=CONFIG.batch, runner=CONFIG.runner, tiers=CONFIG.tiers), instance="e0")
    rng = random.Random(3)
    shared = [rng.randrange(5, 8000) for _ in range(96)]
    prompts = [shared + [rng.randrange(5, 8000) for _ in range(rng.randrange(8, 200))] for _ in range(10)]
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(max_tokens=3, ignore_eos=True)
        engine.add_request(f"r{i}", list(prompt), sampling, SEED)
        assert sim.admit(Sequence(f"r{i}", list(prompt), sampling, SEED))
    checked = 0
    assert _comparable(engine.load()) == _comparable(sim.load())
    while engine.core.has_work():
        start = engine.core.begin_step()
        duration, failed = sim.start_step(0.0)
        assert not start.dropped and not failed and duration is not None
        assert [s.request_id for s in start.step.seqs] == [s.request_id for s in sim.step.seqs]
        assert _comparable(engine.load()) == _comparable(sim.load())  # mid-step: the batch is scheduled
        engine.core.finish_step(start.step, [7 if t is not None else None for t in sim.tokens])
        sim.finish_step()
        assert _comparable(engine.load()) == _comparable(sim.load())
        checked += 1
    assert checked >= 4 and not sim.core.has_work()
    final = engine.load()
    assert final.kv_free_blocks >= 0 and final.kv_evictable, final  # the eviction profile is reported
