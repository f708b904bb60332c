"""Run the chaos scenarios against one fleet under one steady background load.

For each scenario: a fresh row for the background load, RSS watched from its start, the
scenario run (fault, wait for eject, hold, recover, wait for resync), `settle_s` more
load, then the row closed once its requests have ended, and every invariant checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

import aiohttp

from kvroute.loadgen.chaos.config import ChaosConfig
from kvroute.loadgen.chaos.fleet import ENGINE_ARGS, ROUTER_ARGS, Fleet
from kvroute.loadgen.chaos.invariants import LogWatch, check_rows
from kvroute.loadgen.chaos.load import LoadClient, Prompts
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.rss import RssWatch
from kvroute.loadgen.chaos.scenario_base import Context, Outcome, Violation
from kvroute.loadgen.chaos.scenarios import SCENARIOS, chosen
from kvroute.loadgen.chaos.watch import Views

WARMUP_S = 2.0  # load before the first scenario, so caches and the index are warm
DRAIN_S = 40.0  # longest wait for a row's last requests to end
TICK_S = 5.0


@dataclasses.dataclass
class ChaosResult:
    rows: list[Row]
    violations: list[Violation]
    scenarios: dict  # name -> eject, resync and notes
    settings: dict
    log_dir: str
    seconds: float

    def to_dict(self) -> dict:
        return {"rows": [r.to_dict() for r in self.rows],
                "violations": [dataclasses.asdict(v) for v in self.violations], "invariants_ok": not self.violations,
                "scenarios": self.scenarios, "settings": self.settings, "log_dir": self.log_dir,
                "seconds": round(self.seconds, 1)}


class Say:
    def __init__(self, stream=None) -> None:
        self.stream, self.t0 = stream or sys.stderr, time.monotonic()

    def __call__(self, message: str) -> None:
        self.stream.write(f"[chaos {time.monotonic() - self.t0:6.1f}s] {message}\n")
        self.stream.flush()


async def run_chaos(config: ChaosConfig, log_dir: str | None = None, say: Say | None = None) -> ChaosResult:
    say = say or Say()
    t0 = time.monotonic()
    fleet = Fleet(config.engines, config.routers, log_dir, config.engine_args, config.router_args)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            say(f"starting redis-server, {config.engines} sim engines, {config.routers} router(s); "
                f"logs in {fleet.log_dir}")
            await fleet.start(session)
            return await _scenarios(config, fleet, session, say, t0)
        finally:
            fleet.close()


async def _scenarios(config: ChaosConfig, fleet: Fleet, session: aiohttp.ClientSession, say: Say,
                     t0: float) -> ChaosResult:
    prompts = Prompts(config.seed)
    load = LoadClient(session, [r.url for r in fleet.routers], prompts, config.rate)
    ctx = Context(config, fleet, session, load, prompts, Views(session, fleet), say)
    run = _Run(ctx, LogWatch(fleet.procs), RssWatch(fleet.pids))
    tasks = [asyncio.ensure_future(load.run()), asyncio.ensure_future(_tick(load, say))]
    try:
        say(f"background load: {config.rate:g} requests/s through {len(fleet.routers)} router(s); warming up")
        await asyncio.sleep(WARMUP_S)
        for name in chosen(config):
            if not await run.scenario(name):
                break  # the fleet is not whole any more: later scenarios would measure the wreck
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await load.close()
    settings = {"engine_args": [*ENGINE_ARGS, *config.engine_args], "router_args": [*ROUTER_ARGS, *config.router_args],
                **{k: v for k, v in dataclasses.asdict(config).items() if k not in ("engine_args", "router_args")}}
    return ChaosResult(run.rows, run.violations, run.summary, settings, fleet.log_dir, time.monotonic() - t0)


class _Run:
    """The rows, violations and per-scenario summary of one chaos run."""

    def __init__(self, ctx: Context, logs: LogWatch, rss: RssWatch) -> None:
        self.ctx, self.logs, self.rss = ctx, logs, rss
        self.rows: list[Row] = []
        self.violations: list[Violation] = []
        self.summary: dict = {}

    async def scenario(self, name: str) -> bool:
        """Run one scenario and check it; False if it could not finish."""
        ctx, load = self.ctx, self.ctx.load
        tally = load.begin(name)
        self.rss.begin()
        counters = await ctx.views.counters()
        try:
            outcome = await SCENARIOS[name].run(ctx)
        except RuntimeError as e:  # a part did not come back (fleet.py says which, and its log)
            outcome = Outcome()
            outcome.require(False, "scenario-finished", name, str(e))
        await asyncio.sleep(ctx.config.settle_s)
        load.begin(f"after {name}")
        await load.drain(tally, DRAIN_S)
        memory = await self.rss.end()
        moved = _delta(counters, await ctx.views.counters())
        outcome.notes.update(router_ejections=int(moved["ejections"]))
        row = dataclasses.replace(tally.to_row(), eject_s=outcome.eject_s, resync_s=outcome.resync_s,
                                  retries=int(moved["retries"]))
        rows = [row, *outcome.rows]
        for r in rows:
            r.memory = memory
        found = outcome.violations + check_rows(rows, ctx.config.rss_growth_mb) + self.logs.check(name)
        for v in found:
            ctx.say(v.line())
        ctx.say(f"{name}: done ({row.sent:,} requests, {row.lost} lost, {row.broken} broken, "
                f"{len(found)} invariant(s) broken)")
        self.rows += rows
        self.violations += found
        self.summary[name] = {"eject_s": outcome.eject_s, "resync_s": outcome.resync_s, **outcome.notes}
        return not any(v.invariant == "scenario-finished" for v in found)


def _delta(before: dict, after: dict) -> dict[str, float]:
    """Counter increase summed over routers (a restarted router counts from zero)."""
    total = {"retries": 0.0, "ejections": 0.0}
    for router, values in after.items():
        for name, value in values.items():
            old = before.get(router, {}).get(name, 0.0)
            total[name] += value - old if value >= old else value
    return total


async def _tick(load: LoadClient, say: Say) -> None:
    while True:
        await asyncio.sleep(TICK_S)
        t = load.tally
        say(f"  load [{t.scenario}]: {t.sent:,} sent, {t.ok:,} ok, {t.lost} lost, {t.broken} broken, "
            f"{t.failovers} failovers, {t.inflight} in flight")
