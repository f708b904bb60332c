"""A lean closed-loop HTTP/1.1 load generator (wrk-like), for router latency benchmarks.

    python -m kvroute.benchmarks.http_load --url http://127.0.0.1:8000/v1/completions --body '{"prompt": ...}' \
        --concurrency 32 (--requests N | --duration S) [--warmup N] [--out result.json]

C keep-alive connections, each sending the same POST as soon as the previous answer is
complete (Content-Length or chunked), timed from the first byte written to the last byte
read. Raw asyncio protocols on uvloop: a few microseconds of client work per request,
so on a shared machine most of what it measures is the server. Prints one JSON line:
p50/p90/p99/max latency in ms, requests/s, non-2xx count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.parse
from typing import Any


class Conn(asyncio.Protocol):
    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buf = bytearray()
        self.done: Any = None  # the answer awaited now (an asyncio.Future), set by send
        self.transport: Any = None  # set by connection_made
        self.status = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection closed: {exc}"))

    def send(self) -> asyncio.Future:
        self.buf.clear()
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        return self.done

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1").lower()
        body = self.buf[end + 4:]
        if "transfer-encoding: chunked" in head:
            if not body.endswith(b"0\r\n\r\n"):
                return
        else:
            i = head.find("content-length:")
            if i < 0:
                return  # no framing we know: wait for the close
            n = int(head[i + 15:].split("\r\n", 1)[0])
            if len(body) < n:
                return
        self.status = int(head.split(" ", 2)[1])
        if not self.done.done():
            self.done.set_result(self.status)


async def run(url: str, body: bytes, concurrency: int, requests: int | None, duration: float | None,
              warmup: int) -> dict:
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    request = (f"POST {u.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(lambda: Conn(request), host, port))[1] for _ in range(concurrency)]
    for c in conns[:1] * warmup:
        await c.send()
    latencies: list[float] = []
    bad = 0
    sent = 0
    deadline = time.perf_counter() + duration if duration else float("inf")

    async def worker(c: Conn) -> None:
        nonlocal bad, sent
        while True:
            if requests is not None:
                if sent >= requests:
                    return
                sent += 1
            elif time.perf_counter() >= deadline:
                return
            t0 = time.perf_counter()
            status = await c.send()
            latencies.append(time.perf_counter() - t0)
            bad += not 200 <= status < 300

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - t0
    for c in conns:
        c.transport.close()
    xs = sorted(latencies)

    def pct(q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3

    return {"requests": len(xs), "non_2xx": bad, "rps": len(xs) / wall, "p50_ms": pct(0.5), "p90_ms": pct(0.9),
            "p99_ms": pct(0.99), "max_ms": xs[-1] * 1e3, "mean_ms": statistics.fmean(xs) * 1e3}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--body", required=True, help="the JSON body to POST")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--warmup", type=int, default=0)
    args = p.parse_args(argv)
    if (args.requests is None) == (args.duration is None) or args.concurrency < 1:
        print("http_load: give one of --requests or --duration, and --concurrency >= 1", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        result = asyncio.run(run(args.url, args.body.encode(), args.concurrency, args.requests, args.duration,
                                 args.warmup))
    except (OSError, ConnectionError) as e:
        print(f"http_load: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
