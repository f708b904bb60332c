"""Continuous batching with chunked prefill and preemption by recompute.

Each step spends a token budget (`max_batched_tokens`): running sequences first,
decodes (one token each) before unfinished prefills, then waiting requests in
arrival order while the budget, `max_running` and free blocks allow. A sequence
whose next tokens need a block when none is free preempts the most recently
admitted running sequence: its blocks are freed (they stay in the prefix cache)
and it goes back to the front of the waiting queue to be recomputed.

With LoRA adapters (`adapters`, engine/core/adapter_slots.py) a sequence holds its
adapter's slot while it runs; a waiting one whose adapter cannot get a slot (every
slot in use by other adapters) is passed over, in place, for those behind it, as
vLLM's scheduler does. The slots refilled are counted in `AdapterSlots.loads` (the engine's metric);
a step pays for a load when it runs a work whose slot does not hold its adapter yet, the runner's
rule (engine/runners/sim.py `adapter_loads`, which the simulator prices its steps with too).
"""

from __future__ import annotations

import collections
import dataclasses

from kvroute.engine.core.adapter_slots import AdapterSlots
from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.core.work import SeqWork


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 2048
    max_running: int = 64
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1:
            raise ValueError("max_batched_tokens must be at least 1")
        if self.max_running < 1:
            raise ValueError("max_running must be at least 1")


@dataclasses.dataclass(slots=True)
class Step:
    seqs: list[Sequence]
    num_tokens: list[int]

    def works(self) -> list[SeqWork]:
        out = []
        for seq, n in zip(self.seqs, self.num_tokens):
            c = seq.num_computed
            sample = c + n == len(seq.token_ids)
            history = sample and seq.sampling.needs_history
            out.append(
                SeqWork(
                    seq_id=seq.seq_id,
                    token_ids=tuple(seq.token_ids[c : c + n]),
                    start_pos=c,
                    block_table=tuple(seq.block_table),
                    sample=sample,
                    sampling=seq.sampling,
                    num_generated=seq.num_generated,
                    prompt_ids=tuple(seq.token_ids[: seq.num_prompt]) if history else (),
                    output_ids=tuple(seq.output_ids) if history else (),
                    adapter=seq.adapter,
                    adapter_slot=seq.adapter_slot,
                )
            )
        return out


RUNNING = SeqStatus.RUNNING


def _prefilling(seq: Sequence) -> bool:
    return len(seq.token_ids) - seq.num_computed > 1


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, stop_token_ids: frozenset[int],
                 adapters: AdapterSlots | None = None) -> None:
        self.config = config
        self.block_manager = block_manager
        self.adapters = adapters  # None: no LoRA adapters
        self.stop_token_ids = stop_token_ids
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.dropped: list[Sequence] = []  # finished while scheduling (could never fit); engine drains
        self.pinned_out: list[Sequence] = []  # finished prefills whose blocks stay for a pull; engine drains

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def queued_prefill_tokens(self) -> int:
        pending = 0
        for s in self.waiting:
            pending += len(s.token_ids) - s.num_computed
        for s in self.running:
            n = len(s.token_ids) - s.num_computed
            if n > 1:  # prefilling
                pending += n
        return pending

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.block_manager.free(seq)
        self._finish(seq, reason)

    def schedule(self) -> Step:
        seqs: list[Sequence] = []
        counts: list[int] = []
        step = Step(seqs, counts)
        budget = self.config.max_batched_tokens
        bm, running, waiting = self.block_manager, self.running, self.waiting
        if bm.tiers is not None:
            bm.drain_loads()  # loads ready since the last step go into this step's copy batch
        if len(running) > 1:  # decodes first so a long prefill never stalls them; then unfinished prefills
            running.sort(key=_prefilling)
        for seq in running[:]:
            if budget == 0:
                break
            if seq.status is not RUNNING or seq.pending_loads:
                continue  # preempted earlier in this loop, or waiting for blocks to be loaded
            if seq.adapter is not None and seq.adapter_slot < 0 and not self._take_slot(seq):
                continue  # resumed from a remote prefill: its adapter waits for a slot
            n = min(len(seq.token_ids) - seq.num_computed, budget)
            if bm.blocks_needed(seq.num_computed + n) > len(seq.block_table):  # it needs another block
                if not bm.can_append(seq, n) and not self._make_room(seq, n, step):
                    continue
                bm.append_slots(seq, n)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        max_running, passed = self.config.max_running, []
        while waiting and budget > 0 and len(running) < max_running:
            seq = waiting[0]
            if seq.adapter is not None and not self._can_take(seq.adapter):
                passed.append(waiting.popleft())  # every slot busy with other adapters: the next one may run
                continue
            hits = bm.match_prefix(seq)
            if not bm.can_allocate(seq, hits):
                break
            waiting.popleft()
            if seq.adapter is not None:
                self._take_slot(seq)
            bm.allocate(seq, hits)
            if seq.num_preemptions == 0:
                seq.num_cached, seq.cached_by_tier = seq.num_computed, hits.tokens_by_tier(bm.block_size)
            seq.status = RUNNING
            running.append(seq)
            if seq.pending_loads:
                continue  # runs once its loads are copied (engine/kv/load_queue.py)
            n = min(len(seq.token_ids) - seq.num_computed, budget)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        if passed:
            waiting.extendleft(reversed(passed))
        return step

    def _can_take(self, adapter: str) -> bool:
        assert self.adapters is not None  # a request names an adapter only where the engine serves it (else 404)
        return self.adapters.can_take(adapter)

    def _take_slot(self, seq: Sequence) -> bool:
        """`seq`'s adapter gets a slot, or False: every slot is busy with other adapters."""
        assert seq.adapter is not None
        if not self._can_take(seq.adapter):
            return False
        assert self.adapters is not None
        seq.adapter_slot, _ = self.adapters.take(seq.adapter)
        return True

    def _release_slot(self, seq: Sequence) -> None:
        if seq.adapter_slot >= 0:
            assert self.adapters is not None  # a slot was taken from them
            self.adapters.release(seq.adapter_slot)
            seq.adapter_slot = -1

    def postprocess(self, step: Step, sampled: list[int | None]) -> list[Sequence]:
        """Advance each scheduled sequence; returns those that got a new token."""
        advanced = []
        bm = self.block_manager
        bs = bm.block_size
        stop_ids, max_len = self.stop_token_ids, self.config.max_model_len
        for seq, n, token in zip(step.seqs, step.num_tokens, sampled):
            if seq.status is not RUNNING:
                continue  # aborted while the step ran
            seq.num_computed += n
            if seq.num_computed // bs > len(seq.block_hashes):  # a block was filled: hash it
                bm.commit_computed(seq)
            if token is None:
                continue
            tokens = seq.token_ids
            tokens.append(token)
            advanced.append(seq)
            sampling = seq.sampling
            if token in stop_ids and not sampling.ignore_eos:  # vLLM's order: a stop token, then the length
                reason = "stop"
            elif len(tokens) - seq.num_prompt >= sampling.max_tokens or len(tokens) >= max_len:
                reason = "length"
            else:
                continue
            self.running.remove(seq)
            if seq.pin_kv and reason == "length":
                self.pinned_out.append(seq)
            else:
                bm.free(seq)
            self._finish(seq, reason)
        return advanced

    def _make_room(self, seq: Sequence, n: int, step: Step) -> bool:
        """Preempt later sequences until `seq` can take `n` more tokens; False if `seq` itself went."""
        while not self.block_manager.can_append(seq, n):
            victims = [s for s in self.running if s is not seq and s not in step.seqs]
            if not victims and not step.seqs:
                # Alone and still out of blocks: it can never grow, so end it rather than livelock.
                self.running.remove(seq)
                self.block_manager.free(seq)
                self._finish(seq, "length")
                self.dropped.append(seq)
                return False
            victim = victims[-1] if victims else seq
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self._release_slot(seq)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._release_slot(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
