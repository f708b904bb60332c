"""Cold recovery: load a missing prefix run from the host pool or the store, or recompute it.

For the blocks of a prompt that the device pool lacks, the block manager finds the
runs the other tiers hold (host, then store, in prompt order) and asks `choose`
how many to load: the prefix of runs whose predicted load time plus the
recompute of the rest is lowest (`router.contract.tier_costs.plan_runs`, the same formula
the router credits with). Load time comes from each link's online estimate
(bytes / measured bandwidth + latency), recompute time from the measured prefill
rate; a torch engine starts both from what it measured on its device before serving
(`use_measured`: engine/runners/device_costs.py, the store's links in tier_service.py).
`costs()` is what the engine advertises at GET /kv/info and /load.

Counters of the choices (runs and blocks, by "load_host", "load_remote" and
"recompute") are kept here for the metrics and for `kvroute bench --tiers`.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from kvroute.engine.kv.link_estimate import LinkEstimate, RateEstimate
from kvroute.router.contract.tier_costs import LINK_NAMES, Link, TierCosts, plan_runs

CHOICES = ("load_host", "load_remote", "recompute")


class Recovery:
    def __init__(self, priors: Mapping[str, Link], prefill_rate: float, block_size: int, bytes_per_block: int,
                 has_host: bool, store_key: str = "") -> None:
        missing = [name for name in LINK_NAMES if name not in priors]
        if missing:
            raise ValueError(f"no prior figures for links {', '.join(missing)}")
        self.links = {name: LinkEstimate(priors[name]) for name in LINK_NAMES}
        self.prefill = RateEstimate(prefill_rate)
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.has_host = has_host
        self.store_key = store_key
        self.runs: collections.Counter[str] = collections.Counter()
        self.blocks: collections.Counter[str] = collections.Counter()

    def use_measured(self, links: Mapping[str, Link], prefill_tokens_per_s: float | None = None) -> None:
        """Figures measured on this device (at start-up) replace the starting ones; estimates go on from them."""
        for name, link in links.items():
            self.links[name] = LinkEstimate(link)
        if prefill_tokens_per_s:
            self.prefill = RateEstimate(prefill_tokens_per_s)

    def costs(self) -> TierCosts:
        return TierCosts(self.bytes_per_block, {n: e.link for n, e in self.links.items()}, self.has_host,
                         self.store_key)

    def choose(self, runs: Sequence[tuple[str, int]]) -> int:
        """How many of the cached runs (tier, blocks) after the device prefix to load."""
        if not runs:
            return 0
        costs = self.costs()
        load, _ = plan_runs(runs, costs.load_time, self.prefill.seconds_per_token * self.block_size)
        return load

    def record(self, runs: Sequence[tuple[str, int]], loaded: int) -> None:
        """Count an admitted request's choice per run."""
        for i, (tier, n) in enumerate(runs):
            choice = f"load_{tier}" if i < loaded else "recompute"
            self.runs[choice] += 1
            self.blocks[choice] += n

    def observe(self, link: str, nbytes: float, seconds: float) -> None:
        self.links[link].observe(nbytes, seconds)

    def to_wire(self, host: Mapping | None = None) -> dict:
        """The `kv_tiers` object of /kv/info and /load (router/contract/tier_costs.py)."""
        out: dict = {"bytes_per_block": self.bytes_per_block,
                     "links": {n: e.link.to_dict() for n, e in self.links.items()},
                     "prefill_tokens_per_s": self.prefill.rate}
        if host is not None:
            out["host"] = dict(host)
        if self.store_key:
            out["remote"] = {"store": self.store_key}
        return out
