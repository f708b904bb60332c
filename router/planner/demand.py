"""What the fleet is asked to do now, from a window of requests: the planner's demand.

Counting tokens at request end lags a shift by a whole request's duration (a 1,000-token
answer ends 20 s after it began), so demand comes from *arrivals*, corrected by what the
window's finished requests show:

    prefill tokens/s = arrived prompt tokens / window x (1 - cached share of finished prompts)
    output tokens/s  = arrived max_tokens / window x (finished output / finished max_tokens)
    mean context     = prompt + half the expected output, over the arrivals

(without finished requests yet: no cache, outputs at max_tokens). The router
(router/service/request_trace.py) and the simulator (loadgen/sim/planning.py) both call this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True, slots=True)
class Demand:
    prefill_tokens_per_s: float
    output_tokens_per_s: float
    mean_context_tokens: float
    arrivals_per_s: float
    mean_prompt_tokens: float = 0.0  # uncached
    mean_output_tokens: float = 0.0


def estimate(arrivals: Iterable[tuple[int, float]], finished: Iterable[tuple[int, int, int, int]],
             window_s: float) -> Demand:
    """`arrivals`: (prompt tokens, max_tokens); `finished`: (prompt, cached, output, max_tokens).
    A max_tokens below 0 is unknown (a chat request without one): it counts as the finished
    requests' mean output (256 before any finished)."""
    arrivals = list(arrivals)
    prompt_done = cached_done = output_done = asked_done = done = 0
    for prompt, cached, output, asked in finished:
        prompt_done += prompt
        cached_done += cached
        done += 1
        if asked >= 0:
            output_done += output
            asked_done += asked
    miss = 1.0 - cached_done / prompt_done if prompt_done else 1.0
    ratio = output_done / asked_done if asked_done else 1.0
    mean_out = output_done / done if done else 256.0
    arrivals = [(p, m if m >= 0 else mean_out / ratio if ratio else mean_out) for p, m in arrivals]
    prompt_in = sum(p for p, _ in arrivals)
    asked_in = sum(m for _, m in arrivals)
    n = len(arrivals)
    context = sum(p + m * ratio / 2 for p, m in arrivals) / n if n else 0.0
    return Demand(prompt_in * miss / window_s, asked_in * ratio / window_s, context, n / window_s,
                  prompt_in * miss / n if n else 0.0, asked_in * ratio / n if n else 0.0)
