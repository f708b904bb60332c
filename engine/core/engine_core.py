"""The engine's work, synchronous: admit, schedule, postprocess, and the load record.

One core serves both drivers: the engine server's asyncio loop
(engine/service/llm_engine.py), which runs each step on the model runner, and the
simulator's virtual clock (loadgen/sim/instance.py), which prices each step with
the cost model and finishes it at its end time. A step is split at the instant the
model runs, because the simulator needs virtual time between the two halves:

    begin_step()        schedule -> the Step to run, and what the scheduler dropped
    (the driver runs the tier copies and the step, on a runner or a clock)
    finish_step(tokens) postprocess -> the sequences that advanced, finished
                        prefills pinned for a pull

The tier I/O (copy batches, store calls), request handles, metrics and
disaggregation stay with the drivers.
"""

from __future__ import annotations

import dataclasses

from kvroute.engine.core.adapter_slots import AdapterSlots
from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.kv_events import KVChange
from kvroute.engine.core.scheduler import Scheduler, SchedulerConfig, Step
from kvroute.engine.core.sequence import Sequence
from kvroute.router.contract.protocol import LoadRecord

QUEUE_FULL = "engine queue is full"
NO_FIT = "prompt does not fit in the KV block pool"
DROPPED = "sequence dropped: out of KV blocks"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoreConfig:
    instance: str
    max_batched_tokens: int
    max_running: int
    max_waiting: int
    max_model_len: int
    max_loras: int = 0  # LoRA adapter slots (engine/core/adapter_slots.py); 0: the engine serves no adapter


@dataclasses.dataclass(slots=True)
class StepStart:
    step: Step  # may be empty: nothing could be scheduled
    dropped: list[Sequence]  # ended while scheduling: alone and out of blocks ("length")


@dataclasses.dataclass(slots=True)
class StepEnd:
    advanced: list[Sequence]  # got a token (finished ones included)
    pinned: list[Sequence]  # finished prefills whose blocks stay for a pull (the driver holds them)


class EngineCore:
    """One engine's block manager and scheduler, stepped by a driver."""

    def __init__(self, config: CoreConfig, block_manager: BlockManager, stop_token_ids: frozenset[int]) -> None:
        self.config = config
        self.block_manager = block_manager
        self.adapters = AdapterSlots(config.max_loras) if config.max_loras else None
        scheduler_config = SchedulerConfig(max_batched_tokens=config.max_batched_tokens, max_running=config.max_running,
                                           max_model_len=config.max_model_len)
        self.scheduler = Scheduler(scheduler_config, block_manager, stop_token_ids, self.adapters)
        self.max_fresh = -(-config.max_batched_tokens // block_manager.block_size)  # blocks a step may take
        self.progress = 0  # tokens the finished steps computed (prefill and decode): the load record's `progress`

    # -- requests -----------------------------------------------------------------

    @property
    def queue_full(self) -> bool:
        return len(self.scheduler.waiting) >= self.config.max_waiting

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- the step -----------------------------------------------------------------

    def begin_step(self) -> StepStart:
        sched = self.scheduler
        step = sched.schedule()
        dropped, sched.dropped = sched.dropped, []
        return StepStart(step, dropped)

    def finish_step(self, step: Step, tokens: list[int | None]) -> StepEnd:
        sched = self.scheduler
        self.progress += sum(step.num_tokens)
        advanced = sched.postprocess(step, tokens)
        pinned = sched.pinned_out
        if pinned:
            sched.pinned_out = []
        return StepEnd(advanced, pinned)

    def unschedulable(self, held: bool = False) -> list[Sequence]:
        """Nothing could be scheduled: the sequences that never will, aborted (the driver fails them with
        NO_FIT). None while store loads are pending or `held` (blocks held outside the scheduler, e.g. for a
        KV transfer, will come back); else the head of the queue when nothing runs (defensively: every
        running sequence, which then cannot progress either)."""
        sched = self.scheduler
        if held or self.block_manager.has_pending_loads:
            return []
        stuck = [sched.waiting[0]] if not sched.running and sched.waiting else list(sched.running)
        for seq in stuck:
            sched.abort(seq)
        return stuck

    def drain_events(self) -> list[KVChange]:
        return self.block_manager.drain_events()

    # -- the load record ----------------------------------------------------------

    def load_record(self, *, ts: float, remote_waiting: int = 0, state: str = "ready", role: str = "",
                    kv_tiers: dict | None = None) -> LoadRecord:
        """What GET /load reports. `waiting` counts the remote-prefilled requests waiting for blocks to pull
        their K/V into (`remote_waiting`) with the scheduler's queue: both are requests this engine accepted
        and has not started, and a router choosing a decode engine must see that backlog (the simulator and
        the engine report it alike). `progress` only grows while steps finish: a router watching a request
        here tells a hung step loop (a live HTTP server, no progress) from a busy one. `adapters` are the LoRA
        adapters resident in its `adapter_slots` (0 slots: it serves none, and a router prices that)."""
        bm, sched, slots = self.block_manager, self.scheduler, self.adapters
        kv_free, kv_evictable = bm.kv_load()
        return LoadRecord(instance=self.config.instance, running=len(sched.running),
                          waiting=len(sched.waiting) + remote_waiting, kv_used_blocks=bm.num_used,
                          kv_total_blocks=bm.num_blocks, queued_prefill_tokens=sched.queued_prefill_tokens, ts=ts,
                          state=state, role=role, kv_free_blocks=kv_free, kv_evictable=kv_evictable,
                          kv_tiers=kv_tiers if kv_tiers is not None else {}, progress=self.progress,
                          adapters=slots.resident() if slots else (), adapter_slots=slots.num_slots if slots else 0)
