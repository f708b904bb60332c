"""The virtual clock and the simulated instances.

One heap of timed events -- instance step completions, delayed KV-event
deliveries, load polls, follow-up arrivals (multi-turn) and callbacks (the end
of a KV pull, disagg.py) -- merged with the
workload's arrival stream, which is already in time order and never enters the
heap. Nothing sleeps and no instance is visited unless it has work: an instance
with requests runs one step after another (each ending in one heap event), and
an idle one costs nothing until a request arrives.

The router side (`Sink`, implemented by runner.SimRouter) is called back with:
arrivals, tokens produced by a finished step, failed requests, KV events (after
`event_delay_s`), and load reports (every `poll_interval_s`, for the instances that
changed since the last poll; with 0, at once after every change).

`kv_listeners` get every instance's KV events the moment they are drained and
`step_listeners` every instance whose queue changed (the oracle's instant view).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kvroute.engine.core.kv_events import KVChange
from kvroute.engine.core.sequence import Sequence
from kvroute.loadgen.sim.instance import QUEUE_FULL, SimEngine, SimInstance
from kvroute.loadgen.sim.tiers import SimStore, SimTierIO
from kvroute.loadgen.workload_base import RequestSpec

STEP, DELIVER, POLL, ARRIVE, CALL = 0, 1, 2, 3, 4  # CALL: payload() (a KV transfer's end, disagg.py)

KVEvents = list[KVChange]


class Sink(Protocol):
    def on_arrival(self, spec: RequestSpec) -> None: ...

    def on_tokens(self, inst: SimInstance, seqs: list[Sequence]) -> None: ...

    def on_failed(self, inst: SimInstance, seq: Sequence, error: str, status: int) -> None: ...

    def on_kv_events(self, index: int, events: KVEvents) -> None: ...

    def on_load(self, inst: SimInstance) -> None: ...


def _seeded(engine: SimEngine, seed: int) -> SimEngine:
    return dataclasses.replace(engine, runner=dataclasses.replace(engine.runner, seed=seed))


class Cluster:
    now: float  # the virtual clock (seconds)
    _sink: Sink  # set by run()

    def __init__(self, num_instances: int, engine: SimEngine, event_delay_s: float = 0.0,
                 poll_interval_s: float = 0.1) -> None:
        clock = lambda: self.now  # noqa: E731
        self.store = SimStore() if engine.tiers.kv_store else None  # the one shared store (loadgen/sim/tiers.py)
        self.instances = [SimInstance(i, _seeded(engine, engine.runner.seed + i), clock, self._io_maker(i))
                          for i in range(num_instances)]
        self.event_delay_s = event_delay_s
        self.poll_interval_s = poll_interval_s
        self.now = 0.0
        self.kv_listeners: list[Callable[[int, KVEvents], None]] = []
        self.step_listeners: list[Callable[[SimInstance], None]] = []
        self._heap: list[tuple[float, int, int, Any]] = []  # (at, order, kind, payload: what `kind` takes)
        self._order = itertools.count()
        self._changed: dict[int, None] = {}
        self._poll_pending = False
        self.num_events = 0

    def _io_maker(self, index: int) -> Callable[..., SimTierIO]:
        """Instance `index`'s tier I/O, on this cluster's clock, store and event delivery."""
        def make(tiers, block_manager, runner) -> SimTierIO:
            return SimTierIO(tiers, block_manager.missing_hashes, runner, self.store, self._call_at,
                             lambda events: self.publish_events(index, events),
                             lambda: self.kick(self.instances[index]))
        return make

    def push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._order), kind, payload))

    def run(self, sink: Sink, arrivals: Iterator[tuple[float, RequestSpec]]) -> None:
        """Process everything until no arrival or event is left."""
        self._sink = sink
        heap, pop = self._heap, heapq.heappop
        nxt = next(arrivals, None)
        while True:
            if heap and (nxt is None or heap[0][0] <= nxt[0]):
                at, _, kind, payload = pop(heap)
                self.now = at
                if kind == STEP:
                    self._finish_step(payload)
                elif kind == DELIVER:
                    sink.on_kv_events(*payload)
                elif kind == POLL:
                    self._poll()
                elif kind == CALL:
                    payload()
                else:
                    sink.on_arrival(payload)
            elif nxt is not None:
                self.now = nxt[0]
                sink.on_arrival(nxt[1])
                nxt = next(arrivals, None)
            else:
                break

    def _call_at(self, at: float, fn: Callable[[], None]) -> None:
        self.push(at, CALL, fn)

    def submit(self, index: int, seq: Sequence) -> bool:
        """Hand `seq` to instance `index` (after its store lookup, if any); False when its queue is full."""
        inst = self.instances[index]
        delay = inst.io.lookup_delay(seq) if inst.io is not None else 0.0
        if delay > 0:
            self.push(self.now + delay, CALL, lambda: self._submit_looked_up(inst, seq))
            return True
        return self._submit_now(inst, seq)

    def _submit_looked_up(self, inst: SimInstance, seq: Sequence) -> None:
        if not self._submit_now(inst, seq):
            self._sink.on_failed(inst, seq, QUEUE_FULL, 429)

    def _submit_now(self, inst: SimInstance, seq: Sequence) -> bool:
        if not inst.admit(seq):
            return False
        if not inst.busy:
            self._start_step(inst)
        else:
            self._load_changed(inst)
        return True

    def kick(self, inst: SimInstance) -> None:
        """`inst` got work or free blocks outside a step: start one if it is idle."""
        sched = inst.scheduler
        if not inst.busy and (sched.waiting or sched.running):
            self._start_step(inst)
        else:
            self._load_changed(inst)

    # -- instance steps -------------------------------------------------------------

    def _start_step(self, inst: SimInstance) -> None:
        sink = self._sink
        sched = inst.scheduler
        while sched.waiting or sched.running:  # has_work()
            duration, failed = inst.start_step(self.now)
            self.publish(inst)
            for seq, error in failed:
                sink.on_failed(inst, seq, error, 200)
            if duration is not None:
                self.push(inst.busy_until, STEP, inst)
                break
            if not failed:
                break  # waiting for blocks held by a KV transfer
        self._load_changed(inst)

    def _finish_step(self, inst: SimInstance) -> None:
        advanced = inst.finish_step()
        self.publish(inst)
        self._sink.on_tokens(inst, advanced)
        sched = inst.scheduler
        if sched.waiting or sched.running:  # has_work()
            self._start_step(inst)
        else:
            if inst.io is not None:  # what the last step left planned (reads for the store), while idle
                inst.io.copies(self.now, inst.block_manager.take_copy_plan())
            self._load_changed(inst)

    def publish(self, inst: SimInstance) -> None:
        if inst.block_manager.changes.pending:
            self.publish_events(inst.index, inst.block_manager.drain_events())

    def publish_events(self, index: int, events: KVEvents) -> None:
        self.num_events += len(events)
        for listener in self.kv_listeners:
            listener(index, events)
        if self.event_delay_s > 0:
            self.push(self.now + self.event_delay_s, DELIVER, (index, events))
        else:
            self._sink.on_kv_events(index, events)

    # -- load reports ---------------------------------------------------------------

    def _load_changed(self, inst: SimInstance) -> None:
        for listener in self.step_listeners:
            listener(inst)
        if self.poll_interval_s <= 0:
            self._sink.on_load(inst)
            return
        self._changed[inst.index] = None
        if not self._poll_pending:
            self._poll_pending = True
            tick = self.poll_interval_s
            self.push((math.floor(self.now / tick) + 1) * tick, POLL, None)

    def _poll(self) -> None:
        self._poll_pending = False
        changed, self._changed = self._changed, {}
        for index in changed:
            self._sink.on_load(self.instances[index])

