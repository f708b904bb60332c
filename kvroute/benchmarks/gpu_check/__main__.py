"""`python -m kvroute.benchmarks.gpu_check --out DIR [--device cpu --shape tiny --quick]`: the device check
(kvroute/benchmarks/gpu_check/__init__.py says what it measures)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvroute.benchmarks import gpu_check
from kvroute.benchmarks.gpu_check.check import RUN, Check, describe, summary_line
from kvroute.benchmarks.gpu_check.checkpoint import write_checkpoint
from kvroute.benchmarks.gpu_check.plan import SHAPES, STEPS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvroute.benchmarks.gpu_check",
                                description=gpu_check.__doc__.split("\n\n")[0], epilog="Steps: " + ", ".join(STEPS))
    p.add_argument("--out", required=True, help="directory for the checkpoint, logs and gpu_check.json")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--shape", default="3b", choices=sorted(SHAPES), help="model shape of the random checkpoint")
    p.add_argument("--quick", action="store_true", help="the smallest run that still takes every step")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads (default: 1 on CPU, torch's on CUDA)")
    p.add_argument("--steps", default=",".join(STEPS), help="the steps to run, comma-separated")
    p.add_argument("--budget-s", type=float, default=480.0, help="steps not started by then are skipped")
    args = p.parse_args(argv)
    from kvroute.engine.runners.devices import check_device_available

    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    try:
        check_device_available(args.device)
        unknown = sorted(set(steps) - set(STEPS))
        if unknown:
            raise ValueError(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    result = run(Check(args), steps, args.budget_s)
    return 1 if any("error" in r for r in result["steps"].values()) else 0


def run(ctx: Check, steps: list[str], budget_s: float) -> dict:
    """The checkpoint, then each step in turn, DIR/gpu_check.json rewritten as each one ends."""
    (ctx.out / "logs").mkdir(parents=True, exist_ok=True)
    path, t_start = ctx.out / "gpu_check.json", time.monotonic()
    result = {**describe(ctx.device), "shape": ctx.shape, "quick": ctx.plan.quick, "steps": {}}
    result["checkpoint"] = write_checkpoint(ctx.model_dir, ctx.shape, ctx.device)
    result["checkpoint"]["seconds"] = round(time.monotonic() - t_start, 2)
    for name in steps:
        t0 = time.monotonic()
        if t0 - t_start > budget_s:
            out = {"skipped": f"not started: {budget_s:.0f} s budget spent"}
        else:
            try:
                out = RUN[name](ctx)
            except Exception as e:  # noqa: BLE001 - one step failing must not lose the others' figures
                out = {"error": f"{type(e).__name__}: {e}"}
        result["steps"][name] = {**out, "seconds": round(time.monotonic() - t0, 2)}
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(summary_line(name, out), flush=True)
    ctx.close_runner()
    result["seconds"] = round(time.monotonic() - t_start, 1)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} ({result['seconds']:.0f} s on {result['device_name']})")
    return result


if __name__ == "__main__":
    sys.exit(main())
