"""The scheduler's order and budgets hold for any mix of requests, not just two sequences.

Issue 36's audit planted a scheduler that preempted the oldest sequence instead of the newest,
and the suite's preemption test, with two sequences, passed. The rules (engine/core/scheduler.py):
each step spends at most max_batched_tokens; running sequences first, decodes before unfinished
prefills; then waiting requests in arrival order while the budget, max_running and free blocks
allow; a sequence that needs a block when none is free preempts the most recently admitted
running sequence not yet scheduled in the step, which goes back to the front of the waiting
queue. `queued_prefill_tokens` counts the tokens of waiting and prefilling sequences not yet
computed. Checked after every step of random workloads, and in tables over the fleet's size.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.core.work import SamplingParams
from tests.support.properties import FEW

BS = 4
RUNNING, WAITING = SeqStatus.RUNNING, SeqStatus.WAITING


def make(num_blocks: int, budget: int, max_running: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, max_running, 4096), BlockManager(num_blocks, BS), frozenset())


def request(i: int, prompt: int, max_tokens: int) -> Sequence:
    """Prompts that share no block with one another (no prefix hits)."""
    return Sequence(f"r{i}", [1000 * (i + 1) + k for k in range(prompt)], SamplingParams(max_tokens=max_tokens), 7)


def check_step(sched: Scheduler, step, before: dict) -> None:
    """The step's invariants; `before`: the scheduler as it was before `schedule()`."""
    budget = sched.config.max_batched_tokens
    assert sum(step.num_tokens) <= budget
    assert len(sched.running) <= sched.config.max_running
    for seq, n in zip(step.seqs, step.num_tokens):
        assert seq.status is RUNNING, f"{seq.request_id} was scheduled but is {seq.status}"
        assert 1 <= n <= len(seq.token_ids) - seq.num_computed
        assert len(seq.block_table) * BS >= seq.num_computed + n, f"{seq.request_id} has no blocks for its tokens"
    scheduled = {s.seq_id for s in step.seqs}
    decodes = [s for s in before["running"] if before["uncomputed"][s.seq_id] == 1]
    if len(decodes) <= budget:  # decodes first: each one runs unless it was preempted
        for s in decodes:
            assert s.seq_id in scheduled or s.status is not RUNNING, f"decode {s.request_id} starved"
    admitted = [s for s in step.seqs if s.seq_id in before["waiting_ids"]]
    if admitted:  # new work only after every running sequence that is still running got its share
        for s in before["running"]:
            assert s.status is not RUNNING or s.seq_id in scheduled, f"{s.request_id} skipped for new work"
    preempted = [s for s in sched.waiting if s.seq_id in before["running_ids"]]
    old_waiting = [s for s in sched.waiting if s.seq_id in before["waiting_ids"]]
    assert list(sched.waiting) == preempted + old_waiting + [s for s in sched.waiting if s not in preempted
                                                                and s not in old_waiting], "preempted not first"
    check_blocks(sched)


def check_blocks(sched: Scheduler) -> None:
    bm = sched.block_manager
    holders: dict[int, int] = {}
    for s in sched.running:
        for b in s.block_table:
            holders[b] = holders.get(b, 0) + 1
    for s in sched.waiting:
        assert not s.block_table
    for b, n in holders.items():
        assert bm.blocks[b].ref_count == n
    assert bm.num_free == bm.num_blocks - len(holders)
    queued = sum(len(s.token_ids) - s.num_computed for s in sched.waiting)
    queued += sum(n for s in sched.running if (n := len(s.token_ids) - s.num_computed) > 1)
    assert sched.queued_prefill_tokens == queued


def snapshot(sched: Scheduler) -> dict:
    return {"running": list(sched.running), "running_ids": {s.seq_id for s in sched.running},
            "waiting_ids": {s.seq_id for s in sched.waiting},
            "uncomputed": {s.seq_id: len(s.token_ids) - s.num_computed for s in sched.running}}


def run(sched: Scheduler, arrivals: dict[int, list[Sequence]], max_steps: int = 400) -> list[Sequence]:
    """Step until idle, checking every step; returns the sequences in the order first admitted."""
    first_admitted: list[Sequence] = []
    step_no = 0
    while sched.has_work() or any(k >= step_no for k in arrivals):
        for seq in arrivals.get(step_no, ()):
            sched.add(seq)
        before = snapshot(sched)
        step = sched.schedule()
        check_step(sched, step, before)
        for s in sched.running:
            if s.num_preemptions == 0 and s not in first_admitted:
                first_admitted.append(s)
        sched.postprocess(step, [7 if s.num_computed + n == len(s.token_ids) else None
                                 for s, n in zip(step.seqs, step.num_tokens)])
        sched.dropped.clear()
        check_blocks(sched)
        step_no += 1
        assert step_no < max_steps, "no progress"
    return first_admitted


workloads = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 40), st.integers(1, 6)), min_size=1, max_size=12)


@FEW
@given(work=workloads, num_blocks=st.integers(12, 40), budget=st.integers(4, 48), max_running=st.integers(1, 6))
def test_every_step_keeps_the_budget_the_order_and_the_block_counts(work, num_blocks, budget, max_running):
    sched = make(num_blocks, budget, max_running)
    seqs, arrivals = [], {}
    for i, (at, prompt, max_tokens) in enumerate(sorted(work, key=lambda w: w[0])):
        seq = request(i, prompt, max_tokens)
        seqs.append(seq)
        arrivals.setdefault(at, []).append(seq)
    first_admitted = run(sched, arrivals)
    assert [s.request_id for s in first_admitted] == sorted((s.request_id for s in first_admitted),
                                                            key=lambda r: int(r[1:])), "not first come, first served"
    for s in seqs:
        assert s.is_finished and not s.block_table
    assert sched.block_manager.num_used == 0


@pytest.mark.parametrize("n", range(3, 9))
@pytest.mark.parametrize("blocks_each", [1, 2, 3])
@pytest.mark.parametrize("spare", [0, 1, 2])
def test_out_of_blocks_the_newest_are_preempted_and_wait_first_in_arrival_order(n, blocks_each, spare):
    """n sequences decode in step; each needs one more block at once and only `spare` are free:
    the fewest newest ones are preempted, every older one runs, and the preempted wait at the
    front of the queue in arrival order, ahead of a request that was already waiting."""
    sched = make(n * blocks_each + spare, budget=n * blocks_each * BS)
    seqs = [request(i, blocks_each * BS, 10) for i in range(n)]
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    sched.postprocess(step, [7] * len(step.seqs))  # every prompt prefilled, first token out
    assert [s.status for s in seqs] == [RUNNING] * n
    late = request(n, 4, 2)
    sched.add(late)
    before = snapshot(sched)
    step = sched.schedule()  # every sequence needs a new block for its next token
    check_step(sched, step, before)
    preempted = [s for s in seqs if s.num_preemptions]
    p = len(preempted)
    assert p == next(k for k in range(n + 1) if n - k <= spare + k * blocks_each)  # the fewest that free enough
    assert preempted == seqs[n - p:], "not the newest"
    assert step.seqs == seqs[: n - p]
    assert list(sched.waiting) == preempted + [late]


@pytest.mark.parametrize("pulled", [1, 2, 3])
@pytest.mark.parametrize("prefill_tokens", [17, 40])
def test_pulled_decodes_go_before_a_running_prefill(pulled, prefill_tokens):
    """A decode resumed after its KV pull joins the end of the running list (engine/service/llm_engine.py
    `resume`); however few sequences run, it gets its token before a prefill takes the budget."""
    sched = make(64, budget=8)
    bm = sched.block_manager
    long = request(0, prefill_tokens, 2)
    sched.add(long)
    sched.postprocess(sched.schedule(), [None])  # one chunk prefilled: still prefilling
    resumed = []
    for i in range(pulled):
        seq = request(i + 1, 6, 5)
        seq.token_ids.append(7)  # the prefill engine's first token
        bm.allocate(seq, bm.match_prefix(seq))
        seq.num_computed, seq.status = 6, RUNNING  # the prompt's K/V pulled, as `resume` leaves it
        sched.running.append(seq)
        resumed.append(seq)
    step = sched.schedule()
    assert step.seqs == resumed + [long]
    assert step.num_tokens == [1] * pulled + [8 - pulled]


@pytest.mark.parametrize("pin", [False, True])
@pytest.mark.parametrize("stops", [False, True])
@pytest.mark.parametrize("max_tokens", [1, 3])
def test_a_finished_prefill_keeps_its_blocks_only_for_the_decode_that_follows(pin, stops, max_tokens):
    """A prefill for a remote decode (`pin_kv`) that ends at its length keeps its blocks for the pull;
    one that ends on a stop token is the whole answer (no decode follows) and frees them, as every
    other finished sequence does."""
    stop = 2
    sched = Scheduler(SchedulerConfig(64, 8, 4096), BlockManager(16, BS), frozenset({stop}))
    seq = request(0, 9, max_tokens)
    seq.pin_kv = pin
    sched.add(seq)
    while not seq.is_finished:
        step = sched.schedule()
        sched.postprocess(step, [stop if stops else 7 for _ in step.seqs])
    pinned = pin and not stops
    assert seq.finish_reason == ("stop" if stops else "length")
    assert sched.pinned_out == ([seq] if pinned else [])
    assert sched.block_manager.num_used == (3 if pinned else 0)  # 9 prompt tokens + 1..3: 3 blocks of 4
