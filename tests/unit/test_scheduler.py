from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.core.work import SamplingParams

EOS = 2


def make(num_blocks=64, block_size=4, budget=8, max_running=8):
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(budget, max_running, 4096), bm, frozenset({EOS})), bm


def seq(rid, n, max_tokens=3, start=10):
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens), 99)


def run_step(sched, token=7, per_seq=None):
    step = sched.schedule()
    works = step.works()
    sampled = [(per_seq or {}).get(w.seq_id, token) if w.sample else None for w in works]
    sched.postprocess(step, sampled)
    return works


def test_chunked_prefill_respects_budget_and_samples_at_the_end():
    sched, _ = make(budget=8)
    s = seq("a", 20)
    sched.add(s)
    chunks = []
    while s.num_generated == 0:
        (w,) = run_step(sched)
        chunks.append((w.start_pos, len(w.token_ids), w.sample))
    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True)]


def test_decodes_go_first_and_share_budget_with_prefill():
    sched, _ = make(budget=8)
    a = seq("a", 4, max_tokens=10)
    sched.add(a)
    run_step(sched)  # a prefilled, has its first token
    b = seq("b", 30, start=100)
    sched.add(b)
    works = run_step(sched)
    assert [(w.seq_id, len(w.token_ids)) for w in works] == [(a.seq_id, 1), (b.seq_id, 7)]


def test_finishes_on_max_tokens_and_eos():
    sched, bm = make()
    a, b = seq("a", 4, max_tokens=2), seq("b", 4, max_tokens=5, start=50)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    run_step(sched, per_seq={b.seq_id: EOS})
    assert a.finish_reason == "length" and a.output_ids == [7, 7]
    assert b.finish_reason == "stop"
    assert not sched.running and bm.num_used == 0


def test_ignore_eos_keeps_going():
    sched, _ = make()
    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), 1)
    sched.add(a)
    for _ in range(3):
        run_step(sched, token=EOS)
    assert a.finish_reason == "length" and a.num_generated == 3


def test_preemption_by_recompute_when_blocks_run_out():
    sched, bm = make(num_blocks=5, block_size=4, budget=64)
    a, b = seq("a", 8, max_tokens=10), seq("b", 8, max_tokens=10, start=40)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both admitted: 2 blocks each
    assert bm.num_free == 1
    run_step(sched)  # both need a third block; a takes the last one, b is preempted
    assert b.status == SeqStatus.WAITING and b.num_computed == 0 and sched.num_preemptions == 1
    assert sched.waiting[0] is b
    assert a.num_generated == 2
    # b comes back once a finishes, recomputing prompt + its generated token.
    while not a.is_finished:
        run_step(sched)
    while not b.is_finished:
        run_step(sched)
    assert b.num_generated == 10 and b.num_preemptions == 1


def test_max_running_caps_admission():
    sched, _ = make(max_running=2, budget=64)
    for i in range(3):
        sched.add(seq(str(i), 4, start=10 * i))
    run_step(sched)
    assert len(sched.running) == 2 and len(sched.waiting) == 1


def test_abort_frees_blocks():
    sched, bm = make()
    a = seq("a", 10, max_tokens=5)
    sched.add(a)
    run_step(sched)
    sched.abort(a)
    assert a.finish_reason == "abort" and bm.num_used == 0 and not sched.running


def test_queued_prefill_tokens():
    sched, _ = make(budget=8)
    sched.add(seq("a", 20))
    sched.add(seq("b", 5, start=100))
    assert sched.queued_prefill_tokens == 25
    run_step(sched)
    assert sched.queued_prefill_tokens == 17


def test_sequence_that_can_never_grow_ends_with_length():
    sched, bm = make(num_blocks=2, block_size=4, budget=64)
    a = seq("a", 6, max_tokens=10)
    sched.add(a)
    for _ in range(10):
        if not sched.has_work():
            break
        run_step(sched)
    assert a.finish_reason == "length" and a.num_generated == 3  # 8 tokens fill both blocks
    assert sched.dropped == [a] and bm.num_used == 0
