"""The fuzz scenario: every malformed body to a router and, directly, to an engine, while
the background load keeps going (it must not notice)."""

from __future__ import annotations

import random

from kvroute.loadgen.chaos import fuzz_cases as fc
from kvroute.loadgen.chaos.fleet import get_json
from kvroute.loadgen.chaos.fuzz import Canary, FuzzReport, run_fuzz, sample
from kvroute.loadgen.chaos.fuzz_kv import kv_cases
from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.router.contract.limits import Limits

TIMEOUT_S = 10.0  # an answer slower than this is a hang


def catalog(limits: Limits, canary: str, target: str) -> list[fc.FuzzCase]:
    cases: list[fc.FuzzCase] = []
    for part in (fc.json_cases(), fc.utf8_cases(), fc.type_cases(), fc.range_cases(), fc.token_cases(limits),
                 fc.huge_cases(limits), fc.deep_cases(), kv_cases(canary, target)):
        cases += part
    return cases


def fuzz_row(report: FuzzReport, scenario: str, traffic: str) -> Row:
    times = sorted(report.elapsed)
    pick = lambda q: round(1000 * times[min(len(times) - 1, int(q * len(times)))], 1) if times else None  # noqa: E731
    return Row(scenario=scenario, traffic=traffic,
               sent=report.sent, ok=report.as_expected, statuses=dict(report.statuses),
               five_xx=report.five_xx, p50_ms=pick(0.5), p99_ms=pick(0.99),
               detail={"by_category": {k: dict(v) for k, v in report.by_category.items()},
                       "failures": report.failures, "slowest": [report.slowest_s, report.slowest_case],
                       "no_answer": report.no_answer, "50MB_max_s": round(report.huge_max_s, 3)})


class Fuzz:
    name = "fuzz"
    summary = ("malformed bodies to a router and an engine: invalid JSON, bad UTF-8, wrong types, out-of-range "
               "numbers and token ids, 50 MB and 100k-deep bodies, kv_transfer_params of every shape")

    async def run(self, ctx: Context) -> Outcome:
        engine, router = ctx.fleet.engines[0], ctx.fleet.routers[0]
        info = await get_json(ctx.session, engine.url + "/kv/info")
        assert info is not None  # the fleet is up: the engine answers /kv/info
        limits = Limits.derive(int(info["max_model_len"]), int(info["vocab_size"]))  # what the targets enforce
        canary = await Canary().start()
        out = Outcome()
        try:
            for target, proc in (("router", router), ("engine", engine)):
                report = await self._fuzz(ctx, proc, catalog(limits, canary.url, target), target)
                out.rows.append(fuzz_row(report, self.name, f"fuzz -> {proc.name}"))
                out.require(report.sent == report.as_expected, "fuzz-answers", self.name,
                            f"{report.sent - report.as_expected} of {report.sent} bodies to {proc.name} got a wrong "
                            f"answer; first: {report.failures[:3]}")
                out.require(report.slowest_s <= ctx.config.fuzz_slow_s, "fuzz-bounded-time", self.name,
                            f"{proc.name} took {report.slowest_s:.2f}s (> {ctx.config.fuzz_slow_s:g}s) to answer "
                            f"{report.slowest_case}")
        finally:
            await canary.close()
        out.require(canary.connections == 0, "no-ssrf", self.name,
                    f"an engine connected {canary.connections} times to an address taken from a client's body")
        return out

    async def _fuzz(self, ctx: Context, proc: Proc, cases: list[fc.FuzzCase], target: str) -> FuzzReport:
        share = ctx.config.fuzz_cases // 2
        if 0 < share < len(cases):
            cases = sample(cases, share, random.Random(ctx.config.seed))
        random.Random(ctx.config.seed).shuffle(cases)  # huge cases spread among the rest
        ctx.say(f"fuzz: {len(cases):,} malformed bodies -> {proc.name} ({target})")
        return await run_fuzz(cases, target, "127.0.0.1", proc.port, timeout_s=TIMEOUT_S,
                              progress=lambda r: ctx.say(f"fuzz -> {proc.name}: {r.sent:,} sent, "
                                                         f"{r.sent - r.as_expected} wrong"))
