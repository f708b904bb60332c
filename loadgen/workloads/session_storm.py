"""session-storm: long sessions go idle, other traffic pushes them out of device memory, then many return at once.

Three phases, with the workload's own send times (no --rate):

1. `sessions` sessions send their first turn, a context of `min_context_tokens` to
   `context_tokens` tokens (uniform), `session_rate` per second;
2. after `gap` seconds, `idle_requests` unrelated prompts of `idle_tokens` tokens
   (no sharing) arrive at `idle_rate` per second: they fill the device pools, so
   the sessions' blocks are evicted from the device (to the host pool or the
   store, when the engines have them);
3. after another `gap`, `burst` of the sessions (chosen at random) return within
   `burst_spread` seconds: their second turn is the first turn's context, a
   synthetic answer of `answer_tokens` and a new question of `question_tokens`,
   so all of the first turn is a reusable prefix. This is the session-recovery
   storm whose TTFT `kvroute bench --tiers` measures.

Groups: "session-K" (first turns), "idle", "return-K" (the storm). `num_requests`
0 keeps every request; N > 0 keeps the first N by send time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, check_number, distinct_start, random_tokens

RETURN_GROUP = "return-"


@dataclasses.dataclass(frozen=True)
class SessionStormConfig:
    num_requests: int = 0
    sessions: int = 32
    context_tokens: int = 3072
    min_context_tokens: int = 2048
    question_tokens: int = 64
    answer_tokens: int = 32
    output_tokens: int = 16
    session_rate: float = 4.0  # first turns per second
    idle_requests: int = 64
    idle_tokens: int = 1024
    idle_rate: float = 8.0  # idle requests per second
    burst: int = 32
    burst_spread: float = 2.0  # seconds
    gap: float = 2.0  # seconds between phases

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests, 0)
        for name in ("sessions", "context_tokens", "min_context_tokens", "question_tokens", "output_tokens",
                     "idle_tokens"):
            check_int(name, getattr(self, name))
        check_int("answer_tokens", self.answer_tokens, 0)
        check_int("idle_requests", self.idle_requests, 0)
        check_int("burst", self.burst, 0)
        for name in ("session_rate", "idle_rate"):
            check_number(name, getattr(self, name), 0.0, strict=True)
        check_number("burst_spread", self.burst_spread)
        check_number("gap", self.gap)
        if self.min_context_tokens > self.context_tokens:
            raise ValueError("--min-context-tokens cannot exceed --context-tokens")
        if self.burst > self.sessions:
            raise ValueError(f"--burst ({self.burst}) cannot exceed --sessions ({self.sessions})")


class SessionStormWorkload:
    name = "session-storm"

    def __init__(self, config: SessionStormConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    def requests(self) -> list[RequestSpec]:
        c = self.config
        rng = np.random.default_rng([self.seed, 6])
        used: set[int] = set()
        timed: list[tuple[float, str, tuple[int, ...]]] = []
        contexts = []
        for k in range(c.sessions):
            n = int(rng.integers(c.min_context_tokens, c.context_tokens + 1))
            contexts.append(distinct_start(rng, n, used))
            timed.append((k / c.session_rate, f"session-{k}", contexts[k]))
        start = c.sessions / c.session_rate + c.gap
        for j in range(c.idle_requests):
            timed.append((start + j / c.idle_rate, "idle", distinct_start(rng, c.idle_tokens, used)))
        storm = start + c.idle_requests / c.idle_rate + c.gap
        chosen = rng.choice(c.sessions, size=c.burst, replace=False)
        offsets = np.sort(rng.uniform(0.0, c.burst_spread, size=c.burst)) if c.burst_spread else np.zeros(c.burst)
        for k, offset in zip(chosen.tolist(), offsets.tolist()):
            follow = random_tokens(rng, c.answer_tokens) + random_tokens(rng, c.question_tokens)
            timed.append((storm + offset, f"{RETURN_GROUP}{k}", contexts[k] + follow))
        timed.sort(key=lambda t: t[0])
        if c.num_requests:
            timed = timed[:c.num_requests]
        return [RequestSpec(index=i, prompt_ids=prompt, max_tokens=c.output_tokens, group=group, arrival_s=at)
                for i, (at, group, prompt) in enumerate(timed)]

    def info(self) -> dict:
        c = self.config
        storm = c.sessions / c.session_rate + c.idle_requests / c.idle_rate + 2 * c.gap
        return {"workload": self.name, "seed": self.seed, "storm_starts_s": storm, **dataclasses.asdict(c)}


def is_return(group: str) -> bool:
    return group.startswith(RETURN_GROUP)
