"""Engine TTFT over HTTP: torch runner vs the sim runner's cost model, on the same requests.

    python -m kvroute.benchmarks.engine --out bench_engine.json [--reps 5]

Starts one torch engine and one sim engine (1 thread, loopback), sends each the same
streamed requests (a 2048-token prompt with 0, 1024 and 1792 tokens already cached,
plus a few uncached prompts of other lengths) one at a time, and reports median TTFT
per case for both and the sim's relative error (its calibration error end to end).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time

import aiohttp

from kvroute.benchmarks.results import reps_parser, write_json
from kvroute.loadgen.processes import Processes

LENGTHS = (256, 512, 1024)


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 8192) for _ in range(n)]


def cases(rep: int) -> list[tuple[str, list[int], list[int] | None]]:
    """(name, prompt, warm-up prompt that caches its prefix or None)."""
    base = 1000 * (rep + 1)
    out = []
    for cached in (0, 1024, 1792):
        prompt = tokens(base + cached, 2048)
        warm = prompt[:cached] + tokens(base + cached + 1, 16) if cached else None
        out.append((f"2048 tokens, {cached} cached", prompt, warm))
    out += [(f"{n} tokens, 0 cached", tokens(base + 7 + n, n), None) for n in LENGTHS]
    return out


async def ttft(session: aiohttp.ClientSession, url: str, prompt: list[int]) -> tuple[float, int]:
    body = {"prompt": prompt, "max_tokens": 1, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    first, cached = None, 0
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter() - t0
            if b'"cached_tokens"' in line:
                cached = json.loads(line[6:])["usage"]["prompt_tokens_details"]["cached_tokens"]
    if first is None:
        raise RuntimeError(f"{url} answered HTTP {r.status} with no token")
    return first, cached


async def measure(reps: int) -> dict[str, dict[str, list]]:
    """case -> {backend: TTFTs, backend_cached: cached tokens}, the two engines taking turns per repetition."""
    results: dict[str, dict[str, list]] = {}
    with Processes() as procs:
        urls = {b: procs.server(b, "engine", "--backend", b, "--num-threads", "1") for b in ("torch", "sim")}
        for url in urls.values():
            await procs.wait_ready(url)
        async with aiohttp.ClientSession() as session:
            for rep in range(reps):
                for backend, url in urls.items():
                    for name, prompt, warm in cases(rep):
                        if warm:
                            await ttft(session, url, warm)
                        t, cached = await ttft(session, url, prompt)
                        results.setdefault(name, {}).setdefault(backend, []).append(t)
                        results[name].setdefault(f"{backend}_cached", []).append(cached)
    return results


def main(argv: list[str] | None = None) -> int:
    args = reps_parser(__doc__).parse_args(argv)
    results = asyncio.run(measure(args.reps))
    rows = []
    print(f"{'case':<28} {'torch ms':>9} {'sim ms':>9} {'sim err':>8}  cached")
    for name, r in results.items():
        t, s = statistics.median(r["torch"]), statistics.median(r["sim"])
        rows.append({"case": name, "torch_ttft_s": t, "sim_ttft_s": s, "rel_error": (s - t) / t,
                     "cached_tokens": int(statistics.median(r["torch_cached"]))})
        print(f"{name:<28} {t * 1e3:9.1f} {s * 1e3:9.1f} {(s - t) / t:8.1%}  {rows[-1]['cached_tokens']}")
    by = {r["case"]: r for r in rows}
    ratio = by["2048 tokens, 0 cached"]["torch_ttft_s"] / by["2048 tokens, 1792 cached"]["torch_ttft_s"]
    med_err = statistics.median(abs(r["rel_error"]) for r in rows)
    print(f"torch TTFT ratio 0-cached / 1792-cached: {ratio:.2f}x; sim median |error| {med_err:.1%}")
    write_json(args.out, {"rows": rows, "ratio_0_over_1792": ratio, "sim_median_abs_error": med_err})
    return 0


if __name__ == "__main__":
    sys.exit(main())
