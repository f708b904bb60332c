"""multi-turn: chat sessions whose prompt grows turn by turn, with think time between turns.

Session s has `turns` requests. Turn k's prompt is the (optional) system prompt,
then every earlier turn's question and a synthetic answer of `answer_tokens`
tokens, then turn k's question: turn k+1's prompt starts with all of turn k's.
The answer is fixed synthetic content, not what the server generated, so the
workload stays deterministic. A later turn is sent `think_time` seconds after the
previous turn of its session finished (RequestSpec.after / think_s); the arrival
process (rate or concurrency) applies to the first turns. Requests are numbered
session by session; the last session is cut short when num_requests is not a
multiple of turns. All sessions share the system prompt when system_tokens > 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, check_number, distinct_start, random_tokens


@dataclasses.dataclass(frozen=True)
class MultiTurnConfig:
    num_requests: int = 200
    turns: int = 5
    system_tokens: int = 0
    question_tokens: int = 128
    answer_tokens: int = 64
    output_tokens: int = 32
    think_time: float = 1.0  # seconds

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests)
        check_int("turns", self.turns)
        check_int("system_tokens", self.system_tokens, 0)
        check_int("question_tokens", self.question_tokens)
        check_int("answer_tokens", self.answer_tokens, 0)
        check_int("output_tokens", self.output_tokens)
        check_number("think_time", self.think_time)


class MultiTurnWorkload:
    name = "multi-turn"

    def __init__(self, config: MultiTurnConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 2])
        system = random_tokens(rng, c.system_tokens)
        used_first: set[int] = set()
        specs: list[RequestSpec] = []
        session = 0
        while len(specs) < c.num_requests:
            history = system
            for turn in range(min(c.turns, c.num_requests - len(specs))):
                question = distinct_start(rng, c.question_tokens, used_first) if turn == 0 else \
                    random_tokens(rng, c.question_tokens)
                prompt = history + question
                first = turn == 0
                specs.append(RequestSpec(index=len(specs), prompt_ids=prompt, max_tokens=c.output_tokens,
                                         group=f"session-{session}", after=None if first else len(specs) - 1,
                                         think_s=0.0 if first else c.think_time))
                history = prompt + random_tokens(rng, c.answer_tokens)
            session += 1
        return specs

    def info(self) -> dict:
        c = self.config
        return {"workload": self.name, "seed": self.seed, "sessions": -(-c.num_requests // c.turns),
                "max_prompt_tokens": c.system_tokens + c.turns * c.question_tokens + (c.turns - 1) * c.answer_tokens,
                **dataclasses.asdict(c)}
