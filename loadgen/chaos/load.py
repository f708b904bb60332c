"""Steady background load through the routers, with a load balancer's failover, and the
accounting of every request into the row (`Tally`) of the scenario it started in.

Requests alternate streamed and non-streamed completions (token-id prompts sharing a few
prefixes, so the index matters) and chat completions (text, so the router tokenizes).
The client picks routers round robin; a router that refuses the connection, or resets or
closes it before any answer (a keep-alive connection closed by a router shutting down),
is skipped for `down_s` and the request goes to the next one, as a load balancer with
passive health checks and retry-on-reset would do: that is a `failover`, not a loss.

Outcomes, exactly one per request:
    ok       200 and a complete answer (a stream up to [DONE] without an error event)
    lost     ended before its first byte: any other status, no router reachable, timeout
    broken   a stream that had started and then carried an error event or was cut
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import time

import aiohttp
import orjson

from kvroute.loadgen.chaos.rows import Row

MAX_EXAMPLES = 5
LONG_TOKENS = 512  # ~0.8 s at the chaos engines' time scale


@dataclasses.dataclass
class Tally:
    scenario: str
    traffic: str = "background load"
    sent: int = 0
    ok: int = 0
    lost: int = 0
    broken: int = 0
    failovers: int = 0
    first_failover_at: float | None = None  # time.monotonic() of the first
    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ttfts: list = dataclasses.field(default_factory=list)
    examples: list = dataclasses.field(default_factory=list)  # why the first lost/broken ones ended
    inflight: int = 0
    streaming: int = 0  # streams between their first byte and their end
    peak_streaming: int = 0
    skipped: int = 0  # not sent: the client already had max_inflight requests open (its own limit)

    def end(self, outcome: str, status: str, why: str = "") -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.statuses[status] += 1
        if outcome != "ok" and len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{outcome} ({status}): {why[:200]}")

    def to_row(self) -> Row:
        return Row(scenario=self.scenario, traffic=self.traffic, sent=self.sent, ok=self.ok, lost=self.lost,
                   broken=self.broken, statuses=dict(self.statuses),
                   five_xx=sum(v for k, v in self.statuses.items() if k[:1] == "5"), failovers=self.failovers,
                   p50_ms=self.ttft_ms(0.5), p99_ms=self.ttft_ms(0.99),
                   detail={"examples": self.examples, "peak_streaming": self.peak_streaming,
                           "skipped_by_client": self.skipped})

    def ttft_ms(self, q: float) -> float | None:
        if not self.ttfts:
            return None
        ordered = sorted(self.ttfts)
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


class Prompts:
    """Token-id prompts over a few shared prefixes, and chat texts; deterministic per seed."""

    def __init__(self, seed: int, groups: int = 8, prefix_tokens: int = 256, tail_tokens: int = 16) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(100, 8000) for _ in range(prefix_tokens)] for _ in range(groups)]
        self.tail_tokens = tail_tokens
        self.count = 0

    def body(self, stream: bool, max_tokens: int) -> tuple[str, bytes]:
        """Every fifth request is long (LONG_TOKENS), so a fault always finds some in flight."""
        self.count += 1
        group = self.prefixes[self.count % len(self.prefixes)]
        long = self.count % 5 == 0
        common = {"max_tokens": LONG_TOKENS if long else max_tokens, "ignore_eos": True, "stream": stream}
        if self.count % 4 == 3:
            text = f"Question {self.count}: " + " ".join(str(t) for t in group[:64])
            return "/v1/chat/completions", orjson.dumps({"messages": [{"role": "user", "content": text}], **common})
        tail = [self.rng.randrange(100, 8000) for _ in range(self.tail_tokens)]
        return "/v1/completions", orjson.dumps({"prompt": group + tail, **common})

    def hot_prompt(self) -> list[int]:
        """A prompt whose prefix the load keeps cached (for /router/explain checks)."""
        return self.prefixes[0] + [1] * self.tail_tokens


def _count(tally: Tally) -> None:
    tally.sent += 1
    tally.inflight += 1


class LoadClient:
    def __init__(self, session: aiohttp.ClientSession, routers: list[str], prompts: Prompts, rate: float,
                 max_tokens: int = 8, timeout_s: float = 30.0, max_inflight: int = 512, down_s: float = 1.0) -> None:
        self.session, self.routers, self.prompts = session, routers, prompts
        self.rate, self.max_tokens, self.timeout_s = rate, max_tokens, timeout_s
        self.max_inflight, self.down_s = max_inflight, down_s
        self.tally = Tally("warm-up")
        self._next = 0
        self._down_until: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()

    def begin(self, scenario: str) -> Tally:
        """From now on background requests count in a new row of `scenario`."""
        self.tally = Tally(scenario)
        return self.tally

    async def run(self) -> None:
        """Send at `rate` per second until cancelled."""
        interval, due = 1.0 / self.rate, time.monotonic()
        while True:
            due += interval
            if len(self._tasks) < self.max_inflight:
                self.spawn(self.tally, stream=self.prompts.count % 2 == 0)
            else:
                self.tally.skipped += 1
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    def spawn(self, tally: Tally, stream: bool) -> asyncio.Task:
        path, body = self.prompts.body(stream, self.max_tokens)
        _count(tally)  # now, not when the task first runs: a drain that follows at once must wait for it
        task = asyncio.ensure_future(self._counted(tally, path, body, stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, tally: Tally, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while tally.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _order(self, routers: list[str]) -> list[str]:
        self._next += 1
        start = self._next % len(routers)
        ring = routers[start:] + routers[:start]
        now = time.monotonic()
        return sorted(ring, key=lambda r: self._down_until.get(r, 0.0) > now)  # routers marked down go last

    async def send(self, tally: Tally, path: str, body: bytes, stream: bool, routers: list[str] | None = None):
        _count(tally)
        await self._counted(tally, path, body, stream, routers)

    async def _counted(self, tally: Tally, path: str, body: bytes, stream: bool, routers: list[str] | None = None):
        """A request counted as sent and in flight: it ends in the tally whatever happens."""
        t0 = time.monotonic()
        try:
            await self._send(tally, path, body, stream, routers or self.routers, t0)
        except TimeoutError:
            tally.end("lost", "timeout", f"no answer within {self.timeout_s:g}s")
        except Exception as e:  # noqa: BLE001 - every request ends in the tally, whatever broke
            tally.end("lost", "client", f"{type(e).__name__}: {e}")
        finally:
            tally.inflight -= 1

    async def _send(self, tally: Tally, path: str, body: bytes, stream: bool, routers: list[str], t0: float):
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        why = "no router"
        for i, router in enumerate(self._order(routers)):
            try:
                resp = await self.session.post(router + path, data=body, timeout=timeout,
                                               headers={"Content-Type": "application/json"})
            except aiohttp.ClientConnectionError as e:  # refused, reset or closed before any answer
                self._down_until[router] = time.monotonic() + self.down_s
                why = f"{router}: {type(e).__name__}"
                if i + 1 < len(routers):
                    tally.failovers += 1
                    tally.first_failover_at = tally.first_failover_at or time.monotonic()
                continue
            except aiohttp.ClientError as e:
                return tally.end("lost", "conn", f"{router}: {e!r}")
            async with resp:
                return await self._read(tally, resp, stream, t0)
        tally.end("lost", "conn", why)

    async def _read(self, tally: Tally, resp: aiohttp.ClientResponse, stream: bool, t0: float) -> None:
        if resp.status != 200:
            return tally.end("lost", str(resp.status), (await resp.read()).decode(errors="replace"))
        if not stream:
            try:
                data = await resp.json(content_type=None)
            except (aiohttp.ClientError, ValueError) as e:
                return tally.end("lost", "cut", repr(e))
            tally.ttfts.append(time.monotonic() - t0)
            return tally.end("ok" if data.get("choices") else "lost", "200", str(data)[:200])
        await self._read_stream(tally, resp, t0)

    async def _read_stream(self, tally: Tally, resp: aiohttp.ClientResponse, t0: float) -> None:
        started = done = False
        error = ""
        try:
            async for line in resp.content:
                if not started and line.strip():
                    started = True
                    tally.ttfts.append(time.monotonic() - t0)
                    tally.streaming += 1
                    tally.peak_streaming = max(tally.peak_streaming, tally.streaming)
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b'data: {"error"'):
                    error = line.decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:  # ValueError: a line too long
            error = error or repr(e)
        finally:
            tally.streaming -= started
        if not started:
            return tally.end("lost", "cut", error or "empty stream")
        if done and not error:
            return tally.end("ok", "200")
        tally.end("broken", "200", error or "stream ended without [DONE]")
