"""The planner against static configurations on a workload that shifts half-way (issue 11).

Same arrival rate throughout; the first half prompt-heavy (long prompts, short outputs), the
second decode-heavy (short prompts, long outputs) -- `--workload shift`. Rows, all on the
same requests and seed:

    colocated         every instance "both"
    best static       the P:D split with the most goodput on the first half alone (a sweep of
                      splits, as DistServe picks one offline), then kept for the whole run
    planner           kvroute planner on the virtual clock, starting colocated

Goodput (share of requests meeting both SLOs) per phase and overall, and when the
planner first re-roles after the shift (its reaction time).

Against every swept static split: a static split's whole-run goodput is at most its first
half's weighted with 100% for the second half, so only the splits whose bound reaches the
planner's goodput are run over the whole run too (`static_whole_run` in the JSON); the
others cannot beat it.

    python -m kvroute.benchmarks.planner sim [--instances 64] [--rate 200] [--requests 48000] --out planner_sim.json
    python -m kvroute.benchmarks.planner http [--instances 4] [--rate 10] [--requests 1200] --out planner_http.json

`http` runs the same comparison over HTTP on this machine: sim engines (the cost model's
step times, real HTTP, real router), fresh for every row, and `kvroute planner` as a
process for the planner row; the first-half sweep runs over HTTP too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from kvroute.benchmarks.results import write_json
from kvroute.engine.runners.cost_model import get_cost_model
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.profile import profile
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.summary import meets_slo
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build
from kvroute.router.planner.decide import PlannerConfig


def goodput(records, group: str | None, slo_ttft: float, slo_tpot: float) -> float:
    rows = [r for r in records if group is None or r.group == group]
    return sum(meets_slo(r, slo_ttft, slo_tpot) for r in rows) / len(rows) if rows else 0.0


def row(name: str, result, specs, shift_s: float, args) -> dict:
    groups = {s.index: s.group for s in specs}
    for r in result.records:
        r.group = groups[r.index]
    out = {"config": name, **{g: goodput(result.records, g, args.slo_ttft, args.slo_tpot)
                              for g in ("prompt-heavy", "decode-heavy")},
           "overall": goodput(result.records, None, args.slo_ttft, args.slo_tpot), "wall_s": result.wall_s}
    if result.planner:
        changes = [d for d in result.planner["decisions"] if d["at"] > shift_s]
        out["reaction_s"] = changes[0]["at"] - shift_s if changes else None
        out["role_changes"] = result.planner["role_changes"]
        out["decisions"] = [{"at": round(d["at"], 1), "reason": d["reason"]} for d in result.planner["decisions"]]
    return out


def rivals(sweep: dict[int, float], first_share: float, beat: float) -> list[int]:
    """The swept splits that could still match `beat` over the whole run. A static split's whole-run
    goodput is at most its first half's (measured) weighted with 100% for the second half, so
    every other split is ruled out without running it."""
    return [p for p, g in sweep.items() if first_share * g + (1.0 - first_share) >= beat]


def run_sim(args) -> dict:
    n = args.instances
    config = build(SimConfig, instances=n, cost_model=args.cost_model, seed=args.seed, kv_link="nvlink",
                   num_blocks=args.num_blocks, max_running=args.max_running)
    specs = make_workload("shift", seed=args.seed, num_requests=args.requests).requests()
    first = [s for s in specs if s.group == "prompt-heavy"]
    arrival = ArrivalConfig(rate=args.rate)
    shift_s = len(first) / args.rate
    caps = profile(get_cost_model(args.cost_model), args.slo_tpot, max_running=args.max_running)
    sweep = {}
    for p in range(args.step, n, args.step):  # the offline choice, on the first half alone
        res = simulate(dataclasses.replace(config, prefill_instances=p), "kv_aware", first, arrival)
        sweep[p] = goodput(res.records, None, args.slo_ttft, args.slo_tpot)
        print(f"  first half, {p}P:{n - p}D: goodput {sweep[p]:.3f} ({res.wall_s:.0f} s)", file=sys.stderr)
    best = max(sweep, key=lambda p: (sweep[p], -abs(p - n / 2)))
    rows = []
    planner = PlannerConfig(slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot,
                            prefill_tokens_per_s=caps["prefill_tokens_per_s"],
                            decode_tokens_per_s=caps["decode_tokens_per_s"], decode_step_s=caps["decode_step_s"],
                            decode_seq_s=caps["decode_seq_s"], decode_context_s=caps["decode_context_s"],
                            max_running=caps["max_running"], interval_s=args.interval_s,
                            window_s=args.window_s, hold=args.hold, cooldown_s=args.cooldown_s)
    for name, cfg, plan in (("colocated", config, None),
                            (f"best static for the first half ({best}P:{n - best}D)",
                             dataclasses.replace(config, prefill_instances=best), None),
                            ("planner", config, planner)):
        t0 = time.perf_counter()
        res = simulate(cfg, "kv_aware", specs, arrival, plan)
        rows.append(row(name, res, specs, shift_s, args))
        print(f"  {name}: overall goodput {rows[-1]['overall']:.3f} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr)
    whole = {best: rows[1]["overall"]}
    for p in rivals(sweep, len(first) / len(specs), rows[2]["overall"]):  # the rest cannot beat the planner
        if p not in whole:
            res = simulate(dataclasses.replace(config, prefill_instances=p), "kv_aware", specs, arrival)
            whole[p] = goodput(res.records, None, args.slo_ttft, args.slo_tpot)
            print(f"  static {p}P:{n - p}D over the whole run: goodput {whole[p]:.3f}", file=sys.stderr)
    return {"instances": n, "rate": args.rate, "requests": args.requests, "cost_model": args.cost_model,
            "slo_ttft_s": args.slo_ttft, "slo_tpot_s": args.slo_tpot, "profile": caps, "shift_at_s": shift_s,
            "first_half_sweep": sweep, "planner_config": dataclasses.asdict(planner), "rows": rows,
            "static_whole_run": whole}


KEY = "bench-admin"


async def http_run(args, specs, roles: tuple[str, ...], planner_profile: str | None):
    """One fresh local cluster with `roles`, the workload through its router, optionally a planner."""
    from kvroute.loadgen.local_cluster import ClusterSpec, LocalCluster
    from kvroute.loadgen.runner import LoadConfig, run_load

    spec = ClusterSpec(engines=len(roles), backend="sim", num_blocks=args.num_blocks, roles=roles, admin_key=KEY,
                       engine_args=("--cost-model", args.cost_model, "--kv-link", "nvlink", "--time-scale",
                                    str(args.time_scale), "--max-running", str(args.max_running)))
    async with LocalCluster(spec) as cluster:
        planner = None
        if planner_profile:  # in the cluster's process group: stopped with it
            planner = cluster.processes.server(
                "planner", "planner", "--router", cluster.router_url, "--admin-key", KEY, "--slo-ttft",
                str(args.slo_ttft), "--slo-tpot", str(args.slo_tpot), "--profile", planner_profile, "--interval-s",
                str(args.interval_s), "--window-s", str(args.window_s), "--hold", str(args.hold), "--cooldown-s",
                str(args.cooldown_s), "--log-level", "WARNING")
            await cluster.processes.wait_ready(planner, "/planner")
        workload = _Fixed(specs)
        config = LoadConfig(target=cluster.router_url, arrival=ArrivalConfig(rate=args.rate), seed=args.seed)
        started = time.time()
        result = await run_load(config, workload)
        decisions = _planner_decisions(planner) if planner else None
    return result.records, decisions, started


def _planner_decisions(url: str) -> list[dict]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/planner", timeout=5) as r:
        return [d for d in json.load(r)["decisions"] if d["changes"]][::-1]


class _Fixed:
    name = "shift"

    def __init__(self, specs) -> None:
        self.specs = specs

    def requests(self):
        return self.specs

    def info(self):
        return {"workload": "shift", "requests": len(self.specs)}


def scaled(caps: dict, time_scale: float) -> dict:
    """A profile for engines whose modelled time runs `time_scale` x slower (--time-scale)."""
    out = dict(caps)
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        out[key] = caps[key] / time_scale
    for key in ("decode_step_s", "decode_seq_s", "decode_context_s", "slo_tpot_s"):
        out[key] = caps[key] * time_scale
    return out


def run_http(args) -> dict:
    import asyncio
    import tempfile

    n = args.instances
    specs = make_workload("shift", seed=args.seed, num_requests=args.requests).requests()
    first = [s for s in specs if s.group == "prompt-heavy"]
    shift_s = len(first) / args.rate
    caps = scaled(profile(get_cost_model(args.cost_model), args.slo_tpot / args.time_scale,
                          max_running=args.max_running), args.time_scale)
    profile_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(caps, profile_file)
    profile_file.close()
    roles = lambda p: ("prefill",) * p + ("decode",) * (n - p)  # noqa: E731
    sweep = {}
    for p in range(1, n):
        records, _, _ = asyncio.run(http_run(args, first, roles(p), None))
        sweep[p] = goodput(records, None, args.slo_ttft, args.slo_tpot)
        print(f"  first half over HTTP, {p}P:{n - p}D: goodput {sweep[p]:.3f}", file=sys.stderr)
    best = max(sweep, key=lambda p: (sweep[p], -abs(p - n / 2)))
    rows: list[dict[str, Any]] = []
    for name, cluster_roles, prof in (("colocated", ("both",) * n, None),
                                      (f"best static for the first half ({best}P:{n - best}D)", roles(best), None),
                                      ("planner", ("both",) * n, profile_file.name)):
        records, decisions, started = asyncio.run(http_run(args, specs, cluster_roles, prof))
        groups = {s.index: s.group for s in specs}
        for r in records:
            r.group = groups[r.index]
        row_ = {"config": name, **{g: goodput(records, g, args.slo_ttft, args.slo_tpot)
                                    for g in ("prompt-heavy", "decode-heavy")},
                "overall": goodput(records, None, args.slo_ttft, args.slo_tpot)}
        if decisions is not None:
            after = [d["at"] - started - shift_s for d in decisions if d["at"] >= started + shift_s]
            row_["reaction_s"] = after[0] if after else None
            row_["decisions"] = [{"at": round(d["at"] - started, 1), "reason": d["reason"]} for d in decisions]
            row_["role_changes"] = sum(len(d["changes"]) for d in decisions)
        rows.append(row_)
        print(f"  {name}: overall goodput {row_['overall']:.3f}", file=sys.stderr)
    whole = {best: rows[1]["overall"]}
    for p in rivals(sweep, len(first) / len(specs), rows[2]["overall"]):  # the rest cannot beat the planner
        if p not in whole:
            records, _, _ = asyncio.run(http_run(args, specs, roles(p), None))
            whole[p] = goodput(records, None, args.slo_ttft, args.slo_tpot)
            print(f"  static {p}P:{n - p}D over the whole run: goodput {whole[p]:.3f}", file=sys.stderr)
    return {"mode": "http", "instances": n, "rate": args.rate, "requests": args.requests, "time_scale": args.time_scale,
            "cost_model": args.cost_model, "slo_ttft_s": args.slo_ttft, "slo_tpot_s": args.slo_tpot,
            "profile": caps, "shift_at_s": shift_s, "first_half_sweep": sweep, "rows": rows,
            "static_whole_run": whole}


def table(out: dict) -> str:
    lines = [f"{out['instances']} instances, {out['rate']} req/s, SLO TTFT {out['slo_ttft_s']} s, "
             f"TPOT {out['slo_tpot_s'] * 1000:g} ms; shift at {out['shift_at_s']:.0f} s",
             "| config | goodput, prompt-heavy half | goodput, decode-heavy half | goodput, whole run |",
             "|---|---|---|---|"]
    for r in out["rows"]:
        extra = f" (reacts in {r['reaction_s']:.0f} s)" if r.get("reaction_s") is not None else ""
        lines.append(f"| {r['config']}{extra} | {100 * r['prompt-heavy']:.1f}% | {100 * r['decode-heavy']:.1f}% | "
                     f"{100 * r['overall']:.1f}% |")
    whole = out.get("static_whole_run") or {}
    if whole:
        n = out["instances"]
        ran = ", ".join(f"{p}P:{n - int(p)}D {100 * g:.1f}%" for p, g in sorted(whole.items(), key=lambda x: int(x[0])))
        lines.append(f"static splits that could match the planner over the whole run (the other swept splits are "
                     f"ruled out by their first half): {ran}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["sim", "http"])
    p.add_argument("--instances", type=int, default=64)
    p.add_argument("--rate", type=float, default=144.0)
    p.add_argument("--requests", type=int, default=16000)
    p.add_argument("--cost-model", default="a100-llama2-7b")
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tpot", type=float, default=0.025)
    p.add_argument("--num-blocks", type=int, default=16384)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--step", type=int, default=8, help="first-half sweep: every step-th P")
    d = PlannerConfig()
    p.add_argument("--interval-s", type=float, default=d.interval_s)
    p.add_argument("--window-s", type=float, default=d.window_s)
    p.add_argument("--hold", type=int, default=d.hold)
    p.add_argument("--cooldown-s", type=float, default=d.cooldown_s)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="http: engines' modelled time runs this much slower (give SLOs and rate to match)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args(argv)
    out = run_sim(args) if args.mode == "sim" else run_http(args)
    print(table(out))
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
