"""What the load generator measures about one request (also what the cluster simulator produces).

Times are seconds; `send_s` is relative to the start of the run. A request is ok
when the HTTP status was 200 and the stream carried no error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(slots=True)
class RequestRecord:
    index: int
    group: str = ""
    send_s: float = 0.0  # when it was sent, from the start of the run
    planned_s: float | None = None  # when the schedule wanted it sent (send_s - planned_s = load generator lag)
    ttft_s: float | None = None  # to the first non-empty content chunk
    e2e_s: float | None = None  # to the end of the stream (or the error)
    itl_s: list[float] = dataclasses.field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None = not reported
    cached_tokens_by_tier: dict | None = None  # usage...cached_tokens_by_tier (kvroute): device/host/remote
    output_digest: str = ""  # xxh3 of the generated text (compare outputs across runs without storing them)
    output_tokens: int = 0  # usage.completion_tokens, else the number of content chunks
    instance: str = ""  # x-kvroute-instance response header
    # the router's routing-loss figures (x-kvroute-best-cached-tokens, x-kvroute-predicted-cached-tokens; the
    # simulator's own): the best cached prefix any candidate held and the chosen one's, by the index
    best_cached_tokens: int | None = None
    predicted_cached_tokens: int | None = None
    status: int = 0  # HTTP status; 0 = no response
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None with fewer than 2 output tokens."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def end_s(self) -> float:
        return self.send_s + (self.e2e_s or 0.0)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["tpot_s"] = self.tpot_s
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def as_record(item: RequestRecord | Mapping[str, Any]) -> RequestRecord:
    return item if isinstance(item, RequestRecord) else RequestRecord.from_dict(item)
