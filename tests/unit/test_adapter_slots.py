"""LoRA adapter slots: least recently used out, held while running, a waiting adapter passed over; the
simulator and the sim runner charge each load alike."""

import pytest

from kvroute.engine.core.adapter_slots import AdapterSlots
from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import RunnerInfo, SamplingParams
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.engine.runners.registry import RUNNERS
from kvroute.engine.runners.sim import SimRunner
from kvroute.loadgen.adapters import with_adapters
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.config import SimConfig
from kvroute.loadgen.sim.runner import build
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract import settings_values


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
    _, works = step(sched)
    assert [w.seq_id for w in works] == [a.seq_id, base.seq_id, a2.seq_id]  # chat waits: the slot holds sql
    assert [(w.adapter, w.adapter_slot) for w in works] == [("sql", 0), (None, -1), ("sql", 0)]
    assert slots.loads == 1 and list(sched.waiting) == [b] and slots.users == [2]
    step(sched)  # a, base and a2 finish: the slot is free
    assert a.is_finished and slots.users == [0] and a.adapter_slot == -1
    _, works = step(sched)
    assert [w.seq_id for w in works] == [b.seq_id] and works[0].adapter_slot == 0
    assert slots.loads == 2 and slots.resident() == ("chat",)


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
    loads = slots.loads
    step(sched)  # a comes back to the slot that still holds its adapter: no load
    assert slots.loads == loads and a.adapter_slot == 0


def test_the_sim_runner_charges_a_load_when_a_work_first_names_the_adapter_in_its_slot():
    cm = COST_MODELS["a100-llama2-7b"]
    sched, _ = make(slots=2)
    for s in (seq("a", "sql"), seq("b", "chat", start=100), seq("c", start=200)):
        sched.add(s)
    s = sched.schedule()
    info = RunnerInfo("m", 8192, 4096, None, "float16", 32, 32, 128)
    runner = SimRunner(cm, info)
    duration, _ = runner.execute_sync(s.works())
    assert duration == pytest.approx(cm.step_time(s.works()) + 2 * cm.adapter_load_s)
    assert runner.execute_sync(s.works())[0] == pytest.approx(cm.step_time(s.works()))  # loaded now: no charge


def test_the_simulator_prices_adapter_loads_by_the_engine_runners_rule():
    """The simulator prices each step's adapter loads with its engine's own `SimRunner` rule, on the
    chunks the step runs, as `kvroute engine --backend sim` does on the step's works. The scheduler's
    slot refills (`AdapterSlots.loads`) come earlier when a request is admitted with blocks still to
    load from the host (it takes its slot in a step it does not run in): the simulator once priced
    the load there, in a step that often ran nothing and so charged nothing, and lost it."""
    config = settings_values.replace(SimConfig(seed=1), instances=2, adapters=("sql", "chat", "code"), max_loras=1,
                                     host_blocks=2048, num_blocks=96, cost_model="a100-llama2-7b")
    specs = with_adapters(make_workload("shared-prefix", seed=1, num_requests=160), config.adapters, "request",
                          seed=1).requests()
    setup = build(config, "kv_aware", specs, ArrivalConfig(rate=40.0))
    engine = config.engine()
    twins = [RUNNERS["sim"](engine.runner, engine.batch, engine.tiers) for _ in setup.cluster.instances]
    seen: list[object] = [None] * len(twins)
    slot_loads = [0] * len(twins)
    early = 0

    def check(inst) -> None:  # after every step the cluster starts: the engine's runner gets its works
        nonlocal early
        if inst.step is None or inst.step is seen[inst.index]:
            return
        seen[inst.index] = inst.step
        twin = twins[inst.index]
        loads = twin.adapter_loads([(w.adapter, w.adapter_slot) for w in inst.step.works()])
        refilled, slot_loads[inst.index] = inst.core.adapters.loads - slot_loads[inst.index], inst.core.adapters.loads
        early += refilled > loads
        assert inst.runner.adapter_slots == twin.adapter_slots

    setup.cluster.step_listeners.append(check)
    setup.cluster.run(setup.router, iter(setup.starts))
    assert len(setup.router.records) == len(specs)
    assert early > 0  # slots refilled in steps that did not run their sequence: the case the rule decides
    assert sum(len(t.adapter_slots) for t in twins) > 0
