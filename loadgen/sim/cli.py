"""`kvroute sim`: run policies over a workload on a simulated cluster and compare them.

    kvroute sim --instances 64 --policy kv_aware,round_robin,oracle --workload shared-prefix \
        --rate 800 --requests 20000 [--groups 64 --prefix-tokens 512 ...] [--cost-model a100-llama2-7b] \
        [--event-delay 0.05] [--fast-candidates 16] [--json] [--out results.json]
    kvroute sim --instances 8 --prefill-instances 3 [--kv-link nvlink] [--pd-min-uncached 256] ...
    kvroute sim --instances 8 --policy kv_aware --slo-ttft 1 --slo-tpot 0.04 --pd-sweep ...
    kvroute sim --suite [--policy a,b,...] [--requests N] [--suite-trace FILE] [--out suite.json]
    kvroute sim --instances 64 --admission-slo 0.5 --tenant name=A,workload=shared-prefix,rate=64,duration=30 \
        --tenant name=B,workload=random,rate=960,duration=25,seed=7       # a row per tenant too
    kvroute sim --instances 8 --admission-slo 0.5 --routers 2 [--admission-sync 0.05] \
        --tenant name=A,workload=random,rate=60,duration=30,weight=4,router=0 --tenant name=B,...,weight=1
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

from kvroute.engine.runners.cost_model import get_cost_model
from kvroute.loadgen.adapters import with_adapters
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.config import SimConfig
from kvroute.loadgen.sim.flags import COMMAND, PLANNER_KNOBS, PROG
from kvroute.loadgen.sim.parallel import PolicyRun, run_policies
from kvroute.loadgen.sim.pd_sweep import format_sweep, pd_sweep
from kvroute.loadgen.sim.profile import profile
from kvroute.loadgen.sim.report import format_suite, format_table, relative_to_oracle
from kvroute.loadgen.sim.runner import arrivals, policy_names
from kvroute.loadgen.sim.suite import SUITE_CONFIG, SUITE_POLICIES, run_suite
from kvroute.loadgen.sim.tenant_mix import format_tenants, mixed_specs, per_tenant
from kvroute.loadgen.tenants import TenantLoad, parse_tenant
from kvroute.loadgen.workloads import knob_flags, knob_names, make_workload, split_name, workload_names
from kvroute.router.contract.cli_parser import SettingsParser, given
from kvroute.router.contract.settings import flat
from kvroute.router.contract.settings_values import pick, replace
from kvroute.router.planner.decide import PlannerConfig

KNOBS = frozenset(d.name for d in knob_flags())
SIM_TENANT_KEYS = ("weight", "router")  # --tenant keys of the simulator alone (the router's tenant file, the replica)


def build_parser() -> SettingsParser:
    return COMMAND.parser()


def _knobs_given(args: argparse.Namespace) -> dict:
    """The workload knobs given on the command line (knob_flags), by name."""
    return {k: v for k, v in vars(args).items() if k in KNOBS and v is not None}


def _workload(args: argparse.Namespace, seed: int):
    base, _ = split_name(args.workload)
    allowed = set(knob_names(args.workload))
    knobs = _knobs_given(args)
    for name in knobs:
        if name not in allowed:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to workload {base}")
    if args.num_requests is not None:
        knobs["num_requests"] = args.num_requests
    return with_adapters(make_workload(args.workload, seed=seed, **knobs), args.adapters, args.adapter_assign, seed)


def _config(args: argparse.Namespace) -> SimConfig:
    """The cluster: the suite's with --suite, else the defaults, with the settings given."""
    base = SUITE_CONFIG if args.suite else SimConfig()
    return replace(base, **pick(SimConfig, {name: getattr(args, name) for name in given(args)}))


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
        if args.workload or args.rate is not None or args.pd_sweep or args.records or _knobs_given(args):
            raise ValueError("--suite runs its own workloads: no --workload, --rate, workload knobs, "
                             "--pd-sweep or --records")
    elif args.tenant:
        if args.workload or args.rate is not None or args.pd_sweep or _knobs_given(args) or args.num_requests:
            raise ValueError("--tenant gives each tenant's workload and rate: no --workload, --rate, --requests, "
                             "workload knobs or --pd-sweep")
    elif not args.workload:
        raise ValueError(f"give --workload ({workload_names()}), --tenant or --suite")
    if config.routers > 1 and (args.pd_sweep or args.planner or args.suite):
        raise ValueError("--routers > 1 takes no --pd-sweep, --planner or --suite")
    if args.pd_sweep and (len(policies) != 1 or config.instances < 2 or args.records):
        raise ValueError("--pd-sweep takes one --policy, at least 2 --instances and no --records")
    _check_files(args)
    return config, policies, ArrivalConfig(rate=args.rate, burstiness=args.burstiness)


def _check_files(args: argparse.Namespace) -> None:
    """--out and --records name files that can be written, before any work."""
    for flag in ("out", "records"):
        path = getattr(args, flag)
        if path is not None and (Path(path).is_dir() or not Path(path).absolute().parent.is_dir()):
            raise ValueError(f"--{flag} {path}: not a file in an existing directory")


def sim_tenant(text: str) -> tuple[TenantLoad, float, int | None]:
    """A --tenant SPEC: loadgen's (loadgen/tenants.py), with the simulator's weight= and router= taken out."""
    own, rest = {}, []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key.strip() in SIM_TENANT_KEYS:
            own[key.strip()] = value.strip()
        else:
            rest.append(part)
    load = parse_tenant(",".join(rest))
    try:
        weight, router = float(own.get("weight", 1.0)), int(own["router"]) if "router" in own else None
    except ValueError:
        raise ValueError(f"--tenant {load.name}: weight must be a number and router an integer") from None
    if not weight > 0:
        raise ValueError(f"--tenant {load.name}: weight must be positive, got {weight}")
    return load, weight, router


def planner_config(args: argparse.Namespace, config: SimConfig) -> PlannerConfig | None:
    if not args.planner:
        return None
    if args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("--planner needs --slo-ttft and --slo-tpot")
    capacities = profile(get_cost_model(config.runner.cost_model), args.slo_tpot,
                         max_batched_tokens=config.batch.max_batched_tokens, max_running=config.batch.max_running)
    knobs = {name: getattr(args, "planner_" + name) for name in PLANNER_KNOBS}
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
        parsed = [sim_tenant(t) for t in args.tenant]
        loads = [load for load, _, _ in parsed]
        if len({load.name for load in loads}) != len(loads):
            raise ValueError("--tenant names a tenant twice")
        config = dataclasses.replace(
            config, admission_tenants=tuple((load.name, load.priority or 0, weight) for load, weight, _ in parsed),
            tenant_routers=tuple((load.name, router) for load, _, router in parsed if router is not None))
        specs, workload, arrival = mixed_specs(loads), None, ArrivalConfig()
    else:
        workload = _workload(args, config.seed)
        specs = workload.requests()
    generate_s = time.perf_counter() - started
    arrivals(specs, arrival, config.seed)  # refuse a workload without send times before running anything
    results: dict[str, dict] = {}
    records: dict[str, list] = {}  # policy -> its RequestRecords
    if args.pd_sweep:
        sweep = pd_sweep(config, policies[0], specs, arrival, args.slo_ttft, args.slo_tpot, progress=True)
    else:
        run_ = PolicyRun(config=config, specs=specs, arrival=arrival, planner=planner, slo_ttft_s=args.slo_ttft,
                         slo_tpot_s=args.slo_tpot, keep_records=bool(args.records or args.tenant), prog=PROG)
        results, records = run_policies(run_, policies, args.jobs)
    out = {
        "config": flat(config),
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


def _profile(args: argparse.Namespace) -> dict:
    """--profile: one engine's prefill and decode capacities for the cost model, at --slo-tpot."""
    if args.slo_tpot is None:
        raise ValueError("--profile needs --slo-tpot")
    _check_files(args)
    config = _config(args)
    return profile(get_cost_model(config.runner.cost_model), args.slo_tpot, context_tokens=args.profile_context,
                   max_batched_tokens=config.batch.max_batched_tokens, max_running=config.batch.max_running)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        out = _profile(args) if args.profile else run(args)
    except SystemExit as e:  # --help, or a usage error (said on stderr)
        return int(e.code or 0)
    except ValueError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as e:
            print(f"{PROG}: cannot write {args.out}: {e}", file=sys.stderr)
            return 1
    if args.json or args.profile:
        print(text)
    else:
        print(format_suite(out) if args.suite else format_sweep(out) if "pd_sweep" in out else format_table(out))
        if "tenants" in out:
            print(format_tenants(out["tenants"]))
    return 0
