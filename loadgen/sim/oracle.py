"""Oracle: the simulator's reference policy, with instant and exact knowledge of every instance.

No router can be this policy: it reads the simulated engines themselves. It shows
how close a real policy gets to the limit of what perfect information buys.

For each instance i, with the request's `num_tokens` and chained block hashes:

    cached_i   = prompt tokens in i's prefix cache when the request is next scheduled
                 there, as its scheduler would match them (whole blocks, leaving at least
                 one token to compute): the cached blocks now, or the blocks that the
                 step in flight there completes (a sibling's prefill), whichever is longer
    uncached_i = num_tokens - cached_i
    work_i     = queued_i + uncached_i    (queued_i: prompt tokens waiting or still to
                                            prefill there, after the step in flight)
    steps_i    = ceil(work_i / max(max_batched_tokens - decoding_i, 1))
    ttft_i     = remaining_i                                  (the step in flight)
               + steps_i * (step_s + decode_seq_s * decoding_i + decode_context_s * context_i)
               + prefill_token_s * work_i
               + prefill_pair_s * uncached_i * (cached_i + (uncached_i + 1) / 2)

with the instance's own cost model (engine/runners/cost_model.py): decodes share every step
with the prefill (they go first in the scheduler's budget). An instance whose
waiting queue is full is never chosen unless all are. The lowest ttft_i wins;
exact ties are broken at random. `Decision.uncached_tokens` is the winner's.

Its cache knowledge is a `MemoryIndex` fed with every instance's KV events the
moment the block manager emits them (`Cluster.kv_listeners`), which mirrors each
block manager's hash table exactly at O(holders) per lookup, plus a table of the
blocks each instance's step in flight is computing (from the hashes `on_routed`
saw); its queue knowledge is per-instance arrays refreshed whenever an instance's
queue changes (`Cluster.step_listeners`), so a decision is a handful of numpy
operations over all instances.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from kvroute.loadgen.sim.cluster import Cluster, KVEvents
from kvroute.loadgen.sim.instance import SimInstance
from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.index.base import PrefixMatch
from kvroute.router.index.memory import MemoryIndex


class OraclePolicy(PolicyBase):
    config_class = None
    uses_index = False  # it has its own, instant one

    def __init__(self, cluster: Cluster, *, rng: random.Random | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.rng = rng or random.Random()
        self.clock = clock or (lambda: cluster.now)
        self.instances = cluster.instances
        self.ids = [inst.id for inst in cluster.instances]
        self.position = {inst_id: i for i, inst_id in enumerate(self.ids)}
        first = cluster.instances[0].config.batch
        self.block_size = first.block_size
        self.budget = first.max_batched_tokens
        self.cost_model = cluster.instances[0].cost_model
        n = len(self.ids)
        self.queued = np.zeros(n)
        self.decoding = np.zeros(n)
        self.context = np.zeros(n)
        self.busy_until = np.zeros(n)
        self.full = np.zeros(n, dtype=bool)
        self.num_full = 0
        # per instance, what a step costs and how many prompt tokens one takes, kept with the queues
        self.per_step = np.full(n, self.cost_model.step_s)
        self.room = np.full(n, max(float(self.budget), 1.0))
        self.index = MemoryIndex()
        self.routes: dict[str, tuple[int, ...]] = {}  # request id -> its block hashes, until it ends
        self.computing = InFlightBlocks()
        cluster.kv_listeners.append(self._on_kv_events)
        cluster.step_listeners.append(self._on_queue_changed)

    def _on_kv_events(self, index: int, events: KVEvents) -> None:
        inst = self.ids[index]
        for ev in events:
            if ev.tier == "device":  # the oracle knows device caches only (no load-time model)
                self.index.apply_sync(inst, ev.kind, ev.blocks)

    def _on_queue_changed(self, inst: SimInstance) -> None:
        i = inst.index
        if self.computing.step_of(i) is not inst.step:
            self.computing.set_step(i, inst.step, self._chunks(inst))
        queued, decoding, context = inst.prefill_backlog()
        self.queued[i], self.decoding[i], self.context[i] = queued, decoding, context
        cm = self.cost_model
        self.per_step[i] = cm.step_s + cm.decode_seq_s * decoding + cm.decode_context_s * context
        self.room[i] = max(float(self.budget - decoding), 1.0)
        self.busy_until[i] = inst.busy_until if inst.busy else 0.0
        full = len(inst.scheduler.waiting) >= inst.config.batch.max_waiting
        self.num_full += full - bool(self.full[i])
        self.full[i] = full

    def predicted_ttft(self, request: RouteRequest) -> tuple[np.ndarray, np.ndarray]:
        """(ttft_s, uncached tokens) for every instance, in instance order."""
        cm, bs, n = self.cost_model, self.block_size, request.num_tokens
        cached = np.zeros(len(self.ids))
        usable = max(n - 1, 0) // bs
        blocks = request.block_hashes[:usable]
        for inst, match in self.index.lookup_sync(blocks).items():
            cached[self.position[inst]] = match.blocks * bs
        for i, count in self.computing.match(blocks).items():
            cached[i] = max(cached[i], count * bs)
        uncached = n - cached
        work = self.queued + uncached
        steps = np.ceil(work / self.room)
        ttft = (np.maximum(self.busy_until - self.clock(), 0.0) + steps * self.per_step + cm.prefill_token_s * work
                + cm.prefill_pair_s * uncached * (cached + (uncached + 1) / 2))
        if self.num_full and self.num_full < len(self.ids):
            ttft[self.full] = np.inf
        return ttft, uncached

    def select(self, request: RouteRequest, candidates: Sequence[InstanceState],
               matches: Mapping[str, PrefixMatch]) -> Decision:
        ttft, uncached = self.predicted_ttft(request)
        i = self.lowest(ttft, candidates)
        best = ttft[i]
        return Decision(instance=self.ids[i], reason_fn=lambda: f"oracle: predicted TTFT {best:.4f} s",
                        uncached_tokens=int(uncached[i]))

    def lowest(self, cost: np.ndarray, candidates: Sequence[InstanceState]) -> int:
        """The position of the lowest cost among the candidates; exact ties at random."""
        if len(candidates) < len(self.ids):
            allowed = np.zeros(len(self.ids), dtype=bool)
            allowed[[self.position[c.id] for c in candidates]] = True
            cost[~allowed] = np.inf
        ties = np.flatnonzero(cost == cost.min())
        return int(ties[0]) if len(ties) == 1 else int(self.rng.choice(ties.tolist()))

    def _chunks(self, inst: SimInstance) -> list[tuple[int, ...]]:
        """The prompt blocks each prefill in `inst`'s step in flight will have computed when it ends."""
        if inst.step is None:
            return []
        out = []
        for seq, n in zip(inst.step.seqs, inst.step.num_tokens):
            hashes = self.routes.get(seq.request_id)
            if hashes and (n > 1 or not seq.num_computed):
                out.append(hashes[: (seq.num_computed + n) // self.block_size])
        return out

    def on_routed(self, request: RouteRequest, instance: str) -> None:
        self.routes[request.request_id] = request.block_hashes

    def on_finished(self, request: RouteRequest, instance: str) -> None:
        self.routes.pop(request.request_id, None)


class InFlightBlocks:
    """Per instance, the block chains its step in flight completes: hash -> {instance: count}.

    Each chain is a prompt's blocks from its first, so an instance's entries are closed
    under prefixes and `match` finds its consecutive prefix by binary search.
    """

    def __init__(self) -> None:
        self._table: dict[int, dict[int, int]] = {}
        self._steps: dict[int, tuple[object, list[tuple[int, ...]]]] = {}

    def step_of(self, i: int) -> object:
        return self._steps.get(i, (None, []))[0]

    def set_step(self, i: int, step: object, chains: list[tuple[int, ...]]) -> None:
        table = self._table
        for chain in self._steps.pop(i, (None, []))[1]:
            for h in chain:
                holders = table[h]
                holders[i] -= 1
                if not holders[i]:
                    del holders[i]
                    if not holders:
                        del table[h]
        if step is not None:
            self._steps[i] = (step, chains)
            for chain in chains:
                for h in chain:
                    holders = table.setdefault(h, {})
                    holders[i] = holders.get(i, 0) + 1

    def match(self, blocks: Sequence[int]) -> dict[int, int]:
        """Per instance computing blocks[0], how many leading blocks of `blocks` it computes."""
        first = self._table.get(blocks[0]) if blocks else None
        if not first:
            return {}
        out = {}
        for i in first:
            lo, hi = 1, len(blocks)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if i in self._table.get(blocks[mid - 1], ()):
                    lo = mid
                else:
                    hi = mid - 1
            out[i] = lo
        return out


def make_oracle(cluster: Cluster, rng: random.Random | None = None, clock: Callable[[], float] | None = None,
                specs: object = (), starts: object = ()) -> OraclePolicy:
    """The oracle needs no look at the workload (`specs`, `starts`: what oracle_future reads)."""
    return OraclePolicy(cluster, rng=rng, clock=clock)
