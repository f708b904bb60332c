"""Online per-instance prefill rate (tokens/s), learned from observed time to first token.

A sample is `work_tokens / ttft_s`, where `work_tokens` is the prompt tokens the
router predicted uncached at dispatch plus the prefill tokens already queued ahead
of it on that instance. Samples with fewer than `min_sample_tokens` of work are
ignored (a tiny prefill's TTFT is dominated by fixed overheads and would read as a
very low rate); each sample is clamped to [min_rate, max_rate] before it enters an
exponentially weighted moving average, with weight `alpha`, of its logarithm (a
geometric mean). Outliers come in ratios, not differences: a request predicted to
miss that finds its prefix just computed by a sibling reads as a rate 10-20x the
true one, and an arithmetic mean let a few of those double the estimate under KV
pressure, where such requests are common; in log space each moves it by the same
factor as one that slow. The rate therefore also
absorbs whatever slows prefill down on that instance (decode interleaving, network):
it is an effective rate, which is what a TTFT prediction wants.

By default one fleet-wide rate pools every instance's samples: in a fleet of equal
engines, per-instance estimates differ only by sampling noise (a sibling that waited
for most of a prefill already done reads as a fast rate), and that noise would
outweigh the load terms that should separate idle instances. Set `per_instance` for
fleets of unequal engines.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class RateConfig:
    initial: float = 10_000.0  # tokens/s assumed before an instance has been observed
    alpha: float = 0.2  # EWMA weight of a new sample
    min_rate: float = 50.0  # tokens/s; samples are clamped into [min_rate, max_rate]
    max_rate: float = 5_000_000.0
    min_sample_tokens: int = 64  # ignore samples with less prefill work than this
    per_instance: bool = False  # False: one fleet-wide rate fed by every instance's samples

    def __post_init__(self) -> None:
        if not 0 < self.min_rate <= self.initial <= self.max_rate:
            raise ValueError(
                "prefill rates must satisfy 0 < min_rate <= initial <= max_rate, "
                f"got min_rate={self.min_rate}, initial={self.initial}, max_rate={self.max_rate}"
            )
        if not 0 < self.alpha <= 1:
            raise ValueError(f"the prefill rate's EWMA weight alpha must be in (0, 1], got {self.alpha}")
        if self.min_sample_tokens < 1:
            raise ValueError(f"min_sample_tokens must be at least 1, got {self.min_sample_tokens}")


class PrefillRate:
    """Per-instance EWMA (in log space) of observed prefill throughput."""

    def __init__(self, config: RateConfig) -> None:
        self.config = config
        self._rates: dict[str, float] = {}
        self._fleet_mean = config.initial

    def _key(self, instance: str) -> str:
        return instance if self.config.per_instance else "*"

    def get(self, instance: str) -> float:
        """The instance's learned rate; an unobserved one gets the fleet's mean, so that
        the first instance to be measured does not look faster (or slower) than the
        rest merely because the others still carry the initial guess."""
        rate = self._rates.get(self._key(instance))
        if rate is not None:
            return rate
        return self._fleet_mean if self._rates else self.config.initial

    def observe(self, instance: str, work_tokens: int, ttft_s: float) -> bool:
        """Fold one observation in; returns False when the sample was ignored."""
        cfg = self.config
        if work_tokens < cfg.min_sample_tokens or not ttft_s > 0:
            return False
        sample = min(max(work_tokens / ttft_s, cfg.min_rate), cfg.max_rate)
        old = self.get(instance)
        self._rates[self._key(instance)] = old * (sample / old) ** cfg.alpha
        self._fleet_mean = sum(self._rates.values()) / len(self._rates)
        return True

    def snapshot(self) -> dict[str, float]:
        return dict(self._rates)
