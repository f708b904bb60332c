"""oracle_future: the oracle that also knows what each placement evicts and whether that is ever used again.

The oracle (oracle.py) optimises each request's TTFT alone. A prefix cached nowhere
predicts the same TTFT everywhere, so it lands at random and evicts whatever that
instance's LRU list holds, hot or cold; where the KV pools are full, later requests
lose their hits for it, and kv_aware, which prices evictions, beats it. This
reference adds that price with perfect knowledge:

    cost_i = oracle ttft_i + recompute_s x |{victims on i requested again within T_i}|

- victims on i: the blocks i's block manager would evict for this request's uncached
  blocks -- its free blocks first, then its LRU list from the least recently used,
  after the blocks its waiting prompts will take -- read from the block manager itself;
- requested again: the workload's future, every request's planned send time (open-loop
  arrival times are fixed by the seed; a multi-turn follow-up is counted at its
  parent's send time plus think time, the earliest it can come);
- within T_i: how long the longest-idle evictable block on i has been unused, the time
  blocks now survive idle there (Che's approximation of an LRU cache: a block is hit
  when it is asked for again within the cache's characteristic time); a block needed
  later would have been evicted anyway;
- recompute_s = block_size x the cost model's prefill_token_s.

It is a reference, not a bound: it still decides one request at a time.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from kvroute.loadgen.sim.cluster import Cluster
from kvroute.loadgen.sim.oracle import OraclePolicy
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.contract.protocol import block_hashes, hash_seed
from kvroute.router.decision.base import Decision, InstanceState, RouteRequest
from kvroute.router.index.base import PrefixMatch


def planned_times(specs: Sequence[RequestSpec], starts: Sequence[tuple[float, RequestSpec]]) -> dict[int, float]:
    """Request index -> its planned send time: its arrival, or a follow-up's parent's plus its think time."""
    planned = {spec.index: t for t, spec in starts}
    for spec in sorted(specs, key=lambda s: s.index):
        if spec.after is not None and spec.index not in planned:
            planned[spec.index] = planned.get(spec.after, 0.0) + spec.think_s
    return planned


class FutureUses:
    """Block hash -> the planned send times of every request whose prompt holds it."""

    def __init__(self, specs: Sequence[RequestSpec], starts: Sequence[tuple[float, RequestSpec]],
                 block_size: int, seed: int) -> None:
        planned = planned_times(specs, starts)
        uses: dict[int, list[float]] = collections.defaultdict(list)
        for spec in specs:
            t = planned.get(spec.index, 0.0)
            for h in block_hashes(spec.prompt_ids, block_size, seed):
                uses[h].append(t)
        self._uses = {h: sorted(times) for h, times in uses.items()}
        self.span_s = max(planned.values()) - min(planned.values()) if planned else 0.0  # first to last send

    def requests_holding(self, block_hash: int) -> int:
        """How many of the workload's requests hold the block (popularity, not when)."""
        return len(self._uses.get(block_hash, ()))

    def next_use(self, block_hash: int, now: float) -> float:
        """The first planned request after `now` that holds the block (inf: none)."""
        times = self._uses.get(block_hash)
        if not times:
            return math.inf
        k = bisect.bisect_right(times, now)
        return times[k] if k < len(times) else math.inf

    def previous_use(self, block_hash: int, now: float) -> float:
        """The last planned request before `now` that holds the block (-inf: none)."""
        times = self._uses.get(block_hash)
        if not times:
            return -math.inf
        k = bisect.bisect_left(times, now)
        return times[k - 1] if k else -math.inf


class FutureOraclePolicy(OraclePolicy):
    label = "oracle_future"

    def __init__(self, cluster: Cluster, future: FutureUses, *, rng: random.Random | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(cluster, rng=rng, clock=clock)
        self.future = future
        self.recompute_s = self.block_size * self.cost_model.prefill_token_s

    def select(self, request: RouteRequest, candidates: Sequence[InstanceState],
               matches: Mapping[str, PrefixMatch]) -> Decision:
        ttft, uncached = self.predicted_ttft(request)
        now = self.clock()
        cost = ttft + np.array([self.recompute_s * self.lost_blocks(inst, int(u), now)
                                for inst, u in zip(self.instances, uncached)])
        i = self.lowest(cost, candidates)
        return Decision(instance=self.ids[i], reason=f"{self.label}: predicted TTFT {ttft[i]:.4f} s + evictions "
                        f"{cost[i] - ttft[i]:.4f} s", uncached_tokens=int(uncached[i]))

    def wanted(self, block_hash: int, now: float, survive_s: float) -> float:
        """1 if a request holds the block within `survive_s` of `now`, else 0."""
        return 1.0 if self.future.next_use(block_hash, now) - now <= survive_s else 0.0

    def lost_blocks(self, inst, uncached_tokens: int, now: float) -> float:
        """Blocks this placement evicts on `inst` that are requested again within its LRU survival time
        (`wanted` says how much each counts)."""
        bm, bs = inst.block_manager, self.block_size
        need = -(-uncached_tokens // bs)
        ahead = sum(len(s) - s.num_computed for s in inst.scheduler.waiting) // bs
        free = bm.num_free_plain
        skip, take = max(ahead - free, 0), need - max(free - ahead, 0)
        if take <= 0 or not bm.free_cached:
            return 0.0
        survive, wanted, blocks = now - next(iter(bm.free_cached.values())), self.wanted, bm.blocks
        return sum(wanted(blocks[block_id].hash, now, survive)
                   for block_id in itertools.islice(bm.free_cached, skip, skip + take))


def make_future_oracle(cluster: Cluster, rng: random.Random | None = None, clock: Callable[[], float] | None = None,
                       specs: Sequence[RequestSpec] = (),
                       starts: Sequence[tuple[float, RequestSpec]] = ()) -> FutureOraclePolicy:
    return FutureOraclePolicy(cluster, future_uses(cluster, specs, starts), rng=rng, clock=clock)


def future_uses(cluster: Cluster, specs: Sequence[RequestSpec], starts: Sequence[tuple[float, RequestSpec]]) \
        -> FutureUses:
    """The workload's block uses, hashed as the cluster's engines hash."""
    first = cluster.instances[0]
    return FutureUses(specs, starts, first.config.batch.block_size, hash_seed(first.runner.info.model))
