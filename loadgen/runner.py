"""Run a workload against a target: `await run_load(LoadConfig(...), workload)` -> LoadResult.

One asyncio task per request. Open loop: session starts (requests without
`after`) are sent at their arrival times whether or not earlier ones finished.
Closed loop: at most `concurrency` requests in flight. Fixed: each request's own
`arrival_s` (trace replay). A multi-turn follow-up is sent `think_s` after the
request it follows finished (in closed loop it then also waits for a free slot).
With `duration_s`, nothing new is sent after that many seconds; requests in
flight finish. Setting `stop` (Ctrl-C) cancels what is in flight and returns the
requests that completed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

import aiohttp

from kvroute.loadgen.arrivals import ArrivalConfig, arrival_times
from kvroute.loadgen.client import APIS, PROMPT_FORMATS, normalize_target, probe_target, request_body, send_request
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.workload_base import RequestSpec, Workload
from kvroute.loadgen.workloads.content import check_number


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    target: str
    arrival: ArrivalConfig = ArrivalConfig(concurrency=1)
    duration_s: float | None = None
    model: str | None = None  # None: the first model the target lists (or none)
    api: str = "completions"
    prompt_format: str = "tokens"
    request_timeout_s: float = 300.0
    seed: int = 0  # arrival process seed
    temperature: float | None = None  # sent with every request when set (0: greedy)
    priority: int | None = None  # sent as the body's `priority` (vLLM's field) when set
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request (an API key, a tenant header)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        if self.duration_s is not None:
            check_number("duration", self.duration_s, 0.0, strict=True)
        check_number("request_timeout", self.request_timeout_s, 0.0, strict=True)
        if self.temperature is not None:
            check_number("temperature", self.temperature)


@dataclasses.dataclass
class LoadResult:
    records: list[RequestRecord]  # completed requests (ok or not), by index
    duration_s: float  # from the first send to the last completion
    model: str | None
    workload_info: dict
    arrival: str
    interrupted: bool = False
    unsent: int = 0
    arrival_mode: str = ""  # "open", "closed" or "fixed" (loadgen/arrivals.py)

    def summary(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
        out = summarize(self.records, duration_s=self.duration_s, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
        out.update(arrival=self.arrival, arrival_mode=self.arrival_mode, interrupted=self.interrupted,
                   unsent=self.unsent, workload_info=self.workload_info)
        return out


class _Run:
    def __init__(self, config: LoadConfig, specs: list[RequestSpec], session, url: str, make_body, progress):
        self.config, self.session, self.url, self.make_body, self.progress = config, session, url, make_body, progress
        self.starts = [s for s in specs if s.after is None]
        self.followers: dict[int, list[RequestSpec]] = collections.defaultdict(list)
        for s in specs:
            if s.after is not None:
                self.followers[s.after].append(s)
        concurrency = config.arrival.concurrency  # given: a closed loop
        self.slots = asyncio.Semaphore(concurrency) if concurrency is not None else None
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def open(self) -> bool:
        return self.config.duration_s is None or self.elapsed() < self.config.duration_s

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)

    async def request(self, spec: RequestSpec, planned: float | None, slot_held: bool = False) -> None:
        try:
            if self.slots is not None and not slot_held:
                await self.slots.acquire()
                slot_held = True
            if not self.open():
                return
            record = RequestRecord(index=spec.index, group=spec.group, planned_s=planned,
                                   prompt_tokens=len(spec.prompt_ids))
            await send_request(self.session, self.url, self.make_body(spec), record, self.t0,
                               self.config.request_timeout_s, self.config.headers)
        finally:
            if slot_held:
                assert self.slots is not None  # a slot is held only in a closed loop
                self.slots.release()
        self.records.append(record)
        if self.progress is not None:
            self.progress.add(record)
        for follower in self.followers.get(spec.index, ()):
            self.spawn(self.follow(follower, record.end_s + follower.think_s))

    async def follow(self, spec: RequestSpec, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self.elapsed()))
        await self.request(spec, None if self.slots is not None else at)

    async def dispatch(self) -> None:
        arrival = self.config.arrival
        if arrival.mode == "closed":
            assert self.slots is not None  # a closed loop has its slots
            for spec in self.starts:
                await self.slots.acquire()
                if not self.open():
                    self.slots.release()
                    return
                self.spawn(self.request(spec, None, slot_held=True))
            return
        if arrival.mode == "open":
            assert arrival.rate is not None  # an open loop has its rate
            times = arrival_times(arrival.rate, arrival.burstiness, len(self.starts), self.config.seed)
        else:
            times = [s.arrival_s for s in self.starts if s.arrival_s is not None]  # all have one (run_load checked)
        for spec, at in zip(self.starts, times):
            delay = at - self.elapsed()
            if delay > 0:
                await asyncio.sleep(delay)
            if not self.open():
                return
            self.spawn(self.request(spec, at))

    async def run(self, stop: asyncio.Event | None) -> bool:
        """Run to completion; True if `stop` interrupted it."""
        dispatcher = asyncio.ensure_future(self.dispatch())
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            while True:
                pending = {t for t in self.tasks if not t.done()}
                if not dispatcher.done():
                    pending.add(dispatcher)
                if not pending:
                    break
                waiting = pending | ({stopper} if stopper else set())
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if stopper is not None and stopper.done():
                    return True
            for task in self.tasks | {dispatcher}:
                task.result()  # surface bugs instead of losing them
            return False
        finally:
            leftovers = [t for t in (*self.tasks, dispatcher, stopper) if t is not None and not t.done()]
            for task in leftovers:
                task.cancel()
            await asyncio.gather(*leftovers, return_exceptions=True)


def _body_maker(config: LoadConfig, model: str | None):
    tokenizer = None
    if config.api == "chat" or config.prompt_format == "text":
        from kvroute.router.contract.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
    return lambda spec: request_body(spec, model, config.api, config.prompt_format, tokenizer, config.temperature,
                                     config.priority)


async def run_load(config: LoadConfig, workload: Workload, progress=None, stop: asyncio.Event | None = None,
                   session: aiohttp.ClientSession | None = None) -> LoadResult:
    """Probe the target (TargetError if unreachable), then run the workload; see the module docstring."""
    own_session = session is None
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        target = normalize_target(config.target)
        model = config.model or await probe_target(session, target)
        if config.model:
            await probe_target(session, target)
        specs = workload.requests()
        if config.arrival.mode == "fixed" and any(s.arrival_s is None for s in specs if s.after is None):
            raise ValueError(f"workload {workload.name} has no send times of its own; give --rate or --concurrency")
        run = _Run(config, specs, session, target + APIS[config.api], _body_maker(config, model), progress)
        if progress is not None:
            progress.start(len(specs))
        try:
            interrupted = await run.run(stop)
        finally:
            if progress is not None:
                await progress.close()
    finally:
        if own_session:
            await session.close()
    records = sorted(run.records, key=lambda r: r.index)
    end = max((r.end_s for r in records), default=run.elapsed())
    info = workload.info() if hasattr(workload, "info") else {"workload": workload.name}
    return LoadResult(records, end, model, info, config.arrival.describe(), interrupted, len(specs) - len(records),
                      config.arrival.mode)
