"""Tenants: weight, optional SLO, rate and concurrency limits; the limits as pure bookkeeping.

`TenantSpec` is what the tenant file says of one tenant (docs/admission.md); `Limits` keeps
each tenant's token bucket (rate, burst) and requests in flight, on the caller's clock, for
the router service and the simulator alike.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping

DEFAULT_TENANT = "default"
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TenantSpec:
    name: str
    weight: float = 1.0  # share of the queue's service among tenants with a backlog
    slo_ttft_s: float | None = None  # overrides --slo-ttft-s
    rate: float | None = None  # requests/s admitted at most (token bucket); None: no limit
    burst: float | None = None  # bucket size; None: max(1, rate)
    max_concurrency: int | None = None  # requests in flight at most, counted from arrival; None: no limit
    keys: tuple[str, ...] = ()  # API keys that name this tenant
    allow_request_slo: bool = False  # a request may tighten its SLO (x-kvroute-slo-ttft-s), never loosen it
    min_priority: int = 0  # the most urgent priority its requests may ask (lower is more urgent)

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"tenant names are 1-64 letters, digits or _.:-, got {self.name!r}")
        if not self.weight > 0:
            raise ValueError(f"tenant {self.name}: weight must be positive, got {self.weight}")
        for field in ("slo_ttft_s", "rate", "burst"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ValueError(f"tenant {self.name}: {field} must be positive, got {value}")
        if self.burst is not None and self.burst < 1:  # a bucket that never holds a whole token admits nothing
            raise ValueError(f"tenant {self.name}: burst must be at least 1 (one request), got {self.burst}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"tenant {self.name}: max_concurrency must be at least 1, got {self.max_concurrency}")
        if any(not isinstance(k, str) or not k for k in self.keys):
            raise ValueError(f"tenant {self.name}: keys must be non-empty strings")
        if not isinstance(self.allow_request_slo, bool):
            raise ValueError(f"tenant {self.name}: allow_request_slo must be true or false")
        if isinstance(self.min_priority, bool) or not isinstance(self.min_priority, int):
            raise ValueError(f"tenant {self.name}: min_priority must be an integer, got {self.min_priority!r}")

    def priority_for(self, asked: int) -> int:
        """A request's priority: its own (the body's `priority` or x-kvroute-priority), lowered to no more
        urgent than the tenant file grants (`min_priority`, 0 by default): bands are strict across
        tenants, so a client cannot jump other tenants' requests by asking for -1000."""
        return max(asked, self.min_priority)

    def slo_for(self, asked_s: float | None, default_s: float | None) -> float | None:
        """A request's TTFT SLO: the tenant's, else the router's (`default_s`). Its own (`asked_s`, the
        x-kvroute-slo-ttft-s header) counts only where the tenant file allows it, and only to tighten:
        a client can make admission stricter for itself, never looser."""
        base = self.slo_ttft_s or default_s
        if asked_s is None or not self.allow_request_slo:
            return base
        return asked_s if base is None else min(asked_s, base)

    def bucket_size(self) -> float:
        """The tokens its rate bucket holds when full: `burst`, else one second of `rate` (at least 1)."""
        assert self.rate is not None  # buckets are kept for rate-limited tenants only
        return self.burst or max(1.0, self.rate)

    def share(self, workers: int) -> TenantSpec:
        """What one of `workers` router processes enforces (each takes about 1/workers of the
        connections): the rate and burst divided, the concurrency divided rounding down (at least 1)."""
        if workers <= 1 or (self.rate is None and self.max_concurrency is None):
            return self
        rate = self.rate / workers if self.rate is not None else None
        burst = max(1.0, self.bucket_size() / workers) if self.rate is not None else self.burst
        concurrency = max(1, self.max_concurrency // workers) if self.max_concurrency is not None else None
        return dataclasses.replace(self, rate=rate, burst=burst, max_concurrency=concurrency)


class Limits:
    """Per tenant: a token bucket of admissions and the requests in flight, each counted from the
    moment it holds a place (before it is tokenized) to its end, so that no interleaving of
    arrivals takes more than the limits allow."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, as of)
        self.inflight: dict[str, int] = {}

    def check(self, spec: TenantSpec, now: float) -> str | None:
        """Why `spec`'s tenant may not be admitted now ("rate_limit", "concurrency"), or None."""
        if spec.max_concurrency is not None and self.inflight.get(spec.name, 0) >= spec.max_concurrency:
            return "concurrency"
        if spec.rate is not None and self._tokens(spec, now) < 1.0:
            return "rate_limit"
        return None

    def _tokens(self, spec: TenantSpec, now: float) -> float:
        assert spec.rate is not None  # buckets are kept for rate-limited tenants only
        size = spec.bucket_size()
        tokens, since = self._buckets.get(spec.name, (size, now))
        return min(size, tokens + (now - since) * spec.rate)

    def retry_after(self, spec: TenantSpec, now: float) -> float:
        if spec.rate is None:
            return 1.0
        return max(1.0, (1.0 - self._tokens(spec, now)) / spec.rate)

    def take(self, spec: TenantSpec, now: float) -> None:
        """A request of `spec`'s tenant holds a place (in flight) and spent a token of its bucket."""
        if spec.rate is not None:
            self._buckets[spec.name] = (self._tokens(spec, now) - 1.0, now)
        self.inflight[spec.name] = self.inflight.get(spec.name, 0) + 1

    def give_back(self, spec: TenantSpec, now: float) -> None:
        """`take` undone: the request was refused or failed before it was admitted."""
        if spec.rate is not None:
            self._buckets[spec.name] = (min(spec.bucket_size(), self._tokens(spec, now) + 1.0), now)
        self.finished(spec.name)

    def refused(self, spec: TenantSpec, now: float) -> None:
        """A request the limits refused (nothing to count here; leases.py sizes its leases by them)."""

    def finished(self, tenant: str) -> None:
        left = self.inflight.get(tenant, 0) - 1
        if left > 0:
            self.inflight[tenant] = left
        else:
            self.inflight.pop(tenant, None)


def spec_of(tenants: Mapping[str, TenantSpec], name: str) -> TenantSpec:
    """The tenant's spec; one not in the file has the defaults."""
    spec = tenants.get(name)
    return spec if spec is not None else _default_spec(name)


@functools.lru_cache(maxsize=4096)  # made once per name, not per request; names may come from a header
def _default_spec(name: str) -> TenantSpec:
    return TenantSpec(name=name if NAME.match(name) else DEFAULT_TENANT)
