"""Send the malformed bodies, judge every answer, keep the evidence.

An answer is right when it is a 4xx whose body is an OpenAI error object
(`{"error": {"message": str, "type": str, "code": ...}}`, Content-Type JSON), or, for a
case that expects it, a 200 with the field stripped. A 5xx, a non-JSON body, another
shape, a 2xx for bad input, a closed connection or no answer within the timeout is a
failure, named with the case in the report.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence

import orjson

from kvroute.loadgen.chaos.fuzz_cases import FuzzCase
from kvroute.loadgen.chaos.httpraw import RawResponse, send

MAX_FAILURES_KEPT = 20


def openai_error_problem(resp: RawResponse) -> str | None:
    if "json" not in resp.headers.get("content-type", ""):
        return f"HTTP {resp.status} with Content-Type {resp.headers.get('content-type')!r}"
    try:
        error = orjson.loads(resp.body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return f"HTTP {resp.status} with a body that is not a JSON object: {resp.body[:80]!r}"
    if not (isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]
            and isinstance(error.get("type"), str) and "code" in error):
        return f"HTTP {resp.status} without an OpenAI error object: {resp.body[:120]!r}"
    return None


def judge(case: FuzzCase, resp: RawResponse) -> str | None:
    """None when the answer is right, else what is wrong with it."""
    if resp.status is None:
        if case.expect == "4xx-or-close" and resp.error and resp.error.startswith("closed"):
            return None
        return resp.error or "no answer"
    if case.expect == "stripped":
        if resp.status != 200:
            return f"HTTP {resp.status} for a request whose kv_transfer_params should have been dropped"
        if b"kv_transfer_params" in resp.body:
            return "the answer carries kv_transfer_params: the client's field reached the engine"
        return None
    if not 400 <= resp.status < 500:
        return f"HTTP {resp.status} for bad input: {resp.body[:120]!r}"
    return openai_error_problem(resp)


@dataclasses.dataclass
class FuzzReport:
    target: str
    sent: int = 0
    as_expected: int = 0
    five_xx: int = 0
    no_answer: int = 0
    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_category: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    failures: list[str] = dataclasses.field(default_factory=list)
    elapsed: list = dataclasses.field(default_factory=list)
    slowest_s: float = 0.0
    slowest_case: str = ""
    huge_max_s: float = 0.0  # slowest answer to a 50 MB body

    def add(self, case: FuzzCase, resp: RawResponse) -> None:
        self.sent += 1
        if resp.status is not None:
            status = str(resp.status)
        else:
            status = "closed" if (resp.error or "").startswith("closed") else "no answer"
        self.statuses[status] += 1
        self.by_category[case.category][status] += 1
        self.five_xx += resp.status is not None and resp.status >= 500
        self.no_answer += resp.status is None
        self.elapsed.append(resp.elapsed_s)
        if resp.elapsed_s > self.slowest_s:
            self.slowest_s, self.slowest_case = resp.elapsed_s, f"{case.category}: {case.name}"
        if case.category == "huge" and "50 MB" in case.name:
            self.huge_max_s = max(self.huge_max_s, resp.elapsed_s)
        problem = judge(case, resp)
        if problem is None:
            self.as_expected += 1
        elif len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append(f"{case.category}: {case.name}: {problem}")


async def run_fuzz(cases: Iterable[FuzzCase], target: str, host: str, port: int, concurrency: int = 8,
                   timeout_s: float = 10.0, progress: Callable[[FuzzReport], None] | None = None) -> FuzzReport:
    report = FuzzReport(target)
    queue = collections.deque(cases)

    async def worker() -> None:
        while queue:
            case = queue.popleft()
            report.add(case, await send(host, port, case.request, timeout_s))
            if progress is not None and report.sent % 500 == 0:
                progress(report)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return report


def sample(cases: Sequence[FuzzCase], n: int, rng: random.Random) -> list[FuzzCase]:
    """About `n` cases spread over every category (each keeps at least its share, and one);
    `huge` and `deep` cases are always kept whole."""
    if n >= len(cases):
        return list(cases)
    groups: dict[str, list[FuzzCase]] = collections.defaultdict(list)
    for case in cases:
        groups[case.category].append(case)
    out = []
    for category, group in groups.items():
        keep = len(group) if category in ("huge", "deep") else max(1, round(n * len(group) / len(cases)))
        out += rng.sample(group, min(keep, len(group)))
    return out


class Canary:
    """A listener that counts connections: every grant and handle in the fuzz points here."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None  # asked after start()
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> Canary:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
