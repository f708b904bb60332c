"""The planner's settings (router/planner/decide.py explains each), declared once
(router/contract/settings.py): `kvroute planner`'s flags, and `kvroute sim --planner-*`."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE, Range, at_least
from kvroute.router.contract.settings import check_settings, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """planner (router/planner)"""

    slo_ttft_s: float = setting(1.0, "TTFT SLO, seconds", flag="slo-ttft", check=POSITIVE)
    slo_tpot_s: float = setting(0.05, "TPOT SLO, seconds", flag="slo-tpot", check=POSITIVE)
    prefill_tokens_per_s: float = setting(10_000.0, "one engine's prefill capacity (from a profile; `kvroute sim "
                                                    "--profile` prints one)", check=POSITIVE)
    decode_tokens_per_s: float = setting(2_000.0, "one engine's decode capacity at the TPOT SLO (from a profile)",
                                         check=POSITIVE)
    interval_s: float = setting(2.0, "seconds between decisions", check=POSITIVE)
    window_s: float = setting(10.0, "seconds of recent requests each decision reads", check=POSITIVE)
    colocate_below: float = setting(0.7, "run colocated (all 'both') below this estimated utilization",
                                    check=Range(0, 1))
    hold: int = setting(2, "intervals a new split must persist before it is applied", check=at_least(1))
    cooldown_s: float = setting(6.0, "seconds between two role changes", check=NOT_NEGATIVE)
    colocate_margin: float = 0.2
    decode_step_s: float = 0.0  # > 0: decode capacity from this step model at the observed context
    decode_seq_s: float = 0.0
    decode_context_s: float = 0.0
    max_running: int = 64
    max_batched_tokens: int = 2048  # an engine's prefill chunk
    min_prefill: int = 1
    min_decode: int = 1
    target_utilization: float = 0.8

    def __post_init__(self) -> None:
        check_settings(self)
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError("planner min_prefill and min_decode must be at least 1")
        if min(self.decode_step_s, self.decode_seq_s, self.decode_context_s, self.colocate_margin) < 0 \
                or self.max_running < 1:
            raise ValueError("planner decode step coefficients and colocate_margin cannot be negative, "
                             "max_running must be at least 1")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"planner target_utilization must be in (0, 1], got {self.target_utilization}")
