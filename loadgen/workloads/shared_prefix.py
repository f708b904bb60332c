"""shared-prefix: G groups, each a long system prompt shared by its requests plus a unique question.

The shape of llm-d's prefix-cache benchmarks (150 groups x 6,000 + 1,200 tokens
there), scaled down by default for a small CPU machine. Requests are assigned to
groups round-robin and then shuffled, so every group gets the same number of
requests (+-1) in a seeded random order. Group prefixes start with distinct tokens
and questions of one group start with distinct tokens: requests of one group share
exactly `prefix_tokens` tokens, requests of different groups share none.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, distinct_start


@dataclasses.dataclass(frozen=True)
class SharedPrefixConfig:
    num_requests: int = 200
    groups: int = 8
    prefix_tokens: int = 1024
    question_tokens: int = 64
    output_tokens: int = 32

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests)
        check_int("groups", self.groups)
        check_int("prefix_tokens", self.prefix_tokens, 0)
        check_int("question_tokens", self.question_tokens)
        check_int("output_tokens", self.output_tokens)


class SharedPrefixWorkload:
    name = "shared-prefix"

    def __init__(self, config: SharedPrefixConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 1])
        used_prefix: set[int] = set()
        prefixes = [distinct_start(rng, c.prefix_tokens, used_prefix) for _ in range(c.groups)]
        groups = np.arange(c.num_requests) % c.groups
        rng.shuffle(groups)
        used_question: list[set[int]] = [set() for _ in range(c.groups)]
        specs = []
        for i, g in enumerate(groups.tolist()):
            question = distinct_start(rng, c.question_tokens, used_question[g])
            specs.append(RequestSpec(index=i, prompt_ids=prefixes[g] + question, max_tokens=c.output_tokens,
                                     group=f"group-{g}"))
        return specs

    def info(self) -> dict:
        return {"workload": self.name, "seed": self.seed, **dataclasses.asdict(self.config)}
