"""A bounded TTL table of block prefixes recently routed to each instance.

Block hash -> {instance: expiry}. `kv_aware` keeps one with a short TTL for
*pending* blocks (sent to an instance, not yet reported by its KV events);
`approx_kv` keeps one with a long TTL as its whole, self-learned, index.

Blocks are always a prompt's hash chain from its first block, and a chained hash
commits to every block before it, so whatever was recorded for an instance is closed
under prefixes: if it holds block j of a chain, it holds blocks 0..j-1 with expiries
at least as late. `record` keeps that true under eviction too, by touching a chain's
blocks last to first (leading blocks are the most recently used). So `match` finds
each instance's consecutive prefix by binary search: O(instances on block 0 x log
len(blocks)) dict lookups, and `record` is O(len(blocks)).

A prompt's new tail (every block from the first one the table lacks) is added in one
C-level `update`, last block first, all its blocks sharing one `_Shared` entry, so a
prompt nobody has sent before costs no Python step and no allocation per block; the
blocks already known (a seen system prompt, a hot prefix) are touched one by one, as
before, a shared entry first copied for the block it belongs to. Shared entries hold
one instance and are never changed in place (`withdraw` and `forget` delete a one-instance
entry rather than emptying it). The boundary is found by binary search, since the known
blocks of a chain are a leading run, and checked: if they are not (a hole `withdraw`
left), every block is touched one by one.

Entries sit in an OrderedDict in least-recently-recorded order; since every record
uses the same TTL, the front entry always has the earliest expiry, so each call pops
at most `purge_per_call` expired entries from the front (bounded work, amortized
O(1)), and none looks before the front entry's expiry (`withdraw` may make an entry
expire sooner; `match` checks every expiry it reads, so such an entry only waits for
its turn), and an insert beyond `capacity` evicts the least recently recorded entry
whether or not it has expired.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from itertools import repeat


class _Shared(dict):
    """The one entry every block of a bulk add points at: never changed in place."""

    __slots__ = ()


def _drop(table: OrderedDict[int, dict[str, float]], h: int, entry: dict[str, float], instance: str) -> None:
    """`instance` leaves block `h`'s entry (which holds it): a one-instance entry (shared ones
    are) is deleted whole, never emptied under the other blocks that share it."""
    if len(entry) == 1:
        del table[h]
    else:
        del entry[instance]


class RecentBlocks:
    """Block hash -> {instance: expiry}, with a TTL and a capacity in block entries."""

    def __init__(self, ttl_s: float, capacity: int, purge_per_call: int = 64) -> None:
        if ttl_s <= 0:
            raise ValueError(f"the TTL of recently routed blocks must be positive, got {ttl_s}")
        if capacity < 1:
            raise ValueError(f"the capacity of recently routed blocks must be at least 1, got {capacity}")
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.purge_per_call = purge_per_call
        self._table: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._purge_at = -math.inf  # no purge finds anything expired before this (entries touched later expire later)

    def __len__(self) -> int:
        return len(self._table)

    def record(self, instance: str, blocks: Sequence[int], now: float) -> None:
        """Remember that `blocks` were routed to `instance` at `now`."""
        self._purge(now)
        table = self._table
        get, move = table.get, table.move_to_end
        expiry = now + self.ttl_s
        k = self._new_tail(blocks)
        if k < len(blocks):  # blocks[k:] are all new: added last to first, as the loop below would
            tail, size = blocks[k:], len(table)
            table.update(zip(reversed(tail), repeat(_Shared({instance: expiry}))))
            if len(table) - size < len(tail):  # a block twice in the tail: touched again in order
                for h in reversed(tail):
                    move(h)
            blocks = blocks[:k]
        for h in reversed(blocks):  # leading blocks touched last, so evicted last
            entry = get(h)
            if entry is None:
                table[h] = {instance: expiry}
            else:
                if entry.__class__ is _Shared:  # this block's own entry from now on
                    entry = table[h] = dict(entry)
                entry[instance] = expiry
                move(h)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def _new_tail(self, blocks: Sequence[int]) -> int:
        """Where the blocks the table lacks begin, if from there on it lacks every one; else len(blocks)."""
        table, n = self._table, len(blocks)
        if not n or blocks[-1] in table:
            return n
        lo, hi = 0, n - 1  # blocks[hi] is new; find the first of the new tail, if known blocks lead
        while lo < hi:
            mid = (lo + hi) // 2
            if blocks[mid] in table:
                lo = mid + 1
            else:
                hi = mid
        return lo if table.keys().isdisjoint(blocks[lo:]) else n

    def match(self, blocks: Sequence[int], now: float) -> dict[str, int]:
        """Per instance, how many leading blocks of `blocks` it was recently sent (0s omitted)."""
        self._purge(now)
        table = self._table
        first = table.get(blocks[0]) if blocks else None
        if not first:
            return {}
        out: dict[str, int] = {}
        get, n = table.get, len(blocks)
        for inst, expiry in first.items():
            if expiry <= now:
                continue
            lo, hi = 1, n  # blocks[lo - 1] is held; the answer lies in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                entry = get(blocks[mid - 1])
                if entry is not None and entry.get(inst, 0.0) > now:
                    lo = mid
                else:
                    hi = mid - 1
            out[inst] = lo
        return out

    def withdraw(self, instance: str, blocks: Sequence[int]) -> None:
        """`blocks` will not reach `instance` after all (the attempt failed): no pending credit."""
        table = self._table
        for h in blocks:
            entry = table.get(h)
            if entry is not None and instance in entry:
                _drop(table, h, entry, instance)

    def forget(self, instance: str) -> None:
        """Drop everything recorded for `instance` (O(table); for rare events like a restart)."""
        table = self._table
        for h, entry in list(table.items()):
            if instance in entry:
                _drop(table, h, entry, instance)

    def _purge(self, now: float) -> None:
        if now < self._purge_at:  # the front entry expires later, and every other one no sooner
            return
        table = self._table
        for _ in range(self.purge_per_call):
            if not table:
                return
            h, entry = next(iter(table.items()))
            latest = max(entry.values())
            if latest > now:
                self._purge_at = latest
                return
            del table[h]
