"""The silent-miss judge (router/fleet/silent_miss.py): when it raises, when it clears, which cause it names."""

import pytest
from prometheus_client import CollectorRegistry

from kvroute.router.decision.routing_loss import LossSample
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.fleet.silent_miss import Evidence, SilentMiss, likely_cause
from kvroute.router.service.request_trace import RequestTrace
from kvroute.router.service.silent_miss_alarms import SilentMissAlarms

BS = 16


def miss(served, prompt=300, engine=None, adapter=False, predicted=0):
    return Evidence(served=served, predicted=predicted, prompt_tokens=prompt,
                    engine_prompt_tokens=prompt if engine is None else engine, adapter=adapter)


def test_hits_the_index_never_predicted_raise_after_enough_samples():
    judge = SilentMiss(min_samples=6)
    for k in range(5):
        alarm, changed = judge.observe("e1", miss(64 + 16 * k), BS)
        assert alarm is None and not changed
    alarm, changed = judge.observe("e1", miss(160), BS)
    assert changed and alarm.kind == "unpredicted" and alarm.share == 1.0 and alarm.cause == "hash_seed"
    assert alarm.to_dict()["alarm"] == "silent_miss_unpredicted"


def test_agreeing_samples_never_raise_and_clear_a_raised_alarm():
    judge = SilentMiss(window=12, min_samples=6)
    for k in range(6):
        judge.observe("e1", miss(32 * (k + 1)), BS)
    assert "e1" in judge.alarms
    cleared = False
    for _ in range(12):
        alarm, changed = judge.observe("e1", miss(48, predicted=48), BS)
        cleared |= changed and alarm is None
    assert cleared and "e1" not in judge.alarms
    for k in range(20):
        assert judge.observe("e2", miss(48 if k % 3 else 0, predicted=48), BS)[0] is None  # a third unserved


def test_predicted_hits_the_engine_does_not_serve_raise_the_unserved_alarm():
    judge = SilentMiss(min_samples=6)
    for k in range(6):
        alarm, _ = judge.observe("e1", miss(0, predicted=64 + 16 * k), BS)
    assert alarm.kind == "unserved"


@pytest.mark.parametrize(("samples", "cause"), [
    ([miss(64, engine=290), miss(48, engine=310), miss(96, engine=280)], "tokenizer"),
    ([miss(24), miss(40), miss(72)], "block_size"),  # not whole 16-token blocks: the engine's are 8
    ([miss(64), miss(128), miss(192)], "block_size"),  # three lengths, all whole 64-token blocks
    ([miss(64, adapter=True), miss(48, adapter=True), miss(0, predicted=0), miss(32, predicted=32)], "lora_adapter"),
    ([miss(64), miss(48), miss(80)], "hash_seed"),
])
def test_the_likely_cause(samples, cause):
    assert likely_cause(samples, BS) == cause


def test_requests_routed_without_the_index_are_no_evidence():
    """A lookup that found the index unavailable (Redis down) predicts nothing: the hits its engine
    serves say nothing of the keys, so no alarm however many (chaos: redis-kill then redis-freeze)."""
    inst = Instance("http://127.0.0.1:9000")
    inst.info = EngineInfo("e0", "m", BS, 0, "fp")
    alarms = SilentMissAlarms(lambda: [inst], lambda: 0, CollectorRegistry())
    sample = LossSample(prompt_tokens=320, best=0, predicted=0, served=320)
    for _ in range(100):
        alarms.observe("e0", sample, RequestTrace(model="m", stream=False, prompt_tokens=320, index_blind=True))
    assert inst.silent_miss is None
    for _ in range(100):
        alarms.observe("e0", sample, RequestTrace(model="m", stream=False, prompt_tokens=320))
    assert inst.silent_miss is not None and inst.silent_miss["alarm"] == "silent_miss_unpredicted"
