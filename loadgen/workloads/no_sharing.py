"""random: independent random prompts with no shared content at all (the control).

Every prompt starts with a distinct token, so no two requests share even their
first block; the default length matches shared-prefix's (1024 + 64). With
`min_input_tokens` / `min_output_tokens` set, lengths are drawn uniformly between
the minimum and `input_tokens` / `output_tokens`: long prompts and long outputs
mixed, the shape that makes prefill stall decode (the disaggregation benchmark).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, distinct_start


@dataclasses.dataclass(frozen=True)
class RandomConfig:
    num_requests: int = 200
    input_tokens: int = 1088
    output_tokens: int = 32
    min_input_tokens: int = 0  # 0: every prompt has input_tokens
    min_output_tokens: int = 0  # 0: every output has output_tokens

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests)
        check_int("input_tokens", self.input_tokens)
        check_int("output_tokens", self.output_tokens)
        for low, high in (("min_input_tokens", "input_tokens"), ("min_output_tokens", "output_tokens")):
            if not 0 <= getattr(self, low) <= getattr(self, high):
                raise ValueError(f"{low} must be between 0 and {high}, got {getattr(self, low)}")


class RandomWorkload:
    name = "random"

    def __init__(self, config: RandomConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 4])
        used: set[int] = set()

        def length(low: int, high: int) -> int:
            return int(rng.integers(low, high + 1)) if low else high

        return [RequestSpec(index=i, prompt_ids=distinct_start(rng, length(c.min_input_tokens, c.input_tokens), used),
                            max_tokens=length(c.min_output_tokens, c.output_tokens), group=f"req-{i}")
                for i in range(c.num_requests)]

    def info(self) -> dict:
        return {"workload": self.name, "seed": self.seed, **dataclasses.asdict(self.config)}
