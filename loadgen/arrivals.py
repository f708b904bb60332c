"""Arrival processes: when the load generator sends each request.

- open loop at `rate` requests/s: gaps drawn from a gamma distribution with shape
  `burstiness` and mean 1/rate (vLLM's `--burstiness`): 1.0 is Poisson, below 1
  burstier, above 1 more even; `math.inf` sends everything at once;
- closed loop at `concurrency`: that many requests in flight, the next one sent
  as soon as one finishes;
- fixed: neither given, the workload's own send times (trace replay).

Multi-turn follow-ups are not arrivals: they go `think_s` after their previous
turn finished (in closed loop, they also wait for a free slot).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvroute.loadgen.workloads.content import check_int, check_number


@dataclasses.dataclass(frozen=True)
class ArrivalConfig:
    rate: float | None = None  # requests/s (open loop)
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson
    concurrency: int | None = None  # requests in flight (closed loop)

    def __post_init__(self) -> None:
        if self.rate is not None and self.concurrency is not None:
            raise ValueError("give either --rate (open loop) or --concurrency (closed loop), not both")
        if self.rate is not None:
            check_number("rate", self.rate, 0.0, strict=True)
        if self.concurrency is not None:
            check_int("concurrency", self.concurrency)
        check_number("burstiness", self.burstiness, 0.0, strict=True)

    @property
    def mode(self) -> str:
        """"open", "closed" or "fixed" (the workload's own send times)."""
        if self.rate is not None:
            return "open"
        return "closed" if self.concurrency is not None else "fixed"

    def describe(self) -> str:
        if self.mode == "open":
            shape = "Poisson" if self.burstiness == 1.0 else f"gamma, burstiness {self.burstiness:g}"
            return f"{self.rate:g} req/s ({shape})"
        return f"concurrency {self.concurrency}" if self.mode == "closed" else "workload's send times"


def interarrival_gaps(rate: float, burstiness: float, n: int, seed: int) -> np.ndarray:
    """n gaps (seconds) with mean 1/rate and gamma shape `burstiness`."""
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng([seed, 100])
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_times(rate: float, burstiness: float, n: int, seed: int) -> list[float]:
    """Send times (seconds from the start) of n open-loop arrivals; the first at 0."""
    gaps = interarrival_gaps(rate, burstiness, n, seed)
    if n:
        gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def count_within(rate: float, burstiness: float, duration_s: float, seed: int) -> int:
    """How many of `arrival_times(rate, burstiness, n, seed)` fall before duration_s (for any large n)."""
    if math.isinf(rate):
        raise ValueError("--duration needs a finite --rate; with --rate inf give --num-requests")
    n = max(16, int(rate * duration_s * 1.5) + 16)
    while True:
        times = arrival_times(rate, burstiness, n, seed)
        if times[-1] >= duration_s:
            return sum(t < duration_s for t in times)
        n *= 2
