"""What routing lost, and why: the routing-loss split, one request at a time.

For each routed request three figures, in prompt tokens an engine can serve from its cache
(whole blocks, leaving at least the prompt's last token to compute, as kvroute and vLLM
engines do):

    best       the longest cached prefix any candidate held at decision time, by the index
    predicted  the chosen instance's, by the index
    served     what the engine reported (usage.prompt_tokens_details.cached_tokens)

and the prompt's tokens split into what was served from cache and what was lost, by cause:

    lost to the workload   prompt - best       no instance held more (nothing cached anywhere)
    lost to balancing      best - predicted    a better-cached instance was passed over for load
    lost to the index      predicted - served  the index predicted a hit the engine did not serve
                                               (`unserved`), or the reverse (`unpredicted`: the
                                               engine served what the index did not know of)

so that prompt = served + workload + balancing + index, request by request. The router keeps
it online (router/service/routing_loss.py: /router/stats, metrics), and `kvroute loadgen` and
`kvroute sim` report it from their records (loadgen/summary.py), so one arithmetic serves all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from kvroute.router.contract.tier_costs import TierCosts
from kvroute.router.decision.scoring.tier_credit import with_store
from kvroute.router.index.base import PrefixMatch

CAUSES = ("workload", "balancing", "index")


def servable(blocks: int, num_tokens: int, block_size: int) -> int:
    """Cached tokens an engine can serve from `blocks` cached blocks of a `num_tokens` prompt."""
    if num_tokens <= 0 or blocks <= 0:
        return 0
    return min(blocks, (num_tokens - 1) // block_size) * block_size


def held_blocks(instance: str, matches: Mapping[str, PrefixMatch], costs: TierCosts | None) -> int:
    """The prefix blocks an instance holds by the index, its shared store's included (tier_credit.py)."""
    return sum(with_store(matches.get(instance), matches, costs).values())


def best_and_predicted(held: Iterable[tuple[str, int]], chosen: str, num_tokens: int,
                       block_size: int) -> tuple[int, int]:
    """(best, predicted) of a decision: `held` is (instance id, prefix blocks it holds) per candidate
    whose cache can be credited."""
    best = predicted = 0
    for inst, blocks in held:
        tokens = servable(blocks, num_tokens, block_size)
        if tokens > best:
            best = tokens
        if inst == chosen:
            predicted = tokens
    return best, predicted


class LossSample(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    best: int
    predicted: int
    served: int


class LossSplit:
    """Sums of samples; `shares()` the split as shares of the prompt tokens."""

    __slots__ = ("requests", "prompt", "best", "predicted", "served", "unserved", "unpredicted")

    def __init__(self) -> None:
        self.requests = self.prompt = self.best = self.predicted = self.served = 0
        self.unserved = self.unpredicted = 0

    def add(self, s: LossSample) -> None:
        self.requests += 1
        self.prompt += s.prompt_tokens
        self.best += s.best
        self.predicted += s.predicted
        self.served += s.served
        if s.predicted > s.served:
            self.unserved += s.predicted - s.served
        else:
            self.unpredicted += s.served - s.predicted

    def lost(self) -> dict[str, int]:
        """Tokens lost by cause (the index's is net: unserved - unpredicted)."""
        return {"workload": self.prompt - self.best, "balancing": self.best - self.predicted,
                "index": self.predicted - self.served}

    def shares(self) -> dict:
        p = self.prompt
        out: dict = {"requests": self.requests, "prompt_tokens": p}
        if not p:
            return out
        out.update(cached=self.served / p, best=self.best / p, predicted=self.predicted / p)
        out.update({f"lost_to_{cause}": n / p for cause, n in self.lost().items()})
        out.update(index_unserved=self.unserved / p, index_unpredicted=self.unpredicted / p)
        return out


def split(samples: Iterable[LossSample]) -> dict:
    total = LossSplit()
    for s in samples:
        total.add(s)
    return total.shares()


def gap_by_cause(policy: Mapping, reference: Mapping) -> dict | None:
    """How a policy's cached share falls short of a reference's (another run, e.g. the oracle's), by
    cause: the difference of their losses; they add up to the gap (None without both splits)."""
    if "cached" not in policy or "cached" not in reference:
        return None
    out = {cause: policy[f"lost_to_{cause}"] - reference[f"lost_to_{cause}"] for cause in CAUSES}
    out["gap"] = reference["cached"] - policy["cached"]
    return out
