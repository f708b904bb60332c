"""How likely a cached block is to be asked for again, given how long it has been idle.

Learned from the block chains this router routes (`observe`, from the policy's
`on_routed`): the router's own hit history. Like SHARDS (Waldspurger et al.,
FAST '15) it follows a fixed spatial sample of the blocks -- those whose hash is
divisible by `sample` -- so the work per request is a few dict operations.

Each sampled block's requests cut its life into intervals: a gap from one request
to the next (the block was reused after `gap` idle seconds), or an interval that
is still open (idle so far, `open`), or one that ended without reuse (idle for
longer than `window_s`, or pushed out by `capacity`). With every interval weighted
by its start time (half-life `halflife_s`, so the estimate follows a changing
workload), the chance that a block idle for `a` seconds is requested again is the
actuarial (Kaplan-Meier style) estimate

    reuse(a) = reused_after(a) / (reused_after(a) + open_older(a) + never)

where reused_after(a) weighs the gaps longer than a, open_older(a) the open
intervals already idle longer than a (they may still be reused: censored), and
never the ones that ended unused. No history means no known value: 0.

`table()` holds reuse at `EDGES` (log-spaced idle times), rebuilt once `refresh_s`
has passed since the last build or `observe` has seen `refresh_after` new sampled
blocks, so a decision reads it with one logarithm per lookup (`curve`).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from collections.abc import Callable, Sequence

from kvroute.router.contract.idle_ages import IdleAges

EDGES = tuple(10 ** (k / 8) for k in range(-24, 41))  # 1 ms .. 100,000 s, 8 bins a decade
_LOG_STEP = math.log(10) / 8
_RENORMALISE = 64.0  # half-lives after which every weight is rescaled (keeps them finite)


class ReuseHistory:
    """reuse(idle seconds) -> the chance of another request, from the sampled blocks' history."""

    def __init__(self, sample: int = 8, window_s: float = 600.0, halflife_s: float = 300.0,
                 capacity: int = 200_000, refresh_s: float = 0.5, refresh_after: int = 256) -> None:
        if sample < 1 or window_s <= 0 or halflife_s <= 0 or capacity < 1:
            raise ValueError("sample and capacity must be >= 1, window_s and halflife_s positive")
        self.sample, self.window_s, self.halflife_s, self.capacity = sample, window_s, halflife_s, capacity
        self.refresh_s, self.refresh_after = refresh_s, refresh_after
        self._seen: collections.OrderedDict[int, float] = collections.OrderedDict()  # hash -> last request
        self._open = IdleAges()
        self._gaps = [0.0] * (len(EDGES) + 1)  # weight of reuse gaps per bin: < EDGES[0], [EDGES[k], EDGES[k+1])
        self._never = 0.0
        self._t0 = math.nan  # weights are 2 ** ((start - t0) / halflife_s); nan: nothing observed yet
        self._table: list[float] = [0.0] * len(EDGES)
        self._built_at = -math.inf
        self._fresh = 0
        self._curve: tuple[list[float], Callable[[float], float]] | None = None  # (table, reuse over it)

    def _weight(self, start: float) -> float:
        return 2.0 ** ((start - self._t0) / self.halflife_s)

    def observe(self, hashes: Sequence[int], now: float) -> None:
        """A request for this block chain was routed at `now`."""
        if math.isnan(self._t0):  # the first observation
            self._t0 = now
        sample, seen, gaps = self.sample, self._seen, self._gaps
        sampled = list(dict.fromkeys([h for h in hashes if not h % sample]))  # a hash twice counts once
        if sampled:
            ended: dict[float, int] = {}  # previous request time -> sampled blocks last requested then
            pop = seen.pop
            for h in sampled:
                last = pop(h, None)
                if last is not None:
                    ended[last] = ended.get(last, 0) + 1
                seen[h] = now
            for last, n in ended.items():  # a chain's blocks were mostly requested together: few times
                self._open.remove(last, n)
                gaps[bisect.bisect_right(EDGES, now - last)] += n * self._weight(last)
            self._open.add(now, len(sampled))
            self._fresh += len(sampled)
        while seen:
            h, last = next(iter(seen.items()))
            if now - last <= self.window_s and len(seen) <= self.capacity:
                break
            del seen[h]
            self._open.remove(last)
            self._never += self._weight(last)
        if (now - self._t0) / self.halflife_s > _RENORMALISE:
            self._rescale(now)

    def _rescale(self, now: float) -> None:
        factor = self._weight(now) ** -1
        self._gaps = [g * factor for g in self._gaps]
        self._never *= factor
        self._t0 = now

    def reuse(self, idle_s: float, now: float) -> float:
        """The chance that a block idle for `idle_s` seconds is requested again (0 without history)."""
        return self.curve(now)(idle_s)

    def curve(self, now: float) -> Callable[[float], float]:
        """reuse(idle_s) as of `now`, for many lookups in one decision."""
        table = self.table(now)
        if self._curve is not None and self._curve[0] is table:  # the same table: the same curve
            return self._curve[1]
        first, last, log, per_step = EDGES[0], len(EDGES) - 1, math.log, 1.0 / _LOG_STEP
        head, tail = table[0], table[-1]

        def reuse(idle_s: float) -> float:  # linear between the edges, in log(idle)
            if idle_s <= first:
                return head
            x = log(idle_s / first) * per_step
            k = int(x)
            if k >= last:
                return tail
            return table[k] + (table[k + 1] - table[k]) * (x - k)

        self._curve = (table, reuse)
        return reuse

    def table(self, now: float) -> list[float]:
        """reuse() at every idle time in EDGES."""
        if not math.isnan(self._t0) and (now - self._built_at >= self.refresh_s or self._fresh >= self.refresh_after):
            self._table = self._build(now)
            self._built_at, self._fresh = now, 0
        return self._table

    def _build(self, now: float) -> list[float]:
        # the open intervals, longest idle first (the profile is oldest first); older[j]: the weight
        # of the first j, so at each edge the weight idle longer than it is one lookup away
        opened = self._open.profile(now)
        older = [0.0, *itertools.accumulate(n * self._weight(now - idle) for n, idle in opened)]
        j = len(opened)
        out, later = [], sum(self._gaps[1:])
        for k, edge in enumerate(EDGES):
            while j and opened[j - 1][1] <= edge:
                j -= 1
            at_risk = later + self._never + older[j]
            out.append(later / at_risk if at_risk > 0 else 0.0)
            later -= self._gaps[k + 1]
        return out
