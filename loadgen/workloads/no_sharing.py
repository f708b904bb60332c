"""random: independent random prompts with no shared content at all (the control).

Every prompt starts with a distinct token, so no two requests share even their
first block; the default length matches shared-prefix's (1024 + 64).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from loadgen.workload_base import RequestSpec
from loadgen.workloads.content import check_int, distinct_start


@dataclasses.dataclass(frozen=True)
class RandomConfig:
    num_requests: int = 200
    input_tokens: int = 1088
    output_tokens: int = 32

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests)
        check_int("input_tokens", self.input_tokens)
        check_int("output_tokens", self.output_tokens)


class RandomWorkload:
    name = "random"

    def __init__(self, config: RandomConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 4])
        used: set[int] = set()
        return [RequestSpec(index=i, prompt_ids=distinct_start(rng, c.input_tokens, used), max_tokens=c.output_tokens,
                            group=f"req-{i}") for i in range(c.num_requests)]

    def info(self) -> dict:
        return {"workload": self.name, "seed": self.seed, **dataclasses.asdict(self.config)}
