"""Build an engine's lower tiers from its config: `CacheTiers` with priors, namespace and store key.

Shared by the engine (engine/service/llm_engine.py) and the simulator (loadgen/sim/instance.py),
so both run the same tiers with the same figures. Prior link figures (what the
estimators start from, and what the sim runner models) come from
`engine/kv/links.py` LINKS: `--kv-host-link` / `--kv-store-link`, else by device type and
store URL scheme.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kvroute.engine.core.work import RunnerInfo
from kvroute.engine.kv.links import DEFAULT_HOST_LINK, DEFAULT_STORE_LINK, LINKS
from kvroute.engine.kv.recovery import Recovery
from kvroute.engine.kv.store.base import default_store_id, layout_namespace, store_key
from kvroute.engine.kv.tiers import CacheTiers
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tier_costs import Link

if TYPE_CHECKING:  # the engine's config sits above its parts: they read its fields, and name it only here
    from kvroute.engine.config import EngineConfig


def host_link_name(config: EngineConfig) -> str:
    return config.kv_host_link or DEFAULT_HOST_LINK.get(config.device.split(":")[0], "pcie4")


def store_link_name(config: EngineConfig) -> str:
    scheme = urlsplit(config.kv_store).scheme if config.kv_store else "redis"
    return config.kv_store_link or DEFAULT_STORE_LINK.get(scheme, "cpu-redis")


def model_name(config: EngineConfig, info: RunnerInfo) -> str:
    return config.served_model_name or info.model


def namespace(config: EngineConfig, info: RunnerInfo) -> str:
    name = model_name(config, info)
    return layout_namespace(name, info.dtype, config.block_size, info.num_layers, info.num_kv_heads, info.head_dim,
                            hash_seed(name))


def engine_store_key(config: EngineConfig, info: RunnerInfo) -> str:
    """Store id + layout namespace, or "" without a store."""
    if not config.kv_store:
        return ""
    return store_key(config.kv_store_id or default_store_id(config.kv_store), namespace(config, info))


def build_tiers(config: EngineConfig, info: RunnerInfo, bytes_per_block: int, prefill_rate: float,
                store: str | None = None) -> CacheTiers | None:
    """The engine's tiers, or None with neither a host pool nor a store. `store` overrides the store key."""
    key = engine_store_key(config, info) if store is None else store
    if not config.host_blocks and not key:
        return None
    ts = config.time_scale  # the sim runner's modelled times are scaled by it (1.0 for real runners)
    host, remote = (Link(bw / ts, latency * ts) for bw, latency in (LINKS[host_link_name(config)],
                                                                    LINKS[store_link_name(config)]))
    priors = {"h2d": host, "d2h": host, "store_read": remote, "store_write": remote}
    recovery = Recovery(priors, prefill_rate, config.block_size, bytes_per_block, config.host_blocks > 0, key)
    return CacheTiers(recovery, config.host_blocks, config.kv_store_write if key else None,
                      config.kv_load_budget_bytes)
