"""Where each policy's latency comes from: per engine instance, how loaded it was while serving.

    python -m kvroute.benchmarks.load_by_instance DIR [--out FILE.json]

DIR is a `kvroute bench`/`kvroute demo` output directory (runs/NAME/requests.jsonl). For every
run and instance: requests served, shared-prefix groups served, TTFT p50, TPOT p50, the mean
number of other requests in flight on the same instance while a request was decoding (from its
first token to its end), and the mean number of prefills running anywhere in the cluster
meanwhile (requests between their send and their first token, on any instance). On one machine
the engines share its cores, so a decode slows down both when its own instance is busy
(a step serves every running sequence) and when other instances prefill.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np


def overlap_count(r: dict, others: list[dict], prefill_only: bool = False) -> int:
    """Other requests in flight (or, prefill_only, prefilling) during r's decode."""
    start, end = r["send_s"] + r["ttft_s"], r["send_s"] + r["e2e_s"]
    return sum(1 for o in others if o is not r and o["send_s"] < end
               and o["send_s"] + (o["ttft_s"] if prefill_only else o["e2e_s"]) > start)


def prefills_during_prefill(r: dict, others: list[dict]) -> int:
    """Other requests prefilling (between their send and first token) while r waited for its first token."""
    start, end = r["send_s"], r["send_s"] + r["ttft_s"]
    return sum(1 for o in others if o is not r and o["send_s"] < end and o["send_s"] + o["ttft_s"] > start)


def corr(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    return float(np.corrcoef(xs, ys)[0, 1]) if len(xs) > 2 and np.std(xs) > 0 and np.std(ys) > 0 else None


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def analyse(records: list[dict]) -> dict:
    ok = [r for r in records if r.get("status") == 200 and not r.get("error") and r.get("ttft_s") is not None]
    out: dict[str, dict[str, Any]] = {}
    for inst in sorted({r["instance"] for r in ok}):
        mine = [r for r in ok if r["instance"] == inst]
        out[inst] = {
            "requests": len(mine),
            "groups": len({r["group"] for r in mine}),
            "ttft_p50_ms": median([r["ttft_s"] * 1000 for r in mine]),
            "tpot_p50_ms": median([r["tpot_s"] * 1000 for r in mine if r.get("tpot_s") is not None]),
            "decode_concurrency": float(np.mean([overlap_count(r, mine) for r in mine])),
            "cluster_prefills": float(np.mean([overlap_count(r, ok, prefill_only=True) for r in mine])),
        }
    allr = [r for r in ok if r.get("tpot_s") is not None]
    conc = [overlap_count(r, [o for o in ok if o["instance"] == r["instance"]]) for r in allr]
    prefills = [overlap_count(r, ok, prefill_only=True) for r in allr]
    tpots = [r["tpot_s"] for r in allr]
    out["all"] = {"requests": len(ok), "groups": "", "ttft_p50_ms": median([r["ttft_s"] * 1000 for r in ok]),
                  "tpot_p50_ms": median([t * 1000 for t in tpots]),
                  "decode_concurrency": float(np.mean(conc)) if conc else 0.0,
                  "cluster_prefills": float(np.mean(prefills)) if prefills else 0.0,
                  "corr_tpot_concurrency": corr(conc, tpots), "corr_tpot_cluster_prefills": corr(prefills, tpots),
                  "tpot_p50_ms_no_prefill": median([t * 1000 for t, n in zip(tpots, prefills) if n == 0]),
                  "tpot_p50_ms_with_prefill": median([t * 1000 for t, n in zip(tpots, prefills) if n > 0]),
                  "share_with_prefill": float(np.mean([n > 0 for n in prefills])) if prefills else None}
    hits = [r for r in ok if r.get("cached_tokens") and r["cached_tokens"] >= 0.5 * r["prompt_tokens"]]
    busy = [prefills_during_prefill(r, ok) for r in hits]
    out["all"].update(
        hit_ttft_p50_ms_alone=median([r["ttft_s"] * 1000 for r, n in zip(hits, busy) if n == 0]),
        hit_ttft_p50_ms_with_other_prefills=median([r["ttft_s"] * 1000 for r, n in zip(hits, busy) if n > 0]),
        hit_share_with_other_prefills=float(np.mean([n > 0 for n in busy])) if busy else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="a kvroute bench or demo output directory")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    root = pathlib.Path(args.dir)
    results = {}
    for run in json.loads((root / "results.json").read_text()):
        lines = (root / "runs" / run["name"] / "requests.jsonl").read_text().splitlines()
        results[run["name"]] = analyse([json.loads(line) for line in lines])
    print(f"{'run':<12} {'instance':<8} {'req':>4} {'groups':>6} {'TTFT p50':>9} {'TPOT p50':>9} "
          f"{'same-instance':>13} {'cluster prefills':>16}")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for name, per in results.items():
        for inst, row in per.items():
            print(f"{name:<12} {inst:<8} {row['requests']:>4} {row['groups']:>6} {row['ttft_p50_ms']:>6.0f} ms "
                  f"{row['tpot_p50_ms']:>6.1f} ms {row['decode_concurrency']:>13.2f} {row['cluster_prefills']:>16.2f}")
        a = per["all"]
        print(f"{'':<12} corr(TPOT, same-instance) {fmt(a['corr_tpot_concurrency'])}, "
              f"corr(TPOT, cluster prefills) {fmt(a['corr_tpot_cluster_prefills'])}; TPOT p50 with no prefill "
              f"anywhere during the decode {fmt(a['tpot_p50_ms_no_prefill'])} ms, with one or more "
              f"{fmt(a['tpot_p50_ms_with_prefill'])} ms ({fmt(a['share_with_prefill'])} of requests)")
        print(f"{'':<12} cache hits' TTFT p50 alone {fmt(a['hit_ttft_p50_ms_alone'])} ms, with other prefills in "
              f"flight {fmt(a['hit_ttft_p50_ms_with_other_prefills'])} ms "
              f"({fmt(a['hit_share_with_other_prefills'])} of hits)")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
