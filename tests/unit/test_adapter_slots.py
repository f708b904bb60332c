"""LoRA adapter slots: least recently used out, held while running, a waiting adapter passed over; the
simulator and the sim runner charge each load alike."""

import pytest

from kvroute.engine.core.adapter_slots import AdapterSlots
from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import RunnerInfo, SamplingParams
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.engine.runners.sim import SimRunner


def make(slots=1, budget=64, max_running=8):
    adapters = AdapterSlots(slots)
    return Scheduler(SchedulerConfig(budget, max_running, 4096), BlockManager(64, 4), frozenset(), adapters), adapters


def seq(rid, adapter=None, n=6, max_tokens=2, start=10):
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens), 99, adapter=adapter)


def step(sched):
    s = sched.schedule()
    works = s.works()
    sched.postprocess(s, [7 if w.sample else None for w in works])
    return s, works


def test_slots_refill_the_least_recently_used_free_one():
    slots = AdapterSlots(2)
    assert slots.take("a") == (0, True) and slots.take("b") == (1, True) and slots.take("a") == (0, False)
    assert not slots.can_take("c")  # both in use
    slots.release(0)
    slots.release(0)
    assert slots.can_take("c") and slots.take("c") == (0, True) and slots.resident() == ("b", "c")
    slots.release(1)
    slots.release(0)
    assert slots.take("b") == (1, False) and slots.loads == 3
    with pytest.raises(ValueError, match="--max-loras"):
        AdapterSlots(0)


def test_a_waiting_adapter_without_a_slot_is_passed_over_until_one_frees():
    sched, slots = make(slots=1)
    a, b, base, a2 = seq("a", "sql"), seq("b", "chat", start=100), seq("base", start=200), seq("a2", "sql", start=300)
    for s in (a, b, base, a2):
        sched.add(s)
    first, works = step(sched)
    assert [w.seq_id for w in works] == [a.seq_id, base.seq_id, a2.seq_id]  # chat waits: the slot holds sql
    assert [(w.adapter, w.adapter_slot) for w in works] == [("sql", 0), (None, -1), ("sql", 0)]
    assert first.adapter_loads == 1 and list(sched.waiting) == [b] and slots.users == [2]
    step(sched)  # a, base and a2 finish: the slot is free
    assert a.is_finished and slots.users == [0] and a.adapter_slot == -1
    third, works = step(sched)
    assert [w.seq_id for w in works] == [b.seq_id] and works[0].adapter_slot == 0
    assert third.adapter_loads == 1 and slots.resident() == ("chat",)


def test_preempted_and_aborted_sequences_give_their_slot_back():
    sched, slots = make(slots=2)
    a, b = seq("a", "sql", max_tokens=5), seq("b", "chat", start=100)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert slots.users == [1, 1]
    sched._preempt(a)
    sched.abort(b)
    assert slots.users == [0, 0] and a.adapter_slot == b.adapter_slot == -1
    again, _ = step(sched)  # a comes back to the slot that still holds its adapter: no load
    assert again.adapter_loads == 0 and a.adapter_slot == 0


def test_the_simulator_and_the_sim_runner_charge_each_load_alike():
    cm = COST_MODELS["a100-llama2-7b"]
    sched, _ = make(slots=2)
    for s in (seq("a", "sql"), seq("b", "chat", start=100), seq("c", start=200)):
        sched.add(s)
    s = sched.schedule()
    info = RunnerInfo("m", 8192, 4096, None, "float16", 32, 32, 128)
    runner = SimRunner(cm, info)
    duration, _ = runner.execute_sync(s.works())
    assert s.adapter_loads == 2
    assert cm.scheduled_time(s) == pytest.approx(duration)
    assert duration == pytest.approx(cm.step_time(s.works()) + 2 * cm.adapter_load_s)
    assert runner.execute_sync(s.works())[0] == pytest.approx(cm.step_time(s.works()))  # loaded now: no charge
