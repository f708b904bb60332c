"""What a request can reuse: device blocks, then blocks to load from the host pool and the store."""

from __future__ import annotations

import dataclasses

from kvroute.engine.core.kv_copies import HostEntry, StoredBlock


@dataclasses.dataclass(slots=True)
class PrefixHit:
    """The prefix a request can reuse: device blocks, then blocks to load from the host and the store."""

    device: list[int] = dataclasses.field(default_factory=list)  # device block ids
    host: list[HostEntry] = dataclasses.field(default_factory=list)
    remote: list[StoredBlock] = dataclasses.field(default_factory=list)
    order: list[str] = dataclasses.field(default_factory=list)  # tier of each loaded block, in prompt order
    runs: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # every cached run after the device
    loaded_runs: int = 0

    def __len__(self) -> int:
        return len(self.device) + len(self.order)

    @property
    def num_loads(self) -> int:
        return len(self.order)

    def tokens_by_tier(self, block_size: int) -> dict[str, int]:
        return {"device": len(self.device) * block_size, "host": len(self.host) * block_size,
                "remote": len(self.remote) * block_size}
