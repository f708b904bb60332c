"""How many blocks' worth of prefill a candidate's cached prefix saves, tier by tier.

A device block saves all of its compute. A host or remote block must first be
loaded, so it saves its compute minus its load time, from the figures the engine
advertises (router/contract/tier_costs.py: measured bandwidth and latency per link), and
only the runs the engine itself would load (`plan_runs`: the same decision the
engine makes, engine/kv/recovery.py). The credit is in blocks of compute:

    credit = device_blocks + time_saved_by_lower_tiers / compute_s_per_block

with compute_s_per_block = block_size / prefill_rate (the policy's learned rate).
An engine that advertises nothing (older kvroute, other engines) gets the fixed
fractions instead (`fallback`: device 1.0, host and remote as configured, e.g.
Dynamo's 1.0 / 0.75 / 0.25); `measured=False` uses those for everyone.

Blocks in a shared store are indexed once, under the store's owner key
(`router.contract.tier_costs.store_owner`), and count for every candidate that advertises
that store key: past the candidate's own prefix, the store's prefix extends it
with remote blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from kvroute.router.contract.tier_costs import TierCosts, plan_runs, store_owner
from kvroute.router.index.base import PrefixMatch

LOWER_TIERS = ("host", "remote")


class TierCredit(msgspec.Struct, frozen=True):
    """One candidate's cached prefix by tier and what it is worth."""

    blocks_by_tier: Mapping[str, int]
    saved_s_by_tier: Mapping[str, float]
    credit: float  # blocks of compute saved


def with_store(match: PrefixMatch | None, matches: Mapping[str, PrefixMatch], costs: TierCosts | None) -> dict:
    """A candidate's blocks by tier, extended by its shared store's prefix past its own."""
    by_tier = dict(match.by_tier) if match is not None else {}
    if costs is not None and costs.store:
        store = matches.get(store_owner(costs.store))
        own = sum(by_tier.values())
        if store is not None and store.blocks > own:
            by_tier["remote"] = by_tier.get("remote", 0) + store.blocks - own
    return by_tier


def tier_credit(by_tier: Mapping[str, int], costs: TierCosts | None, compute_s_per_block: float,
                fallback: Mapping[str, float], measured: bool = True) -> TierCredit:
    device = by_tier.get("device", 0) * fallback.get("device", 1.0)
    saved = {"device": device * compute_s_per_block}
    if measured and costs is not None:
        runs = [(t, by_tier[t]) for t in LOWER_TIERS if by_tier.get(t)]  # host before remote, as engines walk
        loaded, _ = plan_runs(runs, costs.load_time, compute_s_per_block)
        for i, (tier, n) in enumerate(runs):
            t = costs.load_time(tier, n) if i < loaded else None
            saved[tier] = max(0.0, n * compute_s_per_block - t) if t is not None else 0.0
        credit = device + sum(saved[t] for t, _ in runs) / compute_s_per_block
    else:
        credit = device
        for tier in LOWER_TIERS:
            n = by_tier.get(tier, 0)
            if n:
                saved[tier] = n * fallback.get(tier, 0.0) * compute_s_per_block
                credit += n * fallback.get(tier, 0.0)
    return TierCredit(dict(by_tier), saved, credit)
