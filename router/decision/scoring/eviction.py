"""What a placement costs the cache: the cached blocks it evicts that would have been used again.

An instance allocates `need` fresh blocks for a request's uncached tokens, after the
`ahead` blocks that requests already sent there will take. Allocation uses the
engine's free blocks (`kv_free_blocks`) first, then evicts cached blocks in LRU
order (`kv_evictable`: (blocks, idle seconds), next evicted first). So the request's
victims are LRU depths

    [max(ahead - free, 0), max(ahead + need - free, 0))

and each victim counts reuse(idle), the chance that a block idle that long is asked
for again (reuse.py), its idle time aged by the time since the engine measured it.
Depths beyond the evictable blocks are blocks in use: the allocation would wait or
preempt, which costs at least as much as losing the block, so each counts 1.
An engine that reports no profile (`kv_free_blocks` < 0) costs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable

from kvroute.router.decision.base import InstanceState


def expected_loss(state: InstanceState, need: int, ahead: int, now: float,
                  reuse: Callable[[float], float]) -> float:
    """Expected number of evicted blocks that would have been reused, for `need` blocks after `ahead`.

    Written without min/max calls: it runs once per candidate per decision.
    """
    free = state.kv_free_blocks
    if free < 0 or need <= 0:
        return 0.0
    start = ahead - free
    end = start + need
    if end <= 0:
        return 0.0
    if start < 0:
        start = 0
    stale = now - state.kv_measured_at
    if stale < 0.0:
        stale = 0.0
    loss, depth = 0.0, 0
    for blocks, idle in state.kv_evictable:
        deeper = depth + blocks
        if deeper > start:
            lo = start if start > depth else depth
            if deeper >= end:
                return loss + (end - lo) * reuse(idle + stale)
            loss += (deeper - lo) * reuse(idle + stale)
        depth = deeper
    return loss + end - (start if start > depth else depth)
