"""What every scenario gets (`Context`) and gives back (`Outcome`), and the protocol they share."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp

from kvroute.loadgen.chaos.config import ChaosConfig
from kvroute.loadgen.chaos.fleet import Fleet
from kvroute.loadgen.chaos.load import LoadClient, Prompts
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.watch import Views, wait_for


@dataclasses.dataclass(frozen=True)
class Violation:
    invariant: str
    scenario: str
    detail: str

    def line(self) -> str:
        return f"invariant broken: {self.invariant} ({self.scenario}): {self.detail}"


@dataclasses.dataclass
class Outcome:
    eject_s: float | None = None  # fault -> no router routes to the faulted part
    resync_s: float | None = None  # the part answers again -> routable, its index reloaded
    rows: list[Row] = dataclasses.field(default_factory=list)  # extra traffic (fuzz, burst) beside the load
    violations: list[Violation] = dataclasses.field(default_factory=list)
    notes: dict = dataclasses.field(default_factory=dict)

    def require(self, ok: bool, invariant: str, scenario: str, detail: str) -> None:
        if not ok:
            self.violations.append(Violation(invariant, scenario, detail))


@dataclasses.dataclass
class Context:
    config: ChaosConfig
    fleet: Fleet
    session: aiohttp.ClientSession
    load: LoadClient
    prompts: Prompts
    views: Views
    say: Callable[[str], None]

    def now(self) -> float:
        return time.monotonic()

    async def wait(self, check: Callable[[], Awaitable[bool]]) -> float | None:
        """Seconds until `check()` holds, None after `wait_s`."""
        return await wait_for(check, self.config.wait_s)


class Scenario(Protocol):
    """One fault (or one kind of traffic), run under the background load."""

    name: str
    summary: str  # one line for the README and --help

    async def run(self, ctx: Context) -> Outcome: ...
