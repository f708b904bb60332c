"""`kvroute loadgen`: drive an OpenAI-compatible endpoint with a workload; write requests.jsonl and summary.json.

Bad arguments and an unreachable target give one line on stderr and a non-zero
exit. Ctrl-C stops sending, cancels what is in flight and still writes what was
measured (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

from kvroute.loadgen.adapters import parse_adapters, with_adapters
from kvroute.loadgen.arrivals import ArrivalConfig, count_within
from kvroute.loadgen.client import TargetError, normalize_target, probe_target
from kvroute.loadgen.load_flags import LoadFlags
from kvroute.loadgen.out_dir import ForceFlag, check_out_dir
from kvroute.loadgen.progress import Progress
from kvroute.loadgen.report import write_run
from kvroute.loadgen.runner import LoadConfig, LoadResult, run_load
from kvroute.loadgen.summary import format_summary
from kvroute.loadgen.tenants import parse_tenant, run_tenants, tenant_summary, workload_of
from kvroute.loadgen.workloads import knob_flags, knob_names, make_workload, split_name
from kvroute.router.contract.cli_parser import Command, SettingsParser
from kvroute.router.contract.interrupt import INTERRUPTED, interrupted
from kvroute.router.contract.settings import setting

PROG = "kvroute loadgen"
CLOSED_LOOP_CAP = 10_000  # requests generated for --concurrency with --duration and no --num-requests


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadgenRun:
    """target and output"""

    target: str = setting(help="base URL, e.g. http://127.0.0.1:8000", metavar="URL")
    out: str = setting(help="directory for requests.jsonl and summary.json", metavar="DIR")
    tenant: tuple[str, ...] = setting((), "run several tenants at once instead of --workload: name=A,workload=W,"
                                          "rate=R,duration=S[,priority=P][,key=KEY][,header=VALUE][,start=S]"
                                          "[,KNOB=VALUE...] (loadgen/tenants.py)", metavar="SPEC")
    tenant_header: str | None = setting(None, "with --tenant: send each tenant's name (or its header=) in this header",
                                        metavar="NAME")


COMMAND = Command(prog=PROG, description="Drive an OpenAI-compatible endpoint with a workload and measure it.",
                  env_prefix="KVROUTE_LOADGEN_", sections=(LoadgenRun, ForceFlag, LoadFlags, knob_flags),
                  doc="docs/loadgen.md")


def build_parser() -> SettingsParser:
    return COMMAND.parser()


def _knobs(args: argparse.Namespace, workload: str) -> dict:
    allowed = set(knob_names(workload))
    knobs = {d.name for d in knob_flags()}
    given = {k: v for k, v in vars(args).items() if k in knobs and v is not None}
    for name in given:
        if name not in allowed:
            flags = ", ".join("--" + k.replace("_", "-") for k in knob_names(workload) if k != "num_requests")
            raise ValueError(f"--{name.replace('_', '-')} does not apply to workload {split_name(workload)[0]}; "
                             f"its flags: {flags or 'none'}")
    return given


def _count_starts(workload) -> tuple[int, int]:
    specs = workload.requests()
    return len(specs), sum(s.after is None for s in specs)


def build_workload(args: argparse.Namespace, arrival: ArrivalConfig):
    """The workload, sized by --num-requests, or by --duration at --rate (session starts), or a cap, and
    spread over --adapters."""
    return with_adapters(_sized_workload(args, arrival), parse_adapters(args.adapters), args.adapter_assign, args.seed)


def _sized_workload(args: argparse.Namespace, arrival: ArrivalConfig):
    knobs = _knobs(args, args.workload)
    if args.num_requests is not None:
        return make_workload(args.workload, seed=args.seed, num_requests=args.num_requests, **knobs)
    if args.duration is None or arrival.mode == "fixed":
        return make_workload(args.workload, seed=args.seed, **knobs)
    if arrival.mode == "closed":
        return make_workload(args.workload, seed=args.seed, num_requests=CLOSED_LOOP_CAP, **knobs)
    assert arrival.rate is not None  # neither fixed nor closed: an open loop, which has its rate
    needed = max(1, count_within(arrival.rate, arrival.burstiness, args.duration, args.seed))
    workload = make_workload(args.workload, seed=args.seed, num_requests=needed, **knobs)
    total, starts = _count_starts(workload)
    if starts < needed:  # several requests per start (multi-turn)
        scaled = math.ceil(total * needed / starts)
        workload = make_workload(args.workload, seed=args.seed, num_requests=scaled, **knobs)
    return workload


def check_load_args(args: argparse.Namespace, target: str = "") -> tuple[LoadConfig, object, int]:
    """Validate the shared flags; the load config (for `target`), the workload and its size."""
    split_name(args.workload)
    arrival = ArrivalConfig(rate=args.rate, burstiness=args.burstiness, concurrency=args.concurrency)
    workload = build_workload(args, arrival)
    config = LoadConfig(target=normalize_target(target) if target else "", arrival=arrival, duration_s=args.duration,
                        model=args.model, api=args.api, prompt_format=args.prompt_format,
                        request_timeout_s=args.request_timeout, seed=args.seed, temperature=args.temperature)
    specs = workload.requests()
    if arrival.mode == "fixed" and any(s.arrival_s is None for s in specs if s.after is None):
        raise ValueError(f"workload {args.workload} needs --rate R (open loop) or --concurrency C (closed loop)")
    return config, workload, len(specs)


def _check(args: argparse.Namespace) -> tuple[LoadConfig, object, int]:
    check_out_dir(args.out, args.force)
    if args.tenant:
        if args.workload:
            raise ValueError("give --workload or --tenant specs, not both")
        if args.adapters:
            raise ValueError("--adapters spreads a --workload; it does not apply to --tenant specs")
        loads = [parse_tenant(spec) for spec in args.tenant]
        if len({load.name for load in loads}) != len(loads):
            raise ValueError("two --tenant specs have the same name")
        config = LoadConfig(target=normalize_target(args.target), model=args.model, api=args.api,
                            prompt_format=args.prompt_format, request_timeout_s=args.request_timeout,
                            temperature=args.temperature)
        return config, loads, sum(len(workload_of(load).requests()) for load in loads)
    if not args.workload:
        raise ValueError("give --workload (or one --tenant spec per tenant)")
    return check_load_args(args, args.target)


async def _run_tenants(args: argparse.Namespace, config: LoadConfig, loads) -> int:
    async with aiohttp.ClientSession() as session:
        await probe_target(session, config.target)
    print(f"{PROG}: {len(loads)} tenants ({', '.join(load.name for load in loads)}) -> {config.target}",
          file=sys.stderr)
    results = await run_tenants(config, loads, args.tenant_header)
    summary, records = tenant_summary(results, args.slo_ttft, args.slo_tpot)
    summary = {"target": config.target, **summary}
    try:
        write_run(args.out, summary, records)
    except OSError as e:
        print(f"{PROG}: cannot write to {args.out}: {e}", file=sys.stderr)
        return 1
    for name, s in summary["tenants"].items():
        print(f"== {name}: refused {s['refused']} (p90 {s['refused_p90_s'] or 0:.3f} s)")
        print(format_summary(s))
    return 0


async def _run(config: LoadConfig, workload, header: str, show_progress: bool) -> LoadResult:
    async with aiohttp.ClientSession() as session:
        await probe_target(session, config.target)  # fail in one line before printing anything
    print(header, file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None  # _run is the loop's main coroutine

    def on_sigint() -> None:
        if stop.is_set():
            main_task.cancel()
        stop.set()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals here
        pass
    try:
        return await run_load(config, workload, progress=Progress() if show_progress else None, stop=stop)
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (RuntimeError, ValueError, NotImplementedError):
            pass


def _loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        config, workload, n = _check(args)
    except SystemExit as e:  # --help, or a usage error (said on stderr)
        return int(e.code or 0)
    except (ValueError, OSError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.tenant:
        code, failed = _in_loop(lambda: _run_tenants(args, config, workload))
        if failed is not None:
            return failed
        assert code is not None  # it ran to the end
        return code
    limit = f"up to {n} requests in {args.duration:g} s" if args.duration else f"{n} requests"
    header = f"{PROG}: {args.workload}, {limit}, {config.arrival.describe()} -> {config.target}"
    result, failed = _in_loop(lambda: _run(config, workload, header, not args.no_progress))
    if failed is not None:
        return failed
    assert result is not None  # it ran to the end
    return _finish(args, config, result)


T = TypeVar("T")


def _in_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T | None, int | None]:
    """(what `make()`'s coroutine returns, None) on the load generator's loop, or (None, exit code) after
    a one-line message: 1 for a bad target or value, 130 when interrupted."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(make()), None
    except (TargetError, ValueError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return None, 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        return None, interrupted(PROG)


def _finish(args: argparse.Namespace, config: LoadConfig, result: LoadResult) -> int:
    """Write requests.jsonl and summary.json, print the table; the exit status."""
    summary = {"target": config.target, "workload": args.workload, "model": result.model,
               **result.summary(args.slo_ttft, args.slo_tpot)}
    try:
        write_run(args.out, summary, result.records)
    except OSError as e:
        print(f"{PROG}: cannot write to {args.out}: {e}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    if result.interrupted:
        print(f"{PROG}: interrupted; wrote the {len(result.records)} requests that finished", file=sys.stderr)
        return INTERRUPTED
    if result.records and summary["completed"] == 0:
        print(f"{PROG}: all {len(result.records)} requests failed: {next(iter(summary['error_kinds']))}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
