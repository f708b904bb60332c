"""Build an engine's lower tiers from its config: `CacheTiers` with priors, namespace and store key.

Shared by the engine (engine/service/llm_engine.py) and the simulator (loadgen/sim/instance.py),
so both run the same tiers with the same figures. Prior link figures (what the
estimators start from, and what the sim runner models) come from
`engine/kv/links.py` LINKS: `--kv-host-link` / `--kv-store-link`, else by device type and
store URL scheme.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from kvroute.engine.core.work import RunnerInfo
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.links import DEFAULT_HOST_LINK, DEFAULT_STORE_LINK, LINKS
from kvroute.engine.kv.recovery import Recovery
from kvroute.engine.kv.store.base import default_store_id, layout_namespace, store_key
from kvroute.engine.kv.tiers import CacheTiers
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tier_costs import Link


@dataclasses.dataclass(frozen=True, kw_only=True)
class TierSite:
    """What the tiers need of the engine they serve, beyond their own section."""

    model: str  # the served model's name (the store's namespace)
    block_size: int
    device: str = "cpu"  # the host link's figures by default
    time_scale: float = 1.0  # the sim runner's modelled times are scaled by it (1.0 for real runners)


def host_link_name(tiers: TierConfig, device: str) -> str:
    return tiers.kv_host_link or DEFAULT_HOST_LINK.get(device.split(":")[0], "pcie4")


def store_link_name(tiers: TierConfig) -> str:
    scheme = urlsplit(tiers.kv_store).scheme if tiers.kv_store else "redis"
    return tiers.kv_store_link or DEFAULT_STORE_LINK.get(scheme, "cpu-redis")


def namespace(site: TierSite, info: RunnerInfo) -> str:
    return layout_namespace(site.model, info.dtype, site.block_size, info.num_layers, info.num_kv_heads, info.head_dim,
                            hash_seed(site.model))


def engine_store_key(tiers: TierConfig, site: TierSite, info: RunnerInfo) -> str:
    """Store id + layout namespace, or "" without a store."""
    if not tiers.kv_store:
        return ""
    return store_key(tiers.kv_store_id or default_store_id(tiers.kv_store), namespace(site, info))


def build_tiers(tiers: TierConfig, site: TierSite, info: RunnerInfo, bytes_per_block: int, prefill_rate: float,
                store: str | None = None) -> CacheTiers | None:
    """The engine's tiers, or None with neither a host pool nor a store. `store` overrides the store key."""
    key = engine_store_key(tiers, site, info) if store is None else store
    if not tiers.host_blocks and not key:
        return None
    ts = site.time_scale
    host, remote = (Link(bw / ts, latency * ts) for bw, latency in (LINKS[host_link_name(tiers, site.device)],
                                                                    LINKS[store_link_name(tiers)]))
    priors = {"h2d": host, "d2h": host, "store_read": remote, "store_write": remote}
    recovery = Recovery(priors, prefill_rate, site.block_size, bytes_per_block, tiers.host_blocks > 0, key)
    return CacheTiers(recovery, tiers.host_blocks, tiers.kv_store_write if key else None,
                      tiers.kv_load_budget_bytes)
