"""`kvroute chaos` configuration: one frozen dataclass, CLI flags map 1:1 onto its fields.

Which scenarios it names, and whether the fleet suits them, is checked by the scenario
registry (loadgen/chaos/scenarios: `chosen`), which knows them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    out: str | None = None  # results.json, results.md and the processes' logs go here
    quick: bool = False  # a sample of the fuzz and one engine kill, on a smaller fleet (~20 s)
    scenarios: tuple[str, ...] = ()  # default: every scenario (--quick: fuzz, engine-kill)
    engines: int = 3
    routers: int = 2
    rate: float = 40.0  # background requests per second, through the routers
    fuzz_cases: int = 0  # malformed bodies, half to a router, half to an engine; 0 = the whole catalog (~4,900)
    fuzz_slow_s: float = 2.0  # a malformed body answered slower than this breaks `fuzz-bounded-time`
    streams: int = 1000  # concurrent streams in the `streams` scenario
    hold_s: float = 3.0  # how long each fault lasts
    settle_s: float = 1.0  # load kept running after recovery, counted in the scenario's row
    wait_s: float = 30.0  # the longest wait for an ejection or a resync before it counts as not happening
    rss_growth_mb: float = 200.0  # fuzz: a process whose peak RSS grows more breaks `fuzz-memory`
    seed: int = 0
    engine_args: tuple[str, ...] = ()  # extra flags for every engine (after the chaos defaults)
    router_args: tuple[str, ...] = ()  # extra flags for every router

    def __post_init__(self) -> None:
        if self.engines < 2:
            raise ValueError("--engines must be at least 2, so one stays healthy while another is faulted")
        if self.routers < 1:
            raise ValueError("--routers must be at least 1")
        if min(self.rate, self.hold_s, self.wait_s, self.fuzz_slow_s, self.rss_growth_mb) <= 0:
            raise ValueError("--rate, --hold-s, --wait-s, --fuzz-slow-s and --rss-growth-mb must be positive")
        if self.settle_s < 0 or self.fuzz_cases < 0 or self.streams < 1:
            raise ValueError("--settle-s and --fuzz-cases must be >= 0 and --streams >= 1")

    @classmethod
    def quick_defaults(cls) -> dict:
        """What --quick changes, unless a flag says otherwise."""
        return {"engines": 2, "routers": 1, "rate": 20.0, "fuzz_cases": 300, "hold_s": 1.0, "settle_s": 0.5}
