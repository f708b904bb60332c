"""How much the past tells which cached blocks come back: a workload's blocks by the turn that last asked for them.

    python -m kvroute.benchmarks.reuse_by_turn [--case mooncake] [--seeds 0,1] [--idle 20,40,60] \\
        [--soon 60] [--out turns.json]

oracle_future (loadgen/sim/oracle_future.py) prices a placement's victims by whether the
future asks for them again within the time blocks survive there; a router has only the
past. A request whose block chain holds an earlier prompt's last block extends that prompt
whole (block hashes chain): it is a later turn of that conversation, turn = the earlier
one's + 1 (a prompt extending none is turn 0; turn 3 stands for 3 or more). Per turn, over
the workload of a `kvroute sim --suite` row (its planned send times, as oracle_future.py's
`FutureUses` reads them; no policy runs):

- prompts: how many, the share a later request continues at all, and within `--soon` s;
- blocks: every block each request holds, keyed by the request's turn and whether the
  block is `new` (never requested before) or `seen`; for each idle time A in `--idle`, of
  the blocks still unrequested A s later, the share requested within the next A s: what a
  victim idle A on an instance whose blocks survive A is worth (oracle_future's question),
  as far as the key predicts it.

The spread between the keys' shares is how far a router that learns reuse per turn could
tell victims apart; oracle_future tells them apart exactly (each victim 0 or 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
from collections.abc import Sequence

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.oracle_future import FutureUses, planned_times
from kvroute.loadgen.sim.runner import arrivals
from kvroute.loadgen.sim.suite import SUITE_CONFIG, suite_cases
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import block_hashes

LAST_TURN = 3  # turns 3 and later count as 3
CHAIN_SEED = 0  # any seed: the split only compares hashes with each other


@dataclasses.dataclass(frozen=True, kw_only=True)
class TurnSplit:
    seed: int
    prompts: dict[int, dict[str, int]]  # turn -> prompts, continued, continued within `soon`
    blocks: dict[str, dict[float, dict[str, int]]]  # "turn/new|seen" -> idle A -> idle (still unrequested), returned


def split(specs: Sequence[RequestSpec], starts: Sequence[tuple[float, RequestSpec]], block_size: int,
          idles: Sequence[float], soon: float, seed: int = 0) -> TurnSplit:
    """The turn split of these requests sent at their planned times (prompts shorter than a block skipped)."""
    future = FutureUses(specs, starts, block_size, CHAIN_SEED)
    planned = planned_times(specs, starts)
    tails: dict[int, int] = {}  # a prompt's last block -> its turn
    prompts: dict[int, dict[str, int]] = {}
    blocks: dict[str, dict[float, dict[str, int]]] = {}
    for spec in sorted(specs, key=lambda s: (planned.get(s.index, 0.0), s.index)):
        t, chain = planned.get(spec.index, 0.0), block_hashes(spec.prompt_ids, block_size, CHAIN_SEED)
        if not chain:
            continue
        turn = next((min(tails[h] + 1, LAST_TURN) for h in reversed(chain) if h in tails), 0)
        tails[chain[-1]] = turn
        gap = future.next_use(chain[-1], t) - t
        row = prompts.setdefault(turn, {"prompts": 0, "continued": 0, "continued_soon": 0})
        row["prompts"] += 1
        row["continued"] += not math.isinf(gap)
        row["continued_soon"] += gap <= soon
        for h in chain:
            part = "seen" if future.previous_use(h, t) > -math.inf else "new"
            by_idle = blocks.setdefault(f"{turn}/{part}", {a: {"idle": 0, "returned": 0} for a in idles})
            gap = future.next_use(h, t) - t
            for a in idles:
                if gap > a:
                    by_idle[a]["idle"] += 1
                    by_idle[a]["returned"] += gap <= 2 * a
    return TurnSplit(seed=seed, prompts=dict(sorted(prompts.items())), blocks=dict(sorted(blocks.items())))


def run_seed(case_name: str, seed: int, idles: Sequence[float], soon: float) -> TurnSplit:
    """The split of a suite row's workload as seed `seed` draws it and its arrivals."""
    case = next(c for c in suite_cases()[0] if c.name == case_name)
    specs = make_workload(case.workload, seed=seed, **case.knobs).requests()
    starts = list(arrivals(specs, ArrivalConfig(rate=case.rate), seed))
    return split(specs, starts, SUITE_CONFIG.engine().batch.block_size, idles, soon, seed)


def lines(runs: Sequence[TurnSplit], soon: float) -> list[str]:
    out = []
    for r in runs:
        out.append(f"seed {r.seed}: prompts by turn (continued later; within {soon:g} s): " + ", ".join(
            f"{turn} {p['prompts']} ({p['continued'] / p['prompts']:.0%}; {p['continued_soon'] / p['prompts']:.0%})"
            for turn, p in r.prompts.items()))
        for key, by_idle in r.blocks.items():
            out.append(f"  blocks {key}: requested within A more s once idle A: " + ", ".join(
                f"A={a:g} {v['returned'] / v['idle']:.1%} of {v['idle']}" for a, v in by_idle.items() if v["idle"]))
    return out


def _numbers(text: str, kind: type) -> list:
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="mooncake", help="the suite's row (default mooncake)")
    parser.add_argument("--seeds", default=str(SUITE_CONFIG.seed), help="comma-separated (default the suite's)")
    parser.add_argument("--idle", default="20,40,60", help="idle times A, seconds, comma-separated")
    parser.add_argument("--soon", type=float, default=60.0, help="a continuation within this many seconds is soon")
    parser.add_argument("--out", type=pathlib.Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    names = [c.name for c in suite_cases()[0]]
    if args.case not in names:
        print(f"reuse_by_turn: no case {args.case} (known: {', '.join(names)})", file=sys.stderr)
        return 2
    seeds, idles = _numbers(args.seeds, int), _numbers(args.idle, float)
    if not seeds or not idles or min(idles) <= 0 or not args.soon > 0:
        print("reuse_by_turn: --seeds takes integers (0,1,2), --idle positive seconds (20,40), --soon a positive "
              "number", file=sys.stderr)
        return 2
    runs = [run_seed(args.case, seed, idles, args.soon) for seed in seeds]
    print("\n".join(lines(runs, args.soon)))
    if args.out:
        args.out.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
