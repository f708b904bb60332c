"""`kvroute bench`: start a local cluster and compare routing policies on one workload.

Each policy gets a fresh cluster (engines restarted, so every run starts cold),
the same workload and the same seed; `--extra-target NAME=URL` adds any other
OpenAI endpoint to the comparison. Writes results.json, results.md and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pathlib
import sys
import time

import aiohttp

from kvroute.loadgen.adapters import engine_args as adapter_engine_args
from kvroute.loadgen.adapters import parse_adapters
from kvroute.loadgen.bench_flags import BenchFlags
from kvroute.loadgen.bench_tiers import (
    STORM_DEFAULTS,
    TIER_RUNS,
    TIER_SIZING,
    engine_metrics,
    storm_summary,
    tier_metrics,
    tier_spec,
    tier_stores,
    tier_table,
)
from kvroute.loadgen.cli import check_load_args
from kvroute.loadgen.client import TargetError, probe_target
from kvroute.loadgen.load_flags import LoadFlags
from kvroute.loadgen.local_cluster import ClusterSpec, LocalCluster
from kvroute.loadgen.out_dir import ForceFlag, check_out_dir
from kvroute.loadgen.progress import Progress
from kvroute.loadgen.report import Run, markdown_table, verdict, write_report, write_run
from kvroute.loadgen.runner import run_load
from kvroute.loadgen.workloads import knob_flags
from kvroute.router.contract.cli_parser import Command, SettingsParser
from kvroute.router.contract.interrupt import interrupted

PROG = "kvroute bench"

# Sizing chosen so the groups' shared prefixes fit the cluster's aggregate KV cache but
# not one engine's: a router that scatters a group re-prefills it everywhere and thrashes
# the LRU. Long prefix, short question: the llm-d benchmark's shape, scaled down.
# Keyed by (backend, quick); `rate_per_engine` x engines is the default arrival rate.
SIZING = {
    ("sim", False): {"engines": 8, "groups": 16, "prefix_tokens": 3072, "num_requests": 480, "rate_per_engine": 3.0,
                     "num_blocks": 1024},
    ("sim", True): {"engines": 8, "groups": 8, "prefix_tokens": 3072, "num_requests": 160, "rate_per_engine": 3.0,
                    "num_blocks": 1024},
    ("torch", False): {"engines": 4, "groups": 8, "prefix_tokens": 2048, "num_requests": 160, "rate_per_engine": 1.5,
                       "num_blocks": 512},
    ("torch", True): {"engines": 4, "groups": 6, "prefix_tokens": 2048, "num_requests": 96, "rate_per_engine": 1.0,
                      "num_blocks": 512},
}
SHARED_PREFIX_REST = {"question_tokens": 64, "output_tokens": 16}
# --pd: two engines, long prompts and long outputs mixed (prefill stalls decode when colocated).
PD_SIZING = {"engines": 2, "num_requests": 120, "rate": 3.0, "num_blocks": 2048}
PD_RANDOM = {"input_tokens": 2048, "min_input_tokens": 128, "output_tokens": 128, "min_output_tokens": 16}


COMMAND = Command(prog=PROG, description="Compare routing policies on a local cluster, same workload and seed.",
                  env_prefix="KVROUTE_BENCH_", sections=(BenchFlags, ForceFlag, LoadFlags, knob_flags),
                  doc="docs/loadgen.md")


def build_parser(prog: str = PROG) -> SettingsParser:
    env_prefix = "KVROUTE_" + prog.removeprefix("kvroute ").upper() + "_"  # kvroute demo: KVROUTE_DEMO_
    return dataclasses.replace(COMMAND, prog=prog, env_prefix=env_prefix).parser()


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill what the user left unset from the sizing for this backend (and --quick)."""
    if args.pd:
        for knob, value in PD_SIZING.items():
            if getattr(args, knob, None) is None and not (knob == "rate" and args.concurrency is not None):
                setattr(args, knob, value)
        args.workload = args.workload or "random"
        if args.workload == "random":
            for knob, value in PD_RANDOM.items():
                if getattr(args, knob) is None:
                    setattr(args, knob, value)
    if args.tiers:
        return _tier_defaults(args)
    args.workload = args.workload or "shared-prefix"
    sizing = {**SIZING[(args.backend, args.quick)], **SHARED_PREFIX_REST}
    if args.engines is None:
        args.engines = sizing["engines"]
    if args.rate is None and args.concurrency is None:
        args.rate = sizing["rate_per_engine"] * args.engines
    if args.num_requests is None and args.duration is None:
        args.num_requests = sizing["num_requests"]
    if args.num_blocks is None:
        args.num_blocks = sizing["num_blocks"]
    if args.workload == "shared-prefix":
        for knob in ("groups", "prefix_tokens", "question_tokens", "output_tokens"):
            if getattr(args, knob) is None:
                setattr(args, knob, sizing[knob])
    return args


def _tier_defaults(args: argparse.Namespace) -> argparse.Namespace:
    args.workload = args.workload or "session-storm"
    for knob, value in {**TIER_SIZING[args.backend], **(STORM_DEFAULTS if args.workload == "session-storm" else {}),
                        "temperature": 0.0}.items():
        if getattr(args, knob, None) is None:
            setattr(args, knob, value)
    return args


def parse_targets(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--extra-target must be NAME=http://host:port, got {item!r}")
        out.append((name, url))
    return out


async def run_one(name: str, target: str, args, config, workload, show_progress: bool) -> Run:
    print(f"{PROG}: {name}: {len(workload.requests())} requests -> {target}", file=sys.stderr, flush=True)
    result = await run_load(dataclasses.replace(config, target=target), workload,
                            progress=Progress() if show_progress else None)
    summary = {"target": target, **result.summary(args.slo_ttft, args.slo_tpot)}
    return Run(name=name, summary=summary, records=result.records)


async def bench(args, policies: list[str], extras: list[tuple[str, str]]) -> list[Run]:
    config, workload, _ = check_load_args(args)
    async with aiohttp.ClientSession() as session:  # fail before starting anything
        for name, url in extras:
            try:
                await probe_target(session, url)
            except TargetError as e:
                raise TargetError(f"--extra-target {name}: {e}") from None
    if args.tiers:
        return await bench_tiers(args, config, workload)
    runs = []
    for name, spec in cluster_specs(args, policies):
        t0 = time.monotonic()
        async with LocalCluster(spec) as cluster:
            print(f"{PROG}: {name}: {spec.engines} {args.backend} engines ({', '.join(spec.roles) or 'both'}) + "
                  f"router ({spec.policy}) up in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
            run = await run_one(name, cluster.router_url, args, config, workload, not args.no_progress)
            if args.pd:
                run.summary.update(await transfer_stats(cluster.engine_urls, run.summary))
            runs.append(run)
    for name, url in extras:
        runs.append(await run_one(name, url, args, config, workload, not args.no_progress))
    return runs


async def bench_tiers(args, config, workload) -> list[Run]:
    """One storm per tier setup (loadgen/bench_tiers.py), each on fresh engines."""
    runs: list[Run] = []
    for name in args.tier_runs:
        with tier_stores(name) as store_args:
            spec = tier_spec(args, name, store_args)
            t0 = time.monotonic()
            async with LocalCluster(spec) as cluster:
                print(f"{PROG}: {name}: {spec.engines} {args.backend} engines "
                      f"({' '.join(spec.engine_args) or 'device'}) + router up in {time.monotonic() - t0:.1f}s",
                      file=sys.stderr, flush=True)
                run = await run_one(name, cluster.router_url, args, config, workload, not args.no_progress)
                tiers = tier_metrics(await engine_metrics(cluster.engine_urls))
        run.summary = {"target": run.summary["target"], **storm_summary(run, runs[0] if runs else None),
                       "tiers": tiers}
        runs.append(run)
    return runs


def cluster_specs(args, policies: list[str]) -> list[tuple[str, ClusterSpec]]:
    """One cluster per policy; with --pd, colocated (all "both") against prefill + decode engines. With
    --adapters every engine serves them all (loadgen/adapters.py)."""
    lora = adapter_engine_args(parse_adapters(args.adapters), args.backend, args.out, args.max_loras,
                               tuple(args.engine_arg))
    base = dict(engines=args.engines, backend=args.backend, num_blocks=args.num_blocks,
                engine_args=tuple(args.engine_arg) + lora, router_args=tuple(args.router_arg))
    if not args.pd:
        return [(p, ClusterSpec(policy=p, **base)) for p in policies]
    k = args.prefill_engines or max(1, args.engines // 2)
    return [("colocated", ClusterSpec(policy=policies[-1], roles=("both",) * args.engines, **base)),
            (f"disaggregated {k}P+{args.engines - k}D",
             ClusterSpec(policy=policies[-1], roles=("prefill",) * k + ("decode",) * (args.engines - k), **base))]


async def transfer_stats(engine_urls: list[str], summary: dict) -> dict:
    """KV pulled by decode engines during the run: MB/s while pulling, and pull time over TTFT."""
    totals = await engine_metrics(engine_urls)
    pulls = totals.get("kvroute_engine_kv_pull_seconds_count", 0.0)
    if not pulls:
        return {}
    seconds, nbytes = totals["kvroute_engine_kv_pull_seconds_sum"], totals["kvroute_engine_kv_pull_bytes_total"]
    mean_pull = seconds / pulls
    ttft = summary.get("ttft_p50_s") or 0.0
    return {"kv_pulls": int(pulls), "kv_pulled_mb": nbytes / 1e6, "kv_pull_mb_per_s": nbytes / 1e6 / seconds,
            "kv_pull_mean_s": mean_pull, "kv_pull_over_ttft_p50": mean_pull / ttft if ttft else None}


def parse(argv: list[str] | None, prog: str = PROG) -> tuple[argparse.Namespace, list[str], list[tuple[str, str]]]:
    """Validated (args, policies, extra targets); UsageError or ValueError with a one-line message."""
    args = apply_defaults(build_parser(prog).parse_args(argv))
    from kvroute.router.decision.policies import POLICIES

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}")
    if args.engines < 1:
        raise ValueError(f"--engines must be at least 1, got {args.engines}")
    if args.max_loras is not None and not args.adapters:
        raise ValueError("--max-loras needs --adapters")
    if args.tiers and (args.pd or args.extra_target or args.host_blocks < 1):
        raise ValueError("--tiers runs its own four setups: no --pd or --extra-target, and --host-blocks >= 1")
    args.tier_runs = [r.strip() for r in args.tier_runs.split(",") if r.strip()]
    if args.tier_runs[:1] != ["device"] or not set(args.tier_runs) <= set(TIER_RUNS):
        raise ValueError(f"--tier-runs must list device first, then any of {', '.join(TIER_RUNS[1:])}")
    extras = parse_targets(args.extra_target)
    check_load_args(args)
    check_out_dir(args.out, args.force)
    return args, policies, extras


SUBJECT_POLICY = "kv_aware"  # the policy kvroute bench and kvroute demo exist to test


def verdict_pair(args: argparse.Namespace, policies: list[str], names: list[str]) -> dict[str, str]:
    """The verdict's subject and baseline: the policy under test against the first other run.

    The policy under test is kv_aware when it ran, else the last of --policies (the default list
    puts the baselines first); --extra-target runs are never the subject. With --pd it is the
    disaggregated cluster against the colocated one; with --tiers the last setup against device only.
    """
    if len(names) < 2:
        return {}
    if args.pd:
        return {"subject": names[1], "baseline": names[0]}
    if args.tiers:
        return {"subject": names[-1], "baseline": names[0]}
    subject = SUBJECT_POLICY if SUBJECT_POLICY in policies else policies[-1]
    others = [n for n in names if n != subject]
    return {"subject": subject, "baseline": others[0]} if others else {}


def verdict_line(args: argparse.Namespace, policies: list[str], runs: list[Run]) -> str | None:
    """The run's last line: the policy under test against the baseline, and every run's cached share."""
    return verdict(runs, **verdict_pair(args, policies, [r.name for r in runs]))


def run(args: argparse.Namespace, policies: list[str], extras: list[tuple[str, str]], prog: str = PROG) -> int:
    try:
        runs = asyncio.run(bench(args, policies, extras))
    except KeyboardInterrupt:
        return interrupted(prog, "interrupted; all processes stopped")
    except (RuntimeError, OSError, TargetError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    paths = write_report(args.out, runs)
    for run_ in runs:
        write_run(pathlib.Path(args.out) / "runs" / run_.name, run_.summary, run_.records)
    if args.tiers:
        table = tier_table(runs)
        (pathlib.Path(args.out) / "tiers.md").write_text(table + "\n")
        print(table)
    else:
        print(markdown_table(runs))
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    line = verdict_line(args, policies, runs)
    if line:
        print(f"\n{prog}: {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args, policies, extras = parse(argv)
    except SystemExit as e:  # --help, or a usage error (said on stderr)
        return int(e.code or 0)
    except ValueError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return run(args, policies, extras)


if __name__ == "__main__":
    sys.exit(main())
