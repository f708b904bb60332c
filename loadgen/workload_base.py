"""What every workload produces: a deterministic list of request specs.

A workload is built from its frozen config and a seed; `requests()` returns the
same specs every time. Prompts are token ids of the built-in tokenizer's
vocabulary (the client sends them as text or as token ids, see loadgen/client.py).
Arrival times come from an arrival process (loadgen/arrivals.py) unless the
workload fixes them (trace replay) or chains them (multi-turn: a turn is sent
`think_s` after the previous turn of its session has finished).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    group: str = ""  # shared-prefix group, document, session... (for analysis)
    arrival_s: float | None = None  # fixed send time from the start (trace replay); None = arrival process
    after: int | None = None  # index of the request this one must follow (multi-turn)
    think_s: float = 0.0  # delay after `after` finished
    adapter: str = ""  # the LoRA adapter to send as `model` ("": the base model; loadgen/adapters.py)


class Workload(Protocol):
    name: str

    def requests(self) -> list[RequestSpec]:
        """All requests, in index order (index == position)."""
        ...

    def info(self) -> dict:
        """The knobs and any scaling applied (reported as `workload_info` in summaries)."""
        ...
