"""Each phase of a connection bounded, and hostile bytes answered as the table says (issue 36,
findings 4, 5 and 11), on routers of the scenario's own:

stalled-bodies  at a router with --max-connections 200 and --body-timeout-s 5:
                200 connections each send a head and all but one byte of a 1 MiB body and stop; then
                200 from 200 other loopback addresses send a head and 1 KB and stop, and a normal
                client sends 5 requests. Every stalled one is closed within the body timeout + the
                2 s of lingering + 1 s, the 5 are answered 200, and the router's RSS is back within
                24 MB of where it began (its peak above it within the bodies being received, 64 MiB,
                plus 256 KiB of read-ahead per connection, plus 32 MB)
upgrades        at a router with --idle-timeout-s 3: 20 each of an h2c upgrade (what
                `curl --http2` sends), a websocket upgrade, CONNECT, and an h2c upgrade pipelined
                after a normal request: every one answered as aiohttp answers it, the pipelined ones
                closed by the idle timeout within 3 + 2 s, not left open
front-cases     every case of loadgen/chaos/front_cases.py to a router: the case's statuses and
                connection behaviour; then 2,000 malformed heads: counted, and under 20 KB of log
                with no traceback
"""

from __future__ import annotations

import asyncio
import collections
import os
import time

from kvroute.loadgen.chaos.fleet import metric
from kvroute.loadgen.chaos.front_cases import CASES, KEY, FrontCase, observe
from kvroute.loadgen.chaos.httpraw import exchange, read_response
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.rss import MB, read_memory
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.loadgen.chaos.scenarios.boundaries import post_completion, until_up
from kvroute.router.contract.connections import LINGER_S, TRIM_DELAY_S, ConnectionLimits

BODY_TIMEOUT_S = 5.0
STALLED = 200
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
MEMORY_BACK_MB = 24  # RSS after the stalled bodies are gone, above RSS before
LIMITS = ConnectionLimits()  # the routers' own: the defaults
# RSS while they are held, above RSS before: the bodies being received, what each connection may
# read ahead of its handler, and 32 MB for the rest (200 stalled 1 MiB bodies took 200 MB)
MEMORY_PEAK = LIMITS.body_buffer_bytes + STALLED * LIMITS.connection_buffer_bytes + 32 * MB
IDLE_S = 3.0


def _router(ctx: Context, name: str, *flags: str):
    engines = [a for e in ctx.fleet.engines for a in ("--engine", e.url)]
    return ctx.fleet.spawn(name, ["router", *engines, *flags, "--log-level", "WARNING"])


async def _stall(port: int, address: str, data: bytes, wait_s: float) -> tuple[str, float | None]:
    """A connection that sends `data` and nothing more: what the router answered ("408", "503", ...;
    "closed" for no answer) and how long after the last byte went out (or the router refused it
    mid-way) it closed the connection; None: still open after `wait_s`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    answer, sent = "closed", None
    try:
        writer.write(data)
        await writer.drain()
        sent = time.monotonic()
        async with asyncio.timeout(wait_s):
            answer = str((await read_response(reader))[0])
            while await reader.read(1 << 16):
                pass
    except TimeoutError:
        return answer, None
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.transport.abort()
    return answer, time.monotonic() - (sent or time.monotonic())


async def _memory_while(proc, task: asyncio.Future) -> int:
    """The largest RSS of `proc` sampled until `task` is done."""
    peak = 0
    while not task.done():
        peak = max(peak, (read_memory(proc.pid) or (0, 0))[0])
        await asyncio.sleep(0.1)
    return peak


class StalledBodies:
    name = "stalled-bodies"
    summary = "200 stalled 1 MiB bodies and 200 stalled connections from 200 addresses: closed at the body timeout"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        proc = _router(ctx, "router-stall", "--max-connections", str(STALLED), "--body-timeout-s", str(BODY_TIMEOUT_S))
        try:
            await until_up(ctx, proc, routable=1)
            await self._stalled(ctx, out, proc)
        finally:
            proc.terminate(grace_s=5.0)
        return out

    async def _stalled(self, ctx: Context, out: Outcome, proc) -> None:
        bound = BODY_TIMEOUT_S + LINGER_S + 1.0
        memory = read_memory(proc.pid)
        assert memory is not None  # it runs (until_up saw it)
        before = memory[0]
        body = HEAD % MB + b" " * (MB - 1)
        held = asyncio.gather(*(_stall(proc.port, "127.0.0.1", body, bound + 10) for _ in range(STALLED)))
        peak = await _memory_while(proc, held)
        big = await held
        await asyncio.sleep(TRIM_DELAY_S + 1.0)  # the router gives the free heap back this long after
        memory = read_memory(proc.pid)
        assert memory is not None  # it runs (it answered the stalled bodies)
        after = memory[0]
        small = HEAD % MB + b" " * 1000
        spreading = [asyncio.ensure_future(_stall(proc.port, f"127.0.{1 + i // 250}.{2 + i % 250}", small, bound + 10))
                  for i in range(STALLED)]
        await asyncio.sleep(1.0)
        normal = [(await post_completion(ctx, proc.url, {"prompt": f"normal {i}", "max_tokens": 2}))[0]
                  for i in range(5)]
        spread = await asyncio.gather(*spreading)
        for kind, results in (("1 MiB bodies", big), ("from 200 addresses", spread)):
            late = [r for r in results if r[1] is None or r[1] > bound]
            out.require(not late, "stalled-bodies-closed", self.name,
                        f"{kind}: {len(late)} of {len(results)} not closed within {bound:g}s")
        out.require(normal == [200] * 5, "normal-client-served", self.name, f"answered {normal}")
        out.require(after - before <= MEMORY_BACK_MB * MB and peak - before <= MEMORY_PEAK, "memory-returns",
                    self.name, f"RSS {before / MB:.0f} -> peak {peak / MB:.0f} -> {after / MB:.0f} MB")
        for kind, results in (("200 x 1 MiB stalled", big), ("200 stalled from 200 addresses", spread)):
            closed = [t for _, t in results if t is not None]
            out.rows.append(Row(scenario=self.name, traffic=f"{kind} -> router", sent=len(results),
                                ok=sum(t <= bound for t in closed), statuses=_count(a for a, _ in results),
                                p50_ms=_ms(closed, 0.5), p99_ms=_ms(closed, 0.99),
                                detail={"rss_mb_before_peak_after": [round(before / MB), round(peak / MB),
                                                                     round(after / MB)],
                                        "normal_statuses": normal, "closed_within_s": bound}))


def _count(items) -> dict[str, int]:
    return dict(collections.Counter(items))  # a plain dict for the row's JSON, in first-seen order


def _ms(times: list[float], q: float) -> float | None:
    return round(1000 * sorted(times)[min(len(times) - 1, int(q * len(times)))]) if times else None


def _case(name: str) -> FrontCase:
    return next(c for c in CASES if c.name == name)


class Upgrades:
    name = "upgrades"
    summary = "h2c and websocket upgrades, CONNECT, alone and pipelined: all answered"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        proc = _router(ctx, "router-upgrades", "--api-key", KEY, "--idle-timeout-s", str(IDLE_S))
        try:
            await until_up(ctx, proc)  # /health: 200 once an engine is routable (/router/* needs the key)
            for name in ("h2c-upgrade", "websocket-upgrade", "get-h2c", "connect", "pipelined-h2c",
                         "pipelined-connect"):
                case = _case(name)
                seen = await asyncio.gather(*(observe("127.0.0.1", proc.port, case, IDLE_S) for _ in range(20)))
                bad = [s for s in seen if s != (case.statuses, case.after)]
                good = len(seen) - len(bad)
                out.require(not bad, "upgrades-answered", self.name,
                            f"{name}: {len(bad)} of {len(seen)} not {case.statuses} then {case.after}, e.g. {bad[:1]}")
                out.rows.append(Row(scenario=self.name, traffic=f"20 x {name} -> router", sent=len(seen), ok=good,
                                    statuses=_count("+".join(map(str, s)) + f" {a}" for s, a in seen)))
        finally:
            proc.terminate(grace_s=5.0)
        return out


class FrontCases:
    name = "front-cases"
    summary = "every hostile raw-byte case to a router: the answer the table gives"

    async def run(self, ctx: Context) -> Outcome:
        out = Outcome()
        flags = ("--api-key", KEY, "--header-timeout-s", "1", "--body-timeout-s", "1", "--idle-timeout-s", "2")
        proc = _router(ctx, "router-front-cases", *flags)
        try:
            await until_up(ctx, proc)
            log_size = os.path.getsize(proc.log_path)
            await self._table(out, proc)
            await self._malformed(ctx, out, proc, log_size)
        finally:
            proc.terminate(grace_s=5.0)
        return out

    async def _table(self, out: Outcome, proc) -> None:
        seen = await asyncio.gather(*(observe("127.0.0.1", proc.port, case, 2.0) for case in CASES))
        wrong = [f"{c.name}: {s}" for c, s in zip(CASES, seen) if s != (c.statuses, c.after)]
        out.require(not wrong, "front-cases", self.name, "; ".join(wrong))
        out.rows.append(Row(scenario=self.name, traffic=f"{len(CASES)} raw cases -> router", sent=len(CASES),
                            ok=len(CASES) - len(wrong), detail={"wrong": wrong}))

    async def _malformed(self, ctx: Context, out: Outcome, proc, log_size: int) -> None:
        """2,000 heads without Host after the table (whose malformed cases logged their reasons):
        counted each, and the log, from before the table, small and without a traceback."""
        name = "kvroute_router_malformed_requests_total"
        counted_before = await metric(ctx.session, proc.url, name) or 0
        bad = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"  # no Host
        statuses = []
        for _ in range(20):
            batch = await asyncio.gather(*(exchange("127.0.0.1", proc.port, bad, 1, wait_s=0) for _ in range(100)))
            statuses += [b.statuses[0] if b.statuses else 0 for b in batch]
        await asyncio.sleep(0.5)
        counted = (await metric(ctx.session, proc.url, name) or 0) - counted_before
        with open(proc.log_path, "rb") as f:
            f.seek(log_size)
            written = f.read()
        out.require(statuses == [400] * len(statuses) and counted == len(statuses) and len(written) < 20_000
                    and b"Traceback" not in written, "malformed-logged-once", self.name,
                    f"{len(statuses)} malformed heads, {statuses.count(400)} answered 400, {counted} counted, "
                    f"{len(written):,} bytes of log")
        out.rows.append(Row(scenario=self.name, traffic=f"{len(statuses):,} malformed heads -> router",
                            sent=len(statuses), ok=statuses.count(400), statuses=_count(map(str, statuses)),
                            detail={"log_bytes": len(written), "counted": counted}))
