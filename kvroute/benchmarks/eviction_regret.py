"""What a policy's evictions cost later: each simulated eviction checked against the workload's future.

    python -m kvroute.benchmarks.eviction_regret [--case mooncake] [--requests N] [--seeds 0,1,2] \\
        [--policies kv_aware,oracle_future] [--reference oracle_future] [--out regret.json]

Per seed and policy, one run of a `kvroute sim --suite` row (loadgen/sim/suite.py, the Mooncake
trace included) with every device eviction taken from the instances' KV events
(`Cluster.kv_listeners`) and checked against the planned send time of every request
(oracle_future.py's `FutureUses`): an evicted block that a later request holds is
*regretted* (with the time until that request), one that none holds is *dead*. The
cached prompt tokens are split by how long before the request its prompt's first block
was last requested (`new`: never), so the figures say which reuse distances a policy
serves and which it loses: the routing-loss split (routing_loss_gap.py) calls all of
that the workload's, since nothing held it when the request came. Each seed draws the
workload (a trace's requests stay as they are) and the policies' random choices afresh;
per policy, its cached share over the reference's per seed and their median, since one
seed's ratio moves by a percent or two (`kvroute sim --suite` runs seed 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import sys
from collections.abc import Sequence

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.cluster import KVEvents
from kvroute.loadgen.sim.oracle_future import FutureUses
from kvroute.loadgen.sim.runner import build, policy_names
from kvroute.loadgen.sim.suite import STRONGER, SUITE_CONFIG, Case, capped, suite_cases
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import block_hashes, hash_seed

GAP_EDGES_S = (10.0, 30.0, 60.0, 120.0)  # buckets of the time since the prompt's first block was last requested
BUCKETS = ("new", *(f"<{e:g}" for e in GAP_EDGES_S), f">={GAP_EDGES_S[-1]:g}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Regret:
    """One policy's run: its evictions against the future, its cached tokens by reuse distance."""

    policy: str
    seed: int
    cached_token_ratio: float
    evictions: int
    regretted: int  # evicted blocks a later request holds
    dead: int  # evicted blocks no later request holds
    regret_gap_p50_s: float | None  # median time from a regretted eviction to the request that wanted it
    by_gap: dict[str, dict[str, int]]  # bucket -> requests, prompt tokens, cached tokens
    per_instance: dict[str, dict[str, int]]  # instance -> requests routed there, blocks evicted there


def gap_bucket(gap_s: float) -> str:
    """The bucket's name: 'new' (never requested before), '<10', ..., '>=120'."""
    if math.isinf(gap_s):
        return BUCKETS[0]
    return next((b for edge, b in zip(GAP_EDGES_S, BUCKETS[1:]) if gap_s < edge), BUCKETS[-1])


def run_policy(case: Case, policy: str, seed: int = SUITE_CONFIG.seed) -> Regret:
    """Run `policy` over the case on the suite's cluster, recording every device eviction."""
    config = dataclasses.replace(SUITE_CONFIG, seed=seed)
    specs = make_workload(case.workload, seed=seed, **case.knobs).requests()
    setup = build(config, policy, specs, ArrivalConfig(rate=case.rate))
    cluster = setup.cluster
    evicted: list[tuple[float, int]] = []
    per_instance = {inst.id: {"requests": 0, "evictions": 0} for inst in cluster.instances}

    def on_events(index: int, events: KVEvents) -> None:
        before = len(evicted)
        evicted.extend((cluster.now, h) for ev in events if ev.kind == "removed" and ev.tier == "device"
                       for h in ev.blocks)
        per_instance[cluster.instances[index].id]["evictions"] += len(evicted) - before

    cluster.kv_listeners.append(on_events)
    cluster.run(setup.router, iter(setup.starts))
    first = cluster.instances[0]
    block_size = first.config.batch.block_size
    chain_seed = hash_seed(first.runner.info.model)
    future = FutureUses(specs, setup.starts, block_size, chain_seed)
    heads = {s.index: block_hashes(s.prompt_ids[:block_size], block_size, chain_seed) for s in specs}
    for record in setup.router.records:
        if record.instance in per_instance:
            per_instance[record.instance]["requests"] += 1
    return _regret(policy, seed, setup.router.records, heads, evicted, future, per_instance)


def _regret(policy: str, seed: int, records: Sequence[RequestRecord], heads: dict[int, list[int]],
            evicted: list[tuple[float, int]], future: FutureUses, per_instance: dict[str, dict[str, int]]) -> Regret:
    """`heads`: each request's first block hash (none for a prompt shorter than a block)."""
    gaps = [future.next_use(h, t) - t for t, h in evicted]
    regretted = [g for g in gaps if not math.isinf(g)]
    by_gap: dict[str, dict[str, int]] = {}
    prompt = cached = 0
    for record in records:
        head, t = heads.get(record.index), record.send_s
        since = t - future.previous_use(head[0], t) if head else math.inf
        row = by_gap.setdefault(gap_bucket(since), {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0})
        row["requests"] += 1
        row["prompt_tokens"] += record.prompt_tokens
        row["cached_tokens"] += record.cached_tokens or 0
        prompt += record.prompt_tokens
        cached += record.cached_tokens or 0
    return Regret(policy=policy, seed=seed, cached_token_ratio=cached / prompt if prompt else 0.0, evictions=len(gaps),
                  regretted=len(regretted), dead=len(gaps) - len(regretted),
                  regret_gap_p50_s=statistics.median(regretted) if regretted else None, by_gap=by_gap,
                  per_instance=per_instance)


def ratios(runs: Sequence[Regret], reference: str) -> dict[str, dict]:
    """Per policy: its cached share over the reference's, per seed, and the median over the seeds."""
    ref = {r.seed: r.cached_token_ratio for r in runs if r.policy == reference}
    per: dict[str, dict[int, float]] = {}
    for r in runs:
        if r.policy != reference and ref.get(r.seed):
            per.setdefault(r.policy, {})[r.seed] = r.cached_token_ratio / ref[r.seed]
    return {p: {"per_seed": v, "median": statistics.median(v.values())} for p, v in per.items()}


def lines(runs: Sequence[Regret], reference: str) -> list[str]:
    out = []
    for r in runs:
        gap = "-" if r.regret_gap_p50_s is None else f"{r.regret_gap_p50_s:.1f} s"
        out.append(f"{r.policy} (seed {r.seed}): cached {r.cached_token_ratio:.2%}; {r.evictions} evictions, "
                   f"{r.regretted} requested again later (median {gap} after), {r.dead} never")
        out.append("  cached by time since the prompt's first block was last requested: " + ", ".join(
            f"{b} {r.by_gap[b]['cached_tokens'] / max(r.by_gap[b]['prompt_tokens'], 1):.1%} "
            f"of {r.by_gap[b]['requests']}" for b in BUCKETS if b in r.by_gap))
        if r.per_instance:
            spread = {k: [v[k] for v in r.per_instance.values()] for k in ("requests", "evictions")}
            out.append("  per instance: " + ", ".join(f"{k} {min(v)} to {max(v)}" for k, v in spread.items()))
    for policy, ratio in ratios(runs, reference).items():
        out.append(f"{policy} / {reference} cached share: median {ratio['median']:.3f} ("
                   + ", ".join(f"seed {s} {v:.3f}" for s, v in ratio["per_seed"].items()) + ")")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="mooncake", help="the suite's row (default mooncake)")
    parser.add_argument("--requests", type=int, help="cap the row's request count")
    parser.add_argument("--policies", default="kv_aware,oracle_future", help="comma-separated")
    parser.add_argument("--seeds", default=str(SUITE_CONFIG.seed), help="comma-separated (default the suite's)")
    parser.add_argument("--reference", default=STRONGER, help=f"the policy ratios are to (default {STRONGER})")
    parser.add_argument("--out", type=pathlib.Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    cases, _ = suite_cases()
    case = next((c for c in cases if c.name == args.case), None)
    if case is None:
        print(f"eviction_regret: no case {args.case} (known: {', '.join(c.name for c in cases)})", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        seeds = []
    if not seeds or (args.requests is not None and args.requests < 1):
        print("eviction_regret: --seeds takes integers (0,1,2) and --requests at least 1", file=sys.stderr)
        return 2
    policies = args.policies.split(",")
    unknown = [p for p in (*policies, args.reference) if p not in policy_names()]
    if unknown:
        print(f"eviction_regret: no policy {', '.join(unknown)} (known: {', '.join(policy_names())})", file=sys.stderr)
        return 2
    case = capped(case, args.requests)
    runs = [run_policy(case, p, seed) for seed in seeds for p in policies]
    print("\n".join(lines(runs, args.reference)))
    if args.out:
        args.out.write_text(json.dumps({"runs": [dataclasses.asdict(r) for r in runs],
                                        "ratios": ratios(runs, args.reference)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
