"""kvroute's router fed only by ZeroMQ events, against vllm-router's kv_aware, on the same engines.

    python -m kvroute.benchmarks.foreign --out results/zmq [--vllm-router /work/venv-vllm-router/bin/vllm-router]

One run, three phases, each on freshly started kvroute sim engines that publish their KV
events in vLLM's format (`--kv-events-zmq`, `--kv-events-replay`), same workload and seed:

1. accuracy: kvroute's router with `--engine-kind kvroute --kv-event-source ...` (no
   /kv/events), closed loop: before each request POST /router/explain gives the router's
   predicted cached tokens for every instance; the request is then sent and the prediction
   for the instance that served it is compared with the engine's reported `cached_tokens`.
2. "kvroute (zmq)": the same router under the open-loop workload: TTFT and cached share.
3. (--with-kv-events) "kvroute (/kv/events)": the same router fed by /kv/events instead.
4. "vllm-router kv_aware": vllm-router (PyPI `vllm-router`, in its own venv) with
   `--policy kv_aware --kv-event-source URL=ENDPOINT --kv-event-replay-source URL=ENDPOINT
   --kv-event-block-size 16 --kv-event-model M`, the built-in tokenizer via
   VLLM_ROUTER_TOKENIZER, under the same workload.

Writes results.json, results.md, the usual plots and accuracy.json to --out; prints the table.
Other flags are `kvroute bench`'s (workload, engines, rate; default: its sim sizing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys

import aiohttp

from kvroute.loadgen.bench import Run, apply_defaults, run_one
from kvroute.loadgen.bench import build_parser as bench_parser
from kvroute.loadgen.cli import check_load_args
from kvroute.loadgen.processes import Processes, free_port
from kvroute.loadgen.report import markdown_table, write_report
from kvroute.router.contract.tokenizer import DATA_DIR

VLLM_ROUTER = "/work/venv-vllm-router/bin/vllm-router"


class Fleet:
    """kvroute sim engines publishing vLLM-format events, plus one router in front."""

    def __init__(self, engines: int, num_blocks: int, engine_args: list[str]) -> None:
        self.engines, self.num_blocks, self.engine_args = engines, num_blocks, engine_args
        self.procs = Processes(env={"OMP_NUM_THREADS": "1"})
        self.urls: list[str] = []
        self.events: list[tuple[str, str]] = []  # (PUB endpoint, replay endpoint) per engine
        self.router_url = ""

    async def start_engines(self) -> None:
        for i in range(self.engines):  # ZeroMQ sockets on free ports; /kv/info says which
            self.urls.append(self.procs.server(
                f"engine-{i}", "engine", "--instance-id", f"e{i}", "--backend", "sim", "--num-blocks",
                str(self.num_blocks), "--num-threads", "1", "--log-level", "WARNING", "--kv-events-zmq",
                "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0", *self.engine_args))
        for url in self.urls:
            await self.procs.wait_ready(url)
        async with aiohttp.ClientSession() as session:
            for url in self.urls:
                async with session.get(url + "/kv/info") as r:
                    info = await r.json()
                self.events.append((info["kv_events_zmq"], info["kv_events_replay"]))

    def source_flags(self) -> list[str]:
        out = []
        for url, (pub, replay) in zip(self.urls, self.events):
            out += ["--kv-event-source", f"{url}={pub}", "--kv-event-replay-source", f"{url}={replay}"]
        return out

    async def start_kvroute_router(self, zmq: bool = True) -> None:
        self.router_url = self.procs.server("router", "router", "--log-level", "WARNING", "--engine-kind", "kvroute",
                                            *[a for u in self.urls for a in ("--engine", u)],
                                            *(self.source_flags() if zmq else []))
        await self.procs.wait_ready(self.router_url)

    async def start_vllm_router(self, binary: str, model: str) -> None:
        port = free_port()
        self.router_url = f"http://127.0.0.1:{port}"
        self.procs.start("vllm-router", [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                                         *self.urls, "--policy", "kv_aware", "--kv-event-block-size", "16",
                                         "--kv-event-model", model, "--prometheus-port", str(free_port()),
                                         "--log-level", "warning", *self.source_flags()],
                         env={"VLLM_ROUTER_TOKENIZER": str(DATA_DIR)})
        await self.procs.wait_ready(self.router_url)


async def accuracy(router: str, workload, limit: int, settle_s: float = 0.0) -> dict:
    """Closed loop: the router's prediction for the instance that served each request, against the engine."""
    rows = []
    async with aiohttp.ClientSession() as session:
        for spec in workload.requests()[:limit]:
            body = {"prompt": list(spec.prompt_ids), "max_tokens": 1, "ignore_eos": True}
            await asyncio.sleep(settle_s)  # let the previous request's last events land first
            async with session.post(router + "/router/explain", json=body) as r:
                explain = await r.json()
            async with session.post(router + "/v1/completions", json=body) as r:
                answer = await r.json()
                served = r.headers.get("x-kvroute-instance")
            predicted = {row["instance"]: row["cached_tokens"] for row in explain["instances"]}
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            rows.append({"served": served, "chosen": explain["choice"], "predicted": predicted.get(served),
                         "cached": cached, "prompt_tokens": answer["usage"]["prompt_tokens"]})
        async with session.get(router + "/router/instances") as r:
            feeds = {i["id"]: (i["kv_events"] or {}).get("blocks") for i in (await r.json())["instances"]}
    exact = sum(r["predicted"] == r["cached"] for r in rows)
    return {"requests": len(rows), "exact": exact, "exact_share": exact / len(rows),
            "same_choice_as_explain": sum(r["served"] == r["chosen"] for r in rows) / len(rows),
            "mismatches": [r for r in rows if r["predicted"] != r["cached"]][:20], "block_outcomes": feeds,
            "predicted_cached_tokens": sum(r["predicted"] or 0 for r in rows),
            "reported_cached_tokens": sum(r["cached"] for r in rows)}


async def main_async(args, bench_args) -> tuple[list[Run], dict]:
    config, workload, _ = check_load_args(bench_args)
    runs, out = [], {}
    phases = [("accuracy", "kvroute" if args.accuracy_feed == "zmq" else "kvroute-poll")]
    if not args.accuracy_only:
        phases.append(("kvroute (zmq)", "kvroute"))
    if args.with_kv_events and not args.accuracy_only:
        phases.append(("kvroute (/kv/events)", "kvroute-poll"))
    if args.vllm_router and not args.accuracy_only:
        phases.append(("vllm-router kv_aware", "vllm-router"))
    for name, router in phases:
        fleet = Fleet(bench_args.engines, bench_args.num_blocks, bench_args.engine_arg)
        with fleet.procs:  # the logs stay for the error's "see ..." when a phase fails
            await fleet.start_engines()
            if router.startswith("kvroute"):
                await fleet.start_kvroute_router(zmq=router == "kvroute")
            else:
                await fleet.start_vllm_router(args.vllm_router, "kvroute-tiny")
            print(f"foreign: {name}: {fleet.engines} engines + {router} up", file=sys.stderr, flush=True)
            if name == "accuracy":
                out["accuracy"] = await accuracy(fleet.router_url, workload, args.accuracy_requests,
                                                 args.settle_ms / 1000)
                a = out["accuracy"]
                print(f"foreign: accuracy: {a['exact']}/{a['requests']} requests exact "
                      f"({a['exact_share']:.1%}); predicted {a['predicted_cached_tokens']} vs reported "
                      f"{a['reported_cached_tokens']} cached tokens", file=sys.stderr, flush=True)
            else:
                runs.append(await run_one(name, fleet.router_url, bench_args, config, workload, False))
    return runs, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-router", default=VLLM_ROUTER if pathlib.Path(VLLM_ROUTER).exists() else None,
                   help="the vllm-router executable (none: skip that phase)")
    p.add_argument("--accuracy-requests", type=int, default=200)
    p.add_argument("--accuracy-only", action="store_true", help="only the prediction-accuracy phase")
    p.add_argument("--settle-ms", type=float, default=0.0,
                   help="accuracy: pause between one answer and the next prediction (0: none)")
    p.add_argument("--accuracy-feed", choices=("zmq", "kv-events"), default="zmq",
                   help="what feeds the router in the accuracy phase (kv-events: the reference)")
    p.add_argument("--with-kv-events", action="store_true",
                   help="also run kvroute's router fed by /kv/events (the reference the ZeroMQ feed should match)")
    p.add_argument("--out", default="kvroute-foreign")
    args, rest = p.parse_known_args(argv)
    bench_args = apply_defaults(bench_parser().parse_args(rest + ["--out", args.out]))
    runs, extra = asyncio.run(main_async(args, bench_args))
    if runs:
        write_report(args.out, runs)
        print(markdown_table(runs))
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(args.out) / "accuracy.json").write_text(json.dumps(extra.get("accuracy"), indent=2))
    if "accuracy" in extra:
        a = extra["accuracy"]
        print(f"\nprediction accuracy ({args.accuracy_feed} events only): {a['exact']}/{a['requests']} = "
              f"{a['exact_share']:.1%} exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
