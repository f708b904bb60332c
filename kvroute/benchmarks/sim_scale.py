"""Routing decision time against cluster size and prompt length: prints a table, writes JSON.

    python -m kvroute.benchmarks.sim_scale [--instances 8,64,512,1024] [--prompt-tokens 1024,8192]
                                            [--decisions 300] [--fast-candidates 16] [--out sim_scale.json]

One decision is what `kvroute sim` times per request (and the router does): the real
`MemoryIndex.lookup_sync` of the prompt's block chain, the candidate list
(loadgen/sim/load_view.py), and `kv_aware`'s `select` -- with every instance as a
candidate ("full") and with the fast path (index holders + recent senders + the K
least loaded, "fast"). Hashing the prompt's blocks is timed on its own.

The index is filled like a busy cluster's: every instance holds two private
documents of the prompt's length, and each of 32 shared documents is held by 4
instances (2 whole, 2 its first half). A request is a shared document's first
three quarters plus a private tail, so the lookup walks 3/4 of the chain and sees
4 holders with 2 different prefix lengths. Instance loads are random (inflight
0-7, queued prefill tokens, engine running/waiting) and stay fixed; every KV pool
is full (no free blocks, 16 buckets of evictable ones), so each candidate's
eviction cost is worked out in full.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from kvroute.loadgen.sim.load_view import LoadView
from kvroute.router.contract.protocol import LoadRecord, block_hashes
from kvroute.router.decision.policies import RouteRequest, make_policy
from kvroute.router.decision.route import RouteDecision, RouteSettings
from kvroute.router.index.memory import MemoryIndex

BLOCK_SIZE = 16
SHARED_DOCS, HOLDERS, PRIVATE_DOCS = 32, 4, 2


def chain(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def full_pool(instance: str, rng: random.Random) -> LoadRecord:
    """A busy engine's load: a full KV pool, every placement evicts (the eviction term's full work)."""
    evictable = tuple((256, 60.0 * (16 - k) + rng.random()) for k in range(16))  # 16 buckets, oldest first
    return LoadRecord(instance=instance, running=rng.randrange(8), waiting=rng.randrange(4), kv_used_blocks=4096,
                      kv_total_blocks=4096 + 256 * 16, queued_prefill_tokens=0, ts=0.0,
                      kv_free_blocks=0, kv_evictable=evictable)


def build(num_instances: int, blocks: int, fast_k: int, rng: random.Random):
    ids = [f"sim-{i}" for i in range(num_instances)]
    index = MemoryIndex()
    for inst in ids:
        for _ in range(PRIVATE_DOCS):
            index.add_sync(inst, "device", chain(rng, blocks))
    docs = [chain(rng, blocks) for _ in range(SHARED_DOCS)]
    for doc in docs:
        for k, inst in enumerate(rng.sample(ids, min(HOLDERS, num_instances))):
            index.add_sync(inst, "device", doc if k % 2 == 0 else doc[: blocks // 2])
    views = {}
    for name, k in (("full", 0), ("fast", fast_k)):
        view = LoadView(ids)
        for i in range(num_instances):
            for _ in range(rng.randrange(8)):
                view.dispatched(i, rng.randrange(0, 4 * blocks * BLOCK_SIZE))
            view.polled(i, full_pool(ids[i], rng))
        views[name] = (view, k)
    return index, docs, views


def measure(num_instances: int, prompt_tokens: int, decisions: int, fast_k: int, seed: int) -> dict:
    rng = random.Random(seed)
    blocks = prompt_tokens // BLOCK_SIZE
    index, docs, views = build(num_instances, blocks, fast_k, rng)
    tokens = [rng.randrange(5, 8000) for _ in range(prompt_tokens)]
    t0 = time.perf_counter()
    for _ in range(20):
        block_hashes(tokens, BLOCK_SIZE, 1)
    hash_us = (time.perf_counter() - t0) / 20 * 1e6
    requests = []
    for r in range(decisions):
        head = docs[r % SHARED_DOCS][: 3 * blocks // 4]
        route = tuple(head + chain(rng, blocks - len(head)))
        requests.append(RouteRequest(num_tokens=prompt_tokens, block_hashes=route, block_size=BLOCK_SIZE,
                                     request_id=f"r{r}"))
    row = {"instances": num_instances, "prompt_tokens": prompt_tokens, "blocks": blocks,
           "index_entries": index.size_sync(), "hash_us": hash_us}
    lookups = []
    for path, (view, k) in views.items():
        policy = make_policy("kv_aware", rng=random.Random(seed), clock=lambda: 0.0)
        decision = RouteDecision(policy, RouteSettings(fast_candidates=k))
        times, sizes = [], []
        for req in requests:
            t0 = time.perf_counter()
            matches = index.lookup_sync(req.block_hashes)
            t1 = time.perf_counter()
            routed = decision.choose(req, view.all(), matches, 0.0)
            times.append(time.perf_counter() - t0)
            lookups.append(t1 - t0)
            sizes.append(len(routed.candidates))
        row[f"decision_{path}_us"] = statistics.median(times) * 1e6
        row[f"candidates_{path}"] = statistics.mean(sizes)
    row["lookup_us"] = statistics.median(lookups) * 1e6
    row["decision_fast_us_per_block"] = row["decision_fast_us"] / blocks
    return row


def format_table(rows: list[dict]) -> str:
    cols = [("instances", "instances", 0), ("prompt", "prompt_tokens", 0), ("blocks", "blocks", 0),
            ("index entries", "index_entries", 0), ("hash us", "hash_us", 1), ("lookup us", "lookup_us", 1),
            ("full us", "decision_full_us", 1), ("full cands", "candidates_full", 0),
            ("fast us", "decision_fast_us", 1), ("fast cands", "candidates_fast", 1),
            ("fast us/block", "decision_fast_us_per_block", 3)]
    cells = [[f"{r[key]:.{d}f}" for _, key, d in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(cols)]
    lines = ["  ".join(h.rjust(w) for (h, _, _), w in zip(cols, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", default="8,64,512,1024")
    p.add_argument("--prompt-tokens", default="1024,8192")
    p.add_argument("--decisions", type=int, default=300)
    p.add_argument("--fast-candidates", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="sim_scale.json")
    args = p.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.instances.split(",")):
        for length in (int(x) for x in args.prompt_tokens.split(",")):
            rows.append(measure(n, length, args.decisions, args.fast_candidates, args.seed))
            print(format_table(rows[-1:]).splitlines()[1], file=sys.stderr)
    print("median routing decision time (lookup + candidates + kv_aware select), microseconds")
    print(format_table(rows))
    Path(args.out).write_text(json.dumps({"python": platform.python_version(), "machine": platform.machine(),
                                          "fast_candidates": args.fast_candidates, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
