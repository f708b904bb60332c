"""Online estimates of a transfer link (latency + bandwidth) and of the prefill rate.

`LinkEstimate` fits `seconds = latency + bytes / bandwidth` to the transfers it
observes by exponentially weighted least squares: every observation multiplies
the weight of the older ones by (1 - alpha), so the fit follows a link that gets
busier or quieter. A weak, non-decaying prior (the link's preset figures, worth
`prior_weight` observations) keeps the fit defined while all transfers have the
same size, and the estimate is clamped to a positive bandwidth and a latency of
at least 0. Sizes are scaled to MiB inside so the 2x2 system stays well
conditioned.

`fit_link` fits the same line once to measured points (start-up measurements:
engine/runners/device_costs.py, engine/kv/store_probe.py).

`RateEstimate` is the EWMA of prefill tokens per second measured on steps with at
least `min_tokens` prefill tokens (below that, fixed step overhead dominates).

`DeviceCosts` is what a runner measures on its device at start-up (engine/runners/device_costs.py),
handed to the tiers (engine/kv/tier_service.py `use_measured`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvroute.router.contract.tier_costs import Link

MIB = float(1 << 20)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceCosts:
    links: dict[str, Link]  # "h2d", "d2h"
    prefill_tokens_per_s: float


class LinkEstimate:
    def __init__(self, prior: Link, alpha: float = 0.1, prior_weight: float = 0.05) -> None:
        if not 0 < alpha <= 1 or prior_weight <= 0:
            raise ValueError("alpha must be in (0, 1] and prior_weight positive")
        self.alpha = alpha
        self.prior = prior
        self.prior_weight = prior_weight
        self._w = self._x = self._y = self._xx = self._xy = 0.0  # decayed sums over observations
        self.link = prior

    def observe(self, nbytes: float, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        keep = 1.0 - self.alpha
        x = nbytes / MIB
        self._w = self._w * keep + 1.0
        self._x = self._x * keep + x
        self._y = self._y * keep + seconds
        self._xx = self._xx * keep + x * x
        self._xy = self._xy * keep + x * seconds
        self.link = self._fit()

    def time(self, nbytes: float) -> float:
        return self.link.time(nbytes)

    def _fit(self) -> Link:
        # Minimise sum w (y - a - b x)^2 + p (a - a0)^2 + p (b - b0)^2 (b: seconds per MiB).
        p, a0, b0 = self.prior_weight, self.prior.latency_s, MIB / self.prior.bandwidth_bps
        m11, m12, m22 = self._w + p, self._x, self._xx + p * max(1.0, self._xx / max(self._w, 1e-9))
        r1, r2 = self._y + p * a0, self._xy + (m22 - self._xx) * b0
        det = m11 * m22 - m12 * m12
        a = (r1 * m22 - m12 * r2) / det
        b = (m11 * r2 - m12 * r1) / det
        if a < 0:  # the data put the line through the origin's left: refit without latency
            a, b = 0.0, (self._xy + (m22 - self._xx) * b0) / m22
        b = max(b, 1e-12)
        return Link(MIB / b, a)


class RateEstimate:
    def __init__(self, initial: float, alpha: float = 0.2, min_tokens: int = 128) -> None:
        if not initial > 0:
            raise ValueError(f"the initial prefill rate must be positive, got {initial}")
        self.rate = initial
        self.alpha = alpha
        self.min_tokens = min_tokens

    def observe(self, prefill_tokens: int, seconds: float) -> None:
        if prefill_tokens >= self.min_tokens and seconds > 0:
            self.rate += self.alpha * (prefill_tokens / seconds - self.rate)

    @property
    def seconds_per_token(self) -> float:
        return 1.0 / self.rate


def fit_link(points: list[tuple[int, float]]) -> Link:
    """Least squares of seconds on bytes (relative error, so small batches count too); a positive bandwidth."""
    x = np.array([p[0] for p in points], float)
    y = np.array([max(p[1], 1e-9) for p in points], float)
    if len(set(x)) < 2:
        return Link(float(x.sum() / y.sum()), 0.0)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    if slope <= 0:  # noise swamped the size: all latency, or all bandwidth
        return Link(float(x.max() / y.max()), 0.0)
    return Link(float(1.0 / slope), max(float(intercept), 0.0))


def describe_links(links: dict) -> str:
    """One line for a log: each link's bandwidth and latency."""
    return ", ".join(f"{name} {link.bandwidth_bps / 1e9:.2f} GB/s + {link.latency_s * 1e6:.0f} us"
                     for name, link in sorted(links.items()))
