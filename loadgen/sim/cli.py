"""`kvroute sim`: run policies over a workload on a simulated cluster and compare them.

    kvroute sim --instances 64 --policy kv_aware,round_robin,oracle --workload shared-prefix \
        --rate 800 --requests 20000 [--groups 64 --prefix-tokens 512 ...] [--cost-model a100-llama2-7b] \
        [--event-delay 0.05] [--fast-candidates 16] [--json] [--out results.json]
    kvroute sim --instances 8 --prefill-instances 3 [--kv-link nvlink] [--pd-min-uncached 256] ...
    kvroute sim --instances 8 --policy kv_aware --slo-ttft 1 --slo-tpot 0.04 --pd-sweep ...
    kvroute sim --suite [--policy a,b,...] [--requests N] [--suite-trace FILE] [--out suite.json]
    kvroute sim --instances 64 --admission-slo 0.5 --tenant name=A,workload=shared-prefix,rate=64,duration=30 \
        --tenant name=B,workload=random,rate=960,duration=25,seed=7       # a row per tenant too
    kvroute sim --instances 64 --workload session-storm --host-blocks 16000 --kv-store redis://s \
        --kv-host-link pcie4 --kv-store-link infiniband [--policy-arg tier_credit=fixed] ...

Workload flags are loadgen's (the workload's config fields); the same --seed drives
the workload, the arrival process, the policies' random choices and the sampled
tokens, so a run is reproducible and matches `kvroute loadgen` at the same seed.
`--pd-sweep` runs one policy colocated and at every prefill:decode split of the
instances (pd_sweep.py) and prints that table instead. `--suite` runs every
workload and the KV pressure sweep on the suite's cluster (suite.py; cluster flags
given override it, --requests caps every row) and prints each policy against the
oracle. Policies run side by side, one process each, up to `--jobs` at a time
(parallel.py: the same results as one after the other). Bad arguments give one line
on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from kvroute.engine.kv.links import LINKS
from kvroute.engine.kv.tiers import STORE_WRITE_MODES
from kvroute.engine.runners.cost_model import COST_MODELS, get_cost_model
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.parallel import PolicyRun, default_jobs, run_policies
from kvroute.loadgen.sim.pd_sweep import format_sweep, pd_sweep
from kvroute.loadgen.sim.profile import profile
from kvroute.loadgen.sim.report import format_suite, format_table, relative_to_oracle
from kvroute.loadgen.sim.runner import SimConfig, arrivals, policy_names
from kvroute.loadgen.sim.suite import DEFAULT_TRACE, SUITE_CONFIG, SUITE_POLICIES, run_suite
from kvroute.loadgen.sim.tenant_mix import format_tenants, mixed_specs, per_tenant
from kvroute.loadgen.tenants import parse_tenant
from kvroute.loadgen.workloads import CONFIGS, knob_names, make_workload, split_name, workload_names
from kvroute.router.contract.cli_help import HelpFormatter
from kvroute.router.planner.decide import PlannerConfig

PROG = "kvroute sim"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def _knob_types() -> dict[str, type]:
    knobs: dict[str, type] = {}
    for config in CONFIGS.values():
        for f in dataclasses.fields(config):
            if f.name not in ("num_requests", "path"):
                knobs.setdefault(f.name, type(f.default))
    return knobs


_CONFIG_FLAGS = {  # flag dest -> SimConfig field; a flag not given keeps the base config's (SimConfig() or the suite's)
    "instances": "instances", "cost_model": "cost_model", "event_delay": "event_delay_s",
    "request_overhead": "request_overhead_s", "poll_interval": "poll_interval_s",
    "fast_candidates": "fast_candidates", "recent_ttl": "recent_ttl_s", "block_size": "block_size",
    "num_blocks": "num_blocks", "max_batched_tokens": "max_batched_tokens", "max_running": "max_running",
    "max_waiting": "max_waiting", "prefill_instances": "prefill_instances", "kv_link": "kv_link",
    "pd_min_uncached": "pd_min_uncached", "seed": "seed", "host_blocks": "host_blocks", "kv_store": "kv_store",
    "kv_store_write": "kv_store_write", "kv_load_budget_bytes": "kv_load_budget_bytes", "kv_host_link": "kv_host_link",
    "kv_store_link": "kv_store_link", "admission_slo": "admission_slo_s", "admission_margin": "admission_margin",
}


def build_parser() -> argparse.ArgumentParser:
    d = {f.name: f.default for f in dataclasses.fields(SimConfig)}
    p = _Parser(prog=PROG, formatter_class=HelpFormatter,
                description="Discrete-event simulation of a large cluster with the real policies.")
    p.add_argument("--instances", type=int, help=f"simulated engines (default {d['instances']})")
    p.add_argument("--policy", help=f"comma-separated, from: {', '.join(policy_names())} (default kv_aware; "
                                    f"with --suite {','.join(SUITE_POLICIES)})")
    p.add_argument("--workload", help=f"one of {workload_names()}")
    p.add_argument("--requests", "--num-requests", dest="num_requests", type=int, help="requests to generate")
    p.add_argument("--rate", type=float, help="open loop: requests/s (omit for a trace's own send times)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1.0 = Poisson")
    p.add_argument("--cost-model", choices=list(COST_MODELS), help=f"default {d['cost_model']}")
    p.add_argument("--event-delay", type=float, help="KV event delivery delay, s (default 0)")
    p.add_argument("--request-overhead", type=float,
                   help="fixed HTTP/router latency added to every TTFT and E2E, s (measured ~0.005 on loopback)")
    p.add_argument("--poll-interval", type=float,
                   help=f"load poll interval, s; 0 = live (default {d['poll_interval_s']})")
    p.add_argument("--fast-candidates", type=int,
                   help="K > 0: index policies see index holders + recent + K least loaded instances only")
    p.add_argument("--recent-ttl", type=float, help="fast path: recent-sender memory, s")
    for name in ("block_size", "num_blocks", "max_batched_tokens", "max_running", "max_waiting"):
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       help=f"per engine, as kvroute engine (default {d[name]})")
    p.add_argument("--prefill-instances", type=int,
                   help="prefill/decode disaggregation: instances 0..P-1 prefill, the rest decode; 0 = colocated")
    p.add_argument("--kv-link", choices=list(LINKS), help="modelled prefill -> decode KV link")
    p.add_argument("--pd-min-uncached", type=int,
                   help="fewer predicted uncached prompt tokens: run whole on a decode instance (no prefill stage)")
    p.add_argument("--pd-sweep", action="store_true",
                   help="run colocated and every P:D split of --instances (one policy); table of goodput per split")
    p.add_argument("--host-blocks", type=int, help="per engine, as kvroute engine (default 0: off)")
    p.add_argument("--kv-store", help="model one shared store for all instances (a redis:// or file:/// URL; never "
                                      "contacted)")
    p.add_argument("--kv-store-write", choices=STORE_WRITE_MODES, help=f"default {d['kv_store_write']}")
    p.add_argument("--kv-load-budget-bytes", type=int, help="per engine, as kvroute engine")
    p.add_argument("--kv-host-link", help=f"modelled host link: {', '.join(LINKS)}")
    p.add_argument("--kv-store-link", help="modelled store link (as --kv-host-link)")
    p.add_argument("--policy-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="policy parameter (e.g. tier_credit=fixed), given to every policy that takes it")
    p.add_argument("--admission-slo", type=float,
                   help="admission by predicted TTFT at this SLO, as the router's --slo-ttft-s (docs/admission.md)")
    p.add_argument("--admission-margin", type=float, help="as the router's --admission-margin (default -0.4)")
    p.add_argument("--tenant", action="append", default=[], metavar="SPEC",
                   help="a tenant's load, as kvroute loadgen --tenant (name=A,workload=...,rate=...,duration=...,"
                        "priority=...,start=...,seed=...); repeatable, instead of --workload; prints a row per tenant")
    p.add_argument("--suite", action="store_true",
                   help="every workload and a KV pressure sweep, each policy against the oracle (see suite.py)")
    p.add_argument("--suite-trace", default=str(DEFAULT_TRACE), help="--suite: the Mooncake trace file")
    p.add_argument("--planner", action="store_true",
                   help="run kvroute planner on the virtual clock (needs --slo-ttft and --slo-tpot): roles change "
                        "online, starting from --prefill-instances (0: all colocated)")
    pd = PlannerConfig()
    for name in ("interval_s", "window_s", "hold", "cooldown_s", "colocate_below", "prefill_tokens_per_s",
                 "decode_tokens_per_s"):
        default = getattr(pd, name) if not name.endswith("tokens_per_s") else None
        p.add_argument("--planner-" + name.replace("_", "-"), type=type(getattr(pd, name)), default=default,
                       help="planner " + name.replace("_", " ") + (" (default: --profile's figure for the cost "
                                                                   "model)" if default is None else ""))
    p.add_argument("--profile", action="store_true",
                   help="print one engine's prefill and decode capacities (at --slo-tpot) for --cost-model, and exit")
    p.add_argument("--profile-context", type=int, default=2000, help="with --profile: decode context tokens")
    p.add_argument("--seed", type=int, help="seed of the workload, arrivals and policies (default 0)")
    p.add_argument("--slo-ttft", type=float, help="goodput SLO on TTFT, seconds")
    p.add_argument("--slo-tpot", type=float, help="goodput SLO on TPOT, seconds")
    p.add_argument("--jobs", type=int, default=default_jobs(),
                   help="policies simulated at once, one process each (default: one per core); same results")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--out", help="also write the results as JSON to this file")
    p.add_argument("--records", help="write every request's record as JSON lines (with its policy) to this file")
    for name, kind in _knob_types().items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, metavar=kind.__name__.upper(),
                       help=f"workload knob {name}")
    return p


def _workload(args: argparse.Namespace, seed: int):
    base, _ = split_name(args.workload)
    allowed = set(knob_names(args.workload))
    knobs = {k: v for k, v in vars(args).items() if k in _knob_types() and v is not None}
    for name in knobs:
        if name not in allowed:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to workload {base}")
    if args.num_requests is not None:
        knobs["num_requests"] = args.num_requests
    return make_workload(args.workload, seed=seed, **knobs)


def parse_policy_args(items: list[str]) -> tuple[tuple[str, object], ...]:
    """NAME=VALUE pairs; values that parse as JSON (numbers, true/false) are taken as such, else strings."""
    out = []
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--policy-arg must be NAME=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.append((name, value))
    return tuple(out)


def _config(args: argparse.Namespace) -> SimConfig:
    base = SUITE_CONFIG if args.suite else SimConfig()
    given = {field: getattr(args, flag) for flag, field in _CONFIG_FLAGS.items() if getattr(args, flag) is not None}
    if args.policy_arg:
        given["policy_args"] = parse_policy_args(args.policy_arg)
    return dataclasses.replace(base, **given)


def _policies(args: argparse.Namespace) -> list[str]:
    if args.policy is None:
        return list(SUITE_POLICIES) if args.suite else ["kv_aware"]
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    valid = policy_names()
    for name in policies or [""]:
        if name not in valid:
            raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(valid)}")
    if len(set(policies)) != len(policies):
        raise ValueError("--policy names a policy twice")
    return policies


def _check(args: argparse.Namespace) -> tuple[SimConfig, list[str], ArrivalConfig]:
    config = _config(args)
    policies = _policies(args)
    if args.suite:
        workload_flags = [k for k, v in vars(args).items() if k in _knob_types() and v is not None]
        if args.workload or args.rate is not None or args.pd_sweep or args.records or workload_flags:
            raise ValueError("--suite runs its own workloads: no --workload, --rate, workload knobs, "
                             "--pd-sweep or --records")
        if args.num_requests is not None and args.num_requests < 1:
            raise ValueError(f"--requests must be at least 1, got {args.num_requests}")
    elif args.tenant:
        workload_flags = [k for k, v in vars(args).items() if k in _knob_types() and v is not None]
        if args.workload or args.rate is not None or args.pd_sweep or workload_flags or args.num_requests:
            raise ValueError("--tenant gives each tenant's workload and rate: no --workload, --rate, --requests, "
                             "workload knobs or --pd-sweep")
    elif not args.workload:
        raise ValueError(f"give --workload ({workload_names()}), --tenant or --suite")
    if args.pd_sweep and (len(policies) != 1 or config.instances < 2 or args.records):
        raise ValueError("--pd-sweep takes one --policy, at least 2 --instances and no --records")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    for flag in ("slo_ttft", "slo_tpot"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    for flag in ("out", "records"):
        path = getattr(args, flag)
        if path is not None and (Path(path).is_dir() or not Path(path).absolute().parent.is_dir()):
            raise ValueError(f"--{flag} {path}: not a file in an existing directory")
    return config, policies, ArrivalConfig(rate=args.rate, burstiness=args.burstiness)


def planner_config(args: argparse.Namespace, config: SimConfig) -> PlannerConfig | None:
    if not args.planner:
        return None
    if args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("--planner needs --slo-ttft and --slo-tpot")
    capacities = profile(get_cost_model(config.cost_model), args.slo_tpot, max_batched_tokens=config.max_batched_tokens,
                         max_running=config.max_running)
    knobs = {name: getattr(args, "planner_" + name) for name in (
        "interval_s", "window_s", "hold", "cooldown_s", "colocate_below", "prefill_tokens_per_s",
        "decode_tokens_per_s")}
    for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        if knobs[name] is None:
            knobs[name] = capacities[name]
    step = {k: capacities[k] for k in ("decode_step_s", "decode_seq_s", "decode_context_s", "max_running")}
    return PlannerConfig(slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, **knobs, **step)


def run(args: argparse.Namespace) -> dict:
    config, policies, arrival = _check(args)
    if args.suite:
        return run_suite(config, policies, args.num_requests, args.suite_trace, progress=True, jobs=args.jobs)
    planner = planner_config(args, config)
    started = time.perf_counter()
    if args.tenant:
        loads = [parse_tenant(t) for t in args.tenant]
        if len({load.name for load in loads}) != len(loads):
            raise ValueError("--tenant names a tenant twice")
        config = dataclasses.replace(config, admission_tenants=tuple((load.name, load.priority or 0, 1.0)
                                                                     for load in loads))
        specs, workload, arrival = mixed_specs(loads), None, ArrivalConfig()
    else:
        workload = _workload(args, config.seed)
        specs = workload.requests()
    generate_s = time.perf_counter() - started
    arrivals(specs, arrival, config.seed)  # refuse a workload without send times before running anything
    results, records = {}, {}
    if args.pd_sweep:
        sweep = pd_sweep(config, policies[0], specs, arrival, args.slo_ttft, args.slo_tpot, progress=True)
    else:
        run_ = PolicyRun(config=config, specs=specs, arrival=arrival, planner=planner, slo_ttft_s=args.slo_ttft,
                         slo_tpot_s=args.slo_tpot, keep_records=bool(args.records or args.tenant), prog=PROG)
        results, records = run_policies(run_, policies, args.jobs)
    out = {
        "config": dataclasses.asdict(config),
        "workload": _describe(workload, args),
        "arrival": arrival.describe(),
        "workload_generation_s": generate_s,
        "results": results,
        "relative_to_oracle": relative_to_oracle(results),
    }
    if args.pd_sweep:
        out["pd_sweep"] = sweep
    if args.tenant:
        slo = args.slo_ttft if args.slo_ttft is not None else config.admission_slo_s
        out["tenants"] = {name: per_tenant(recs, slo) for name, recs in records.items()}
    if args.records:
        with open(args.records, "w", encoding="utf-8") as f:
            for name, recs in records.items():
                for r in recs:
                    f.write(json.dumps({"policy": name, **r.to_dict()}) + "\n")
    return out


def _describe(workload, args: argparse.Namespace) -> dict:
    if workload is None:
        return {"workload": "tenants", "tenants": list(args.tenant)}
    return workload.info() if hasattr(workload, "info") else {"workload": workload.name}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.profile:
            if args.slo_tpot is None:
                raise ValueError("--profile needs --slo-tpot")
            config = _config(args)
            print(json.dumps(profile(get_cost_model(config.cost_model), args.slo_tpot, args.profile_context,
                                     config.max_batched_tokens, config.max_running), indent=2))
            return 0
        out = run(args)
    except (UsageError, ValueError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    else:
        print(format_suite(out) if args.suite else format_sweep(out) if "pd_sweep" in out else format_table(out))
        if "tenants" in out:
            print(format_tenants(out["tenants"]))
    return 0
