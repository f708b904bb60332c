"""One simulated engine: the engine's own `EngineCore`, step times from the sim runner's cost model.

A thin driver of engine/core/engine_core.py on the virtual clock, as the engine
server's asyncio loop (engine/service/llm_engine.py) is one on the wall clock:
`start_step` is the core's `begin_step` priced with the engine's cost model (that of
the `SimRunner` that `engine.runners.registry` builds from the same sections, exactly
as `kvroute engine --backend sim` does); `finish_step`, at the step's end time, is
the core's `finish_step`. KV changes are drained with `block_manager.drain_events()`
after each of the two, where the engine publishes them (evictions while
scheduling, newly computed blocks after a step). The load record is the core's
(`load_record`), so both report remote prefills waiting for blocks in `waiting`.

Speed: building `Step.works()` (copies of every chunk's tokens and block table)
for `SimRunner.execute_sync` costs more than the rest of a step, so the step is
priced by `CostModel.scheduled_time`, the cost model's own formula read straight
from the step (checked equal to `cost_model.step_time(step.works())` in
tests/unit/test_sim.py), and every sampled token is one fixed ordinary id: the runner's tokens are never read
(generation runs to max_tokens either way, as with SimRunner's, which are never
special), only hashed into output blocks that no prompt shares.

Failures mirror the engine: a full waiting queue rejects at admission (HTTP 429
there), a prompt that can never fit the KV pool fails at the head of the queue,
and a sequence the scheduler drops (alone and out of blocks) ends.

Disaggregation (loadgen/sim/disagg.py) gives an instance a `role` and uses two
more fields: `remote`, decode requests waiting for blocks to pull a prefill's K/V
into, and `num_held`, sequences whose blocks are held outside the scheduler (a
finished prefill pinned for a pull, or a decode pulling). While any are held, a
step that can schedule nothing waits for their release instead of failing the
head of the queue.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.config import BatchConfig
from kvroute.engine.core.engine_core import DROPPED, NO_FIT, QUEUE_FULL, CoreConfig, EngineCore
from kvroute.engine.core.scheduler import Step
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.tier_setup import TierSite, build_tiers
from kvroute.engine.runners.config import RunnerConfig
from kvroute.engine.runners.registry import RUNNERS
from kvroute.engine.runners.sim import NUM_SPECIAL_TOKENS, SimRunner
from kvroute.loadgen.sim.tiers import SimTierIO
from kvroute.router.contract.protocol import LoadRecord

__all__ = ["DROPPED", "NO_FIT", "QUEUE_FULL", "SimInstance"]
SAMPLED_TOKEN = NUM_SPECIAL_TOKENS  # the first ordinary id


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimEngine:
    """A simulated engine's sections: those the engine server gives its core, its runner and its tiers."""

    batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
    runner: RunnerConfig = dataclasses.field(default_factory=lambda: RunnerConfig(backend="sim"))
    tiers: TierConfig = dataclasses.field(default_factory=TierConfig)


class SimInstance:
    """An engine on the virtual clock; `busy` while a step is in flight.

    `make_io` builds the instance's tier I/O from its tiers and block manager (the cluster's
    `SimTierIO`, loadgen/sim/tiers.py); it is called only when the config has tiers."""

    def __init__(self, index: int, config: SimEngine, clock: Callable[[], float] = lambda: 0.0,
                 make_io: Callable[..., SimTierIO] | None = None, instance: str = "") -> None:
        if config.runner.backend != "sim":
            raise ValueError("a simulated instance needs a runner section with backend='sim'")
        self.index = index
        self.id = instance or f"sim-{index}"
        self.role = "both"  # or "prefill" / "decode" (loadgen/sim/disagg.py)
        self.remote: collections.deque[Sequence] = collections.deque()
        self.num_held = 0
        self.config = config
        runner = RUNNERS["sim"](config.runner, config.batch, config.tiers)
        assert isinstance(runner, SimRunner)  # backend "sim": its cost model and time scale are read here
        self.runner = runner
        self.cost_model = self.runner.cost_model
        self.clock = clock  # the virtual clock: the block manager's idle times are on it
        info, batch = self.runner.info, config.batch
        site = TierSite(model=info.model, block_size=batch.block_size, time_scale=config.runner.time_scale)
        self.tiers = build_tiers(config.tiers, site, info, self.runner.kv_bytes_per_block,
                                 self.runner.prefill_rate_hint)
        self.block_manager = BlockManager(batch.num_blocks, batch.block_size, self.tiers, clock)
        self.core = EngineCore(CoreConfig(instance=self.id, max_batched_tokens=batch.max_batched_tokens,
                                          max_running=batch.max_running, max_waiting=batch.max_waiting,
                                          max_model_len=info.max_model_len, max_loras=config.runner.adapter_slots),
                               self.block_manager, frozenset())
        self.scheduler = self.core.scheduler
        self.lora = self.core.adapters is not None  # its steps may load adapters (priced by the runner's rule)
        self.max_fresh = self.core.max_fresh
        self.io: SimTierIO | None = (make_io(self.tiers, self.block_manager, self.runner)
                                     if make_io is not None and self.tiers is not None else None)
        self.step: Step | None = None
        self.tokens: list[int | None] = []
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.num_steps = 0
        self.step_wall_s = 0.0  # wall seconds spent in start_step + finish_step (the engine side's cost)

    @property
    def busy(self) -> bool:
        return self.step is not None

    def admit(self, seq: Sequence) -> bool:
        """Queue `seq`; False (nothing queued) when the waiting queue is full."""
        if self.core.queue_full:
            return False
        self.core.add(seq)
        return True

    def start_step(self, now: float) -> tuple[float | None, list[tuple[Sequence, str]]]:
        """Schedule one step; its duration (None: nothing could run) and the sequences that failed."""
        t0 = time.perf_counter()
        out = self._start_step(now)
        self.step_wall_s += time.perf_counter() - t0
        return out

    def _start_step(self, now: float) -> tuple[float | None, list[tuple[Sequence, str]]]:
        start = self.core.begin_step()
        step = start.step
        failed = [(seq, DROPPED) for seq in start.dropped] if start.dropped else []
        copy_s = ahead_s = 0.0
        if self.io is not None:
            copy_s = self.io.copies(now, self.block_manager.take_copy_plan())
            ahead_s = self.io.copies(now, self.block_manager.take_ahead_plan(self.max_fresh))
            self.io.fetch(now)
        if not step.seqs and not copy_s:
            # blocks held for a transfer, or loads waiting for store bytes: wait; else the head can never fit
            failed.extend((seq, NO_FIT) for seq in self.core.unschedulable(held=self.num_held > 0))
            return None, failed
        loads = self.runner.adapter_loads([(seq.adapter, seq.adapter_slot) for seq in step.seqs]) if self.lora else 0
        duration = self.cost_model.scheduled_time(step, loads) * self.runner.time_scale
        if self.tiers is not None:
            self.tiers.recovery.prefill.observe(sum(n for n in step.num_tokens if n > 1), duration)
        duration = max(copy_s + duration, ahead_s)  # the batch, then the step; the ahead batch alongside both
        self.tokens = [SAMPLED_TOKEN if seq.num_computed + n == len(seq.token_ids) else None
                       for seq, n in zip(step.seqs, step.num_tokens)]
        self.step = step
        self.busy_until = now + duration
        self.busy_s += duration
        self.num_steps += 1
        return duration, failed

    def finish_step(self) -> list[Sequence]:
        """Advance the step's sequences; returns those that got a token (finished ones included)."""
        t0 = time.perf_counter()
        step, self.step = self.step, None
        assert step is not None  # a step was started (busy_until)
        end = self.core.finish_step(step, self.tokens)
        self.num_held += len(end.pinned)
        self.step_wall_s += time.perf_counter() - t0
        return end.advanced

    def tier_costs(self):
        """What this instance advertises about its tiers (None without tiers)."""
        return self.tiers.recovery.costs() if self.tiers is not None else None

    def load(self) -> LoadRecord:
        """What the engine's GET /load reports (engine/core/engine_core.py), `ts` on the virtual clock."""
        return self.core.load_record(ts=self.clock(), remote_waiting=len(self.remote), role=self.role)

    def prefill_backlog(self) -> tuple[int, int, int]:
        """(prompt tokens still to prefill after the step in flight, decoding sequences, their context tokens)."""
        sched = self.scheduler
        queued = sum(len(s) - s.num_computed for s in sched.waiting)
        decoding = context = 0
        for s in sched.running:
            if s.is_prefilling:
                queued += len(s) - s.num_computed
            else:
                decoding += 1
                context += len(s)
        if self.step is not None:
            for seq, n in zip(self.step.seqs, self.step.num_tokens):
                if seq.status == SeqStatus.RUNNING and n > 1:
                    queued -= n
        return max(queued, 0), decoding, context
