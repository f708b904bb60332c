"""`kvroute chaos` configuration, each setting declared once (router/contract/settings.py).

Which scenarios it names, and whether the fleet suits them, is checked by the scenario
registry (loadgen/chaos/scenarios: `chosen`), which knows them."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.constraints import NOT_NEGATIVE, POSITIVE, at_least
from kvroute.router.contract.settings import check_settings, setting


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    """chaos run"""

    out: str | None = setting(None, "write results.json, results.md and the processes' logs here", metavar="DIR",
                              default_text="none (logs in a temporary directory)")
    quick: bool = setting(False, "a fuzz sample and one engine kill on a smaller fleet (~20 s)")
    scenarios: tuple[str, ...] = setting((), "comma-separated, in the order given", parse=_names, metavar="NAME,NAME",
                                         default_text="all; --quick: fuzz,engine-kill")
    engines: int = setting(3, "sim engines (at least 2: one stays healthy while another is faulted)",
                           check=at_least(2), default_text="3; --quick 2")
    routers: int = setting(2, "routers sharing the Redis index", check=at_least(1), default_text="2; --quick 1")
    rate: float = setting(40.0, "background requests per second, through the routers", check=POSITIVE,
                          default_text="40; --quick 20")
    fuzz_cases: int = setting(0, "malformed bodies, half to a router, half to an engine, spread over every category",
                              check=NOT_NEGATIVE, default_text="0: the whole catalog, ~4,900; --quick 300")
    fuzz_slow_s: float = setting(2.0, "a malformed body answered slower than this breaks fuzz-bounded-time",
                                 check=POSITIVE)
    streams: int = setting(1000, "concurrent streams in the streams scenario", check=at_least(1))
    hold_s: float = setting(3.0, "how long each fault lasts", check=POSITIVE, default_text="3; --quick 1")
    settle_s: float = setting(1.0, "load kept running after each recovery, counted in its row", check=NOT_NEGATIVE,
                              default_text="1; --quick 0.5")
    wait_s: float = setting(30.0, "the longest wait for an ejection or a resync before it counts as not happening",
                            check=POSITIVE)
    rss_growth_mb: float = setting(200.0, "fuzz: a process whose peak RSS grows more breaks fuzz-memory",
                                   check=POSITIVE)
    seed: int = setting(0, "seed of the load, the fuzz sample and the faults")
    engine_args: tuple[str, ...] = setting((), "extra flag for every engine, after the chaos defaults, e.g. "
                                               "--engine-arg=--time-scale=0.1 (repeat)", flag="engine-arg",
                                           metavar="ARG")
    router_args: tuple[str, ...] = setting((), "extra flag for every router, e.g. --router-arg=--eject-after=2 "
                                               "(repeat)", flag="router-arg", metavar="ARG")

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def quick_defaults(cls) -> dict:
        """What --quick changes, unless a flag says otherwise."""
        return {"engines": 2, "routers": 1, "rate": 20.0, "fuzz_cases": 300, "hold_s": 1.0, "settle_s": 0.5}
