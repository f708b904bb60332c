"""What one contended admission decision costs, by the number of tenants flooding: the arrival
(`arriving`), the decision after the prediction (`on_arrival`) and the queue head's (`head_verdict`),
each reading the fleet's weighted fair shares (router/decision/shares.py), CPU of this process.

    python -m kvroute.benchmarks.admission_decision [--tenants 2,20,200] [--reps 300] [--out admission.json]

Each tenant count: admission's rates filled by 20,000 arrivals over 20 s (two of three admitted,
weights 1-4), one request queued, then --reps rounds of the three calls for a request predicted past
its SLO (the contended path: shares read on arrival, after the prediction and at the head); the
figure is the fastest of 7 rounds' means (CPU time, so other processes on the machine weigh little).
"""

from __future__ import annotations

import argparse
import sys
import time

from kvroute.benchmarks.results import write_json
from kvroute.router.decision import admission as adm
from kvroute.router.decision.fair_queue import FairQueue
from kvroute.router.decision.shares import Rates


def contended(tenants: int, reps: int) -> float:
    """us of CPU per request for `arriving` + `on_arrival` + `head_verdict` with `tenants` flooding."""
    config = adm.AdmissionConfig(slo_ttft_s=0.5)
    rates, weights, now = Rates(config.drain_halflife_s), {f"t{i}": 1.0 + i % 4 for i in range(tenants)}, 0.0
    for k in range(20_000):
        now += 0.001
        rates.arrived(f"t{k % tenants}", now)
        if k % 3:
            rates.add(f"t{k % tenants}", now)
    queue: FairQueue[None] = FairQueue(2)
    queue.push(tenant="t0", band=0, weight=1.0, arrived=now, item=None)
    ask = adm.Ask(tenant="t1", band=0, weight=2.0, slo_s=0.5, arrived=now, predicted_s=0.6, prefill_s=0.01)
    rounds = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(reps):
            now += 0.0005
            adm.arriving(config, ask, queue, rates, weights, now)
            adm.on_arrival(config, ask, queue, rates, weights, now)
            adm.head_verdict(config, ask, queue, rates, weights, now, last_admitted=now, in_turn=True)
        rounds.append((time.process_time() - t0) / reps * 1e6)
    return min(rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tenants", type=lambda s: [int(x) for x in s.split(",")], default=[2, 20, 200],
                   help="tenant counts, comma-separated")
    p.add_argument("--reps", type=int, default=300, help="requests per round")
    p.add_argument("--out", default=None, help="write the result as JSON")
    args = p.parse_args(argv)
    if min(args.tenants) < 2 or args.reps < 1:
        p.error("--tenants are at least 2 (one flooding, one asking), --reps at least 1")
    rows = []
    for n in args.tenants:
        us = contended(n, args.reps)
        rows.append({"tenants": n, "us_per_request": us})
        print(f"admission_decision: {n:4d} tenants  {us:7.1f} us of CPU per contended request", flush=True)
    write_json(args.out, {"rows": rows, "reps": args.reps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
