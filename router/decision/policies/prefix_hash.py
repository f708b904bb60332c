"""Prefix hash: consistent hashing with bounded loads (CHWBL; Mirrokni, Thorup, Zadimoghaddam 2018).

Requests that share a prompt prefix go to the same instance, so its cache serves
them, without any index. The key is xxh3_64 of the chain hash of block `min(K, n) - 1`
of the request's `n` full blocks; a chained hash commits to every block before it, so
this is a hash of the first K blocks (shorter prompts use what they have). Each
instance owns `virtual_nodes` points on a 64-bit ring, at xxh3_64("<id>#<v>"): the
ring depends only on the candidates' ids, so every router replica builds the same
one and agrees on the owner. The request walks clockwise from its key to the first
instance that can take it without exceeding the bound

    inflight + 1 <= ceil(load_factor * (total_inflight + 1) / n_candidates)

(its load after placement is at most `load_factor` times the average). Some instance
always qualifies when load_factor >= 1, and a key only moves off its owner while the
owner is over the bound, so a flood of one prefix spills onto the owner's ring
successors in order instead of piling up. A prompt shorter than one full block has
nothing worth caching and goes to the least loaded candidate (`least_load` rules).
An ejected instance leaves the ring; only its keys move. `Decision.costs` holds each
candidate's inflight count.

Parameters:
    prefix_blocks   K, the number of leading blocks that form the key (default 4).
    virtual_nodes   ring points per instance (default 100); more evens out key shares.
    load_factor     c, the bound on load relative to the average (default 1.25; >= 1).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import struct
from collections.abc import Callable, Mapping, Sequence

import xxhash

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.decision.policies.least_load import least_loaded
from kvroute.router.index.base import PrefixMatch

_U64 = struct.Struct("<Q")
_MAX_RINGS = 16  # distinct candidate sets kept built (healthy-set changes are rare)


@dataclasses.dataclass(frozen=True, slots=True)
class PrefixHashConfig:
    prefix_blocks: int = 4
    virtual_nodes: int = 100
    load_factor: float = 1.25

    def __post_init__(self) -> None:
        if self.prefix_blocks < 1:
            raise ValueError(f"prefix_blocks must be at least 1, got {self.prefix_blocks}")
        if self.virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be at least 1, got {self.virtual_nodes}")
        if self.load_factor < 1:
            raise ValueError(f"load_factor must be at least 1 (1 means perfectly even), got {self.load_factor}")


def build_ring(ids: Sequence[str], virtual_nodes: int) -> tuple[list[int], list[str]]:
    """Sorted ring points and, in the same order, the instance owning each."""
    points = sorted(
        (xxhash.xxh3_64_intdigest(f"{i}#{v}".encode()), i) for i in ids for v in range(virtual_nodes)
    )
    return [p for p, _ in points], [i for _, i in points]


class PrefixHashPolicy(PolicyBase):
    config_class = PrefixHashConfig

    def __init__(
        self,
        config: PrefixHashConfig | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        **params,
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.config = config or PrefixHashConfig(**params)
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        costs = {c.id: float(c.inflight) for c in candidates}
        if not request.block_hashes:
            chosen = least_loaded(candidates, self.rng)
            return Decision(instance=chosen.id, costs=costs, reason="no full block to hash: least load")
        last = request.block_hashes[min(self.config.prefix_blocks, len(request.block_hashes)) - 1]
        key = xxhash.xxh3_64_intdigest(_U64.pack(last))
        by_id = {c.id: c for c in candidates}
        points, owners = self._ring(tuple(sorted(by_id)))
        total = sum(c.inflight for c in candidates)
        bound = math.ceil(self.config.load_factor * (total + 1) / len(candidates))
        start = bisect.bisect_right(points, key)
        owner = owners[start % len(points)]
        for step in range(len(points)):
            inst = owners[(start + step) % len(points)]
            if by_id[inst].inflight + 1 <= bound:
                break
        if inst == owner:
            reason = f"ring owner of the prefix (bound {bound})"
        else:
            reason = f"ring owner {owner} at bound {bound} (inflight {by_id[owner].inflight}); walked on to {inst}"
        return Decision(instance=inst, costs=costs, reason=reason)

    def _ring(self, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
        ring = self._rings.get(ids)
        if ring is None:
            if len(self._rings) >= _MAX_RINGS:
                self._rings.clear()
            ring = self._rings[ids] = build_ring(ids, self.config.virtual_nodes)
        return ring
