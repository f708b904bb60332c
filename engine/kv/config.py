"""The KV tiers' settings (engine/kv, docs/tiers.md), declared once (router/contract/settings.py).
Without host blocks and a store the engine has its device pool only."""

from __future__ import annotations

import dataclasses

from kvroute.engine.kv.links import LINKS
from kvroute.engine.kv.store import check_url
from kvroute.engine.kv.tiers import STORE_WRITE_MODES
from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE
from kvroute.router.contract.settings import check_settings, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class TierConfig:
    """KV tiers (engine/kv, docs/tiers.md)"""

    host_blocks: int = setting(0, "KV blocks in a host-memory pool (pinned on CUDA) that keeps blocks evicted from "
                                  "the device (0 = off)", check=NOT_NEGATIVE)
    kv_store: str | None = setting(None, "shared K/V store: redis://host:port/db or file:///dir")
    kv_store_id: str = setting("", "engines with the same id share the store's blocks",
                               default_text="the URL without credentials")
    kv_store_write: str = setting("through", "through: a prompt's blocks after its prefill; evict: blocks leaving the "
                                             "last local tier", choices=STORE_WRITE_MODES)
    kv_store_timeout_s: float = setting(0.1, "a store lookup or read waits at most this long before the engine "
                                             "recomputes", check=POSITIVE)
    kv_load_budget_bytes: int = setting(0, "K/V bytes loaded into the device per step", check=NOT_NEGATIVE,
                                        default_text="0: what the host link moves in 20 ms")
    kv_host_link: str = setting("", "host link figures to start from (sim backend: to model)", choices=tuple(LINKS),
                                default_text="by device")
    kv_store_link: str = setting("", "store link figures to start from (sim backend: to model)", choices=tuple(LINKS),
                                 default_text="by store scheme")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.kv_store is not None:
            check_url(self.kv_store)
