"""`kvroute bench --tiers`: the session-recovery storm on the same engines, once per tier setup.

Runs, each on a fresh cluster (kv_aware router, greedy sampling so outputs compare):

    device       the device pool only: returning sessions are recomputed
    host         + a host pool per engine (--host-blocks)
    host+redis   + a shared Redis store (a redis-server started for the run)
    host+file    + a shared file store (a fresh temporary directory)

Reported per run, over the returning requests (the storm): TTFT p50/p90/p99,
cached tokens by tier, errors, how many outputs equal the device-only run's; and
over the engines (their /metrics after the run): recoveries by choice and bytes
moved, seconds and GB/s per direction (d2h, h2d, store_write, store_read), and the
bytes recovery moved over the bytes it needed (1.0: nothing moved in vain).
`--tier-runs` picks a subset (device first).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence

import aiohttp

from kvroute.loadgen.local_cluster import ClusterSpec
from kvroute.loadgen.record import as_record
from kvroute.loadgen.report import Run
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.workloads.session_storm import is_return

TIER_RUNS = ("device", "host", "host+redis", "host+file")
TIER_SIZING = {"torch": {"engines": 4, "num_blocks": 512, "host_blocks": 4096},
               "sim": {"engines": 4, "num_blocks": 512, "host_blocks": 4096}}
STORM_DEFAULTS = {"sessions": 32, "context_tokens": 3072, "min_context_tokens": 2048, "burst": 32,
                  "burst_spread": 2.0}


@contextlib.contextmanager
def tier_stores(run: str) -> Iterator[tuple[str, ...]]:
    """The engine flags that give `run` its store, alive for the run (a redis-server or a temp dir)."""
    if run.endswith("redis"):
        from kvroute.loadgen.redis_server import RedisServer

        server = RedisServer()
        try:
            yield ("--kv-store", server.url)
        finally:
            server.stop()
    elif run.endswith("file"):
        root = tempfile.mkdtemp(prefix="kvroute-kvstore-")
        try:
            yield ("--kv-store", "file://" + root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    else:
        yield ()


def tier_spec(args, run: str, store_args: tuple[str, ...]) -> ClusterSpec:
    host = ("--host-blocks", str(args.host_blocks)) if run != "device" else ()
    return ClusterSpec(engines=args.engines, backend=args.backend, num_blocks=args.num_blocks, policy="kv_aware",
                       engine_args=(*host, *store_args, *args.engine_arg), router_args=tuple(args.router_arg))


async def engine_metrics(engine_urls: Sequence[str]) -> dict[str, float]:
    """Every sample of the engines' /metrics summed over engines: "name" or "name{label=value,...}" (sorted
    labels, model_name dropped) -> value."""
    totals: dict[str, float] = collections.defaultdict(float)
    async with aiohttp.ClientSession() as session:
        for url in engine_urls:
            async with session.get(url + "/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line and not line.startswith("#"):
                        sample, _, value = line.rpartition(" ")
                        totals[_sample_key(sample)] += float(value)
    return dict(totals)


def _sample_key(sample: str) -> str:
    name, _, rest = sample.partition("{")
    labels = sorted(p for p in rest.rstrip("}").split(",") if p and not p.startswith("model_name="))
    return f"{name}{{{','.join(labels)}}}" if labels else name


def _labelled(metrics: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """{label value: sample} of metric `name`'s samples that carry `label`."""
    out = {}
    prefix = f"{name}{{{label}="
    for key, value in metrics.items():
        if key.startswith(prefix):
            out[key[len(prefix):].split(",", 1)[0].rstrip("}").strip('"')] = value
    return out


def tier_metrics(metrics: Mapping[str, float]) -> dict:
    moved = _labelled(metrics, "kvroute_engine_kv_transfer_bytes_total", "direction")
    seconds = _labelled(metrics, "kvroute_engine_kv_transfer_seconds_total", "direction")
    return {
        "recoveries": _labelled(metrics, "kvroute_engine_kv_recoveries_total", "choice"),
        "recovered_blocks": _labelled(metrics, "kvroute_engine_kv_recovered_blocks_total", "choice"),
        "ahead_copies": _labelled(metrics, "kvroute_engine_kv_ahead_copies_total", "outcome"),
        "bytes": moved,
        "gb_per_s": {d: moved[d] / seconds[d] / 1e9 for d in moved if seconds.get(d)},
        "recovery_moved_over_needed": (metrics.get("kvroute_engine_kv_recovery_moved_bytes_total", 0.0)
                                       / metrics["kvroute_engine_kv_recovery_needed_bytes_total"])
        if metrics.get("kvroute_engine_kv_recovery_needed_bytes_total") else None,
        "store_errors": _labelled(metrics, "kvroute_engine_kv_store_errors_total", "op"),
    }


def storm_summary(run: Run, reference: Run | None) -> dict:
    """The summary of the returning requests, with output agreement against `reference` (device only)."""
    records = [as_record(r) for r in run.records]
    returns = [r for r in records if is_return(r.group)]
    out = summarize(returns)
    out["all_requests"] = summarize(records)["requests"]
    out["all_errors"] = summarize(records)["errors"]
    if reference is not None:
        want = {r.index: r.output_digest for r in map(as_record, reference.records) if is_return(r.group)}
        out["outputs_equal_device"] = sum(1 for r in returns if r.ok and r.output_digest == want.get(r.index))
    return out


def _ms(summary: dict, key: str) -> str:
    return "-" if summary.get(key) is None else f"{summary[key] * 1e3:.0f} ms"


def tier_table(runs: Sequence[Run]) -> str:
    head = ("| run | storm TTFT p50 | p90 | p99 | errors (all requests) | cached by tier (storm) | "
            "outputs = device | recoveries (runs) | moved (GB/s) | recovery moved / needed |")
    lines = [head, "|---" * 10 + "|"]
    for run in runs:
        s, t = run.summary, run.summary.get("tiers") or {}
        ms = functools.partial(_ms, s)
        cached = ", ".join(f"{k} {v}" for k, v in (s.get("cached_tokens_by_tier") or {}).items() if v) or "-"
        runs_ = ", ".join(f"{k} {v:.0f}" for k, v in sorted((t.get("recoveries") or {}).items())) or "-"
        moved = ", ".join(f"{d} {b / 1e6:.0f} MB ({t['gb_per_s'].get(d, 0):.2f})"
                          for d, b in (t.get("bytes") or {}).items() if b) or "-"
        equal = "-" if s.get("outputs_equal_device") is None else f"{s['outputs_equal_device']}/{s['requests']}"
        ratio = "-" if t.get("recovery_moved_over_needed") is None else f"{t['recovery_moved_over_needed']:.3f}"
        lines.append(f"| {run.name} | {ms('ttft_p50_s')} | {ms('ttft_p90_s')} | {ms('ttft_p99_s')} | "
                     f"{s['all_errors']} of {s['all_requests']} | {cached} | {equal} | {runs_} | {moved} | {ratio} |")
    return "\n".join(lines)
