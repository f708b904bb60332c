"""shift: the same arrival rate, a workload that changes shape half-way (the planner's test).

The first `shift_at` share of requests is prompt-heavy (long prompts, short outputs), the
rest decode-heavy (short prompts, long outputs). Lengths are drawn uniformly between
`spread` x and 1 x each phase's figures; no two prompts share even their first block.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, distinct_start


@dataclasses.dataclass(frozen=True)
class ShiftConfig:
    num_requests: int = 2000
    prompt_heavy_input_tokens: int = 3000
    prompt_heavy_output_tokens: int = 32
    decode_heavy_input_tokens: int = 256
    decode_heavy_output_tokens: int = 1024
    shift_at: float = 0.5
    spread: float = 0.5

    def __post_init__(self) -> None:
        for name in ("num_requests", "prompt_heavy_input_tokens", "prompt_heavy_output_tokens",
                     "decode_heavy_input_tokens", "decode_heavy_output_tokens"):
            check_int(name, getattr(self, name))
        if not 0 <= self.shift_at <= 1:
            raise ValueError(f"--shift-at is the share of requests before the shift, in [0, 1]; got {self.shift_at}")
        if not 0 < self.spread <= 1:
            raise ValueError(f"--spread must be in (0, 1], got {self.spread}")


class ShiftWorkload:
    name = "shift"

    def __init__(self, config: ShiftConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 7])
        used: set[int] = set()
        cut = round(c.num_requests * c.shift_at)

        def length(n: int) -> int:
            return int(rng.integers(max(1, round(n * c.spread)), n + 1))

        specs = []
        for i in range(c.num_requests):
            heavy = i < cut
            prompt = c.prompt_heavy_input_tokens if heavy else c.decode_heavy_input_tokens
            output = c.prompt_heavy_output_tokens if heavy else c.decode_heavy_output_tokens
            specs.append(RequestSpec(index=i, prompt_ids=distinct_start(rng, length(prompt), used),
                                     max_tokens=length(output), group="prompt-heavy" if heavy else "decode-heavy"))
        return specs

    def info(self) -> dict:
        return {"workload": self.name, "seed": self.seed, **dataclasses.asdict(self.config)}
