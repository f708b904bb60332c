"""The registry of the benchmarks page (python -m kvroute.scripts.benchmarks_page): what docs/benchmarks.md
measures, and how each is shown.

Each entry is one command (run with the current interpreter from the repository root), the JSON
file it writes (`{out}` in its arguments is replaced by a path under the work directory), and a
renderer for that JSON. Full-only entries are the long ones: `--quick` leaves them out.
"""

from __future__ import annotations

import dataclasses

from kvroute.scripts.benchmarks_page import render

CLI = ("-m", "kvroute")
SIM_PRESSURE = ("--instances", "8", "--num-blocks", "1024", "--policy", "kv_aware,oracle", "--workload", "doc-qa",
                "--doc-tokens", "2400", "--question-tokens", "40", "--output-tokens", "8", "--requests", "3000",
                "--rate", "24", "--request-overhead", "0.005")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    name: str
    title: str
    about: str  # what the figures mean; never figures themselves
    args: tuple[str, ...]  # after the interpreter; "{out}" is the output path
    out: str  # file or directory name under the work directory
    result: str = ""  # the JSON file inside `out` when `out` is a directory
    render: render.Renderer = render.generic
    full_only: bool = False


ENTRIES = (
    Entry(name="sim-pressure", title="Simulator: KV capacity pressure",
          about="8 instances x 1,024 blocks (16k tokens each); 48 documents of 2,400 tokens need 7,200 of the "
                "fleet's 8,192 blocks, so every placement evicts something. kv_aware prices what a placement "
                "evicts; the oracle knows every cache and queue exactly and minimises each request's TTFT alone, "
                "so it is a reference, not a bound: a document cached nowhere predicts the same TTFT everywhere, "
                "so the oracle places it at random and evicts whatever is there, while kv_aware sends it where "
                "the victims are least likely to be asked for again.",
          args=(*CLI, "sim", *SIM_PRESSURE, "--documents", "48", "--zipf", "0.9", "--out", "{out}"),
          out="sim-pressure-48.json", render=render.sim),
    Entry(name="sim-pressure-80", title="Simulator: more documents than fit",
          about="The same cluster with 80 documents (12,000 blocks' worth) and a steeper Zipf 1.1.",
          args=(*CLI, "sim", *SIM_PRESSURE, "--documents", "80", "--zipf", "1.1", "--out", "{out}"),
          out="sim-pressure-80.json", render=render.sim),
    Entry(name="sim-suite", title="Simulator: every workload against the oracle",
          about="Every policy with its defaults on one cluster (8 x 1,024 blocks, 5 ms request overhead) over the "
                "shared-prefix, multi-turn, doc-qa, random and hot-prefix workloads, the Mooncake trace (the "
                "package's sample, loadgen/data/) and the KV pressure sweep. Cells: TTFT p90 and cached share, "
                "each relative to the oracle's. oracle_future adds the price of exactly the victims the "
                "workload's future asks for again.",
          args=(*CLI, "sim", "--suite", "--out", "{out}"), out="sim-suite.json", render=render.suite),
    Entry(name="sim-scale", title="Simulator at scale",
          about="1,024 instances and 100,000 shared-prefix requests; kv_aware with --fast-candidates 16 scores "
                "only the holders of the prompt's first block, its recent targets and the 16 least loaded. "
                "The two policies run side by side, one process per core (--jobs): sim wall s is each simulation's "
                "own, read while the other runs, and the whole command's wall time is below the table.",
          args=(*CLI, "sim", "--instances", "1024", "--policy", "kv_aware,oracle", "--workload", "shared-prefix",
                "--groups", "256", "--prefix-tokens", "128", "--question-tokens", "32", "--output-tokens", "4",
                "--rate", "2000", "--fast-candidates", "16", "--requests", "100000", "--out", "{out}"),
          out="sim-scale.json", render=render.sim),
    Entry(name="bench-quick", title="Policies over HTTP: kvroute bench --quick on sim engines",
          about="8 sim engines behind a real router, one fresh cluster per policy, the same shared-prefix "
                "workload and seed. The last column is each run's TTFT p90 over the first run's. prefix_hash keeps "
                "a group on one engine too, but its ring can put several groups on one engine, whose cache then "
                "thrashes.",
          args=(*CLI, "bench", "--quick", "--backend", "sim", "--no-progress", "--out", "{out}"),
          out="bench-quick", result="results.json", render=render.bench),
    Entry(name="decision", title="The router's decision time",
          about="In process: prepare (limits, tokenize, hash) plus decide (index lookup, candidates, kv_aware "
                "scoring, the policy learning its choice), medians of 200 decisions; 8 of the instances hold growing "
                "shares of the prompt's prefix. The proxy has the policy learn its choice once the request is on the "
                "wire (pending blocks, reuse history): 'after the send' is that part of decide, which the request "
                "does not wait for. "
                "A seen system prompt costs a lookup in the segment cache instead of tokenizing; what is left grows "
                "with the prompt's block count, not with the fleet. Never-seen prompts alternate between tokenizing in "
                "place (what an idle router does) and through the tokenizer pool (with other requests in flight). "
                "For them, 'outside the tokenizer' "
                "is prepare + decide less the time spent inside that request's own tokenizer calls (reading the ids "
                "included); 'over the tokenizer alone' subtracts the same text encoded separately right before "
                "(two timings of ~6-9 ms each: it swings by about 1 ms).",
          args=("-m", "kvroute.benchmarks.router", "decision", "--out", "{out}"), out="decision.json",
          render=render.decision),
    Entry(name="chaos-quick", title="Chaos: kvroute chaos --quick",
          about="A redis-server, 2 sim engines and 1 router on loopback under steady load, while a sample of the "
                "malformed-body catalog goes to the router and to an engine and one engine is killed and "
                "restarted. The run fails if any invariant breaks.",
          args=(*CLI, "chaos", "--quick", "--out", "{out}"), out="chaos-quick", result="results.json",
          render=render.chaos),
    Entry(name="chaos-trust", title="Chaos: every channel a trust boundary",
          about="The trust scenarios on the full chaos fleet (3 sim engines, 2 routers, Redis) under steady load: "
                "a router's ZeroMQ feed poisoned (deep nesting, a frame over 16 MiB, garbage) and flooded with "
                "1,000,000 stored blocks for a 4,096-block engine; 300 slow-header and 300 silent connections; "
                "introspection on a router with only --api-key; an unsigned registry record for a fake engine; "
                "non-streamed requests while an engine is SIGSTOPped; a transfer handle replayed with another "
                "prompt tail. Scenario rows and their details below. The background load is 10 requests/s, not "
                "the default 40: several scenarios start servers of their own (up to three processes) on the same "
                "2 cores, and at 40 the fleet's 5 s request timeout then measures CPU starvation.",
          args=(*CLI, "chaos", "--rate", "10", "--scenarios", "kv-feed-poison,slow-clients,introspection-auth,"
                "rogue-registry,engine-hang-whole,handle-replay,kv-feed-flood", "--out", "{out}"), out="chaos-trust",
          result="results.json", render=render.chaos),
    Entry(name="kvevents", title="KV events over ZeroMQ: decode, throughput, lag",
          about="Decoding a vLLM-format batch with its validation (us per batch, best of 5 x 2,000); subscriber "
                "throughput into the memory index (router blocks/s, consumer pinned to one core); lag from a "
                "batch's publish timestamp to its events in the index. SGLang's page size 1 costs one map entry "
                "per token, so its router blocks/s are lower for the same engine blocks/s.",
          args=("-m", "kvroute.benchmarks.kvevents", "all", "--json", "{out}"), out="kvevents.json"),
    Entry(name="torch-demo", title="The torch demo (kvroute demo)", full_only=True,
          about="4 torch engines with the built-in tiny model behind the router, one run per policy.",
          args=(*CLI, "demo", "--no-progress", "--out", "{out}"), out="demo", result="results.json",
          render=render.bench),
    Entry(name="torch-runner", title="Torch runner: TTFT by cached share, decode throughput", full_only=True,
          about="The built-in model on 1 thread; TTFT of a 2,048-token prompt with 0, 1,024 and 1,792 tokens cached.",
          args=("-m", "kvroute.benchmarks.torch_runner", "--out", "{out}"), out="torch.json"),
    Entry(name="sim-vs-torch", title="Sim runner against torch runner over HTTP", full_only=True,
          about="The same streamed requests to a torch engine and to a sim engine with the cpu-tiny cost model.",
          args=("-m", "kvroute.benchmarks.engine", "--out", "{out}"), out="engine.json"),
    Entry(name="disagg", title="Prefill/decode disaggregation against in place", full_only=True,
          about="An idle pair of torch engines; what the disaggregated path adds to TTFT and E2E by prompt length.",
          args=("-m", "kvroute.benchmarks.disagg", "--out", "{out}"), out="disagg.json"),
    Entry(name="tier-links", title="KV tier links on this machine", full_only=True,
          about="Bandwidth and latency fitted for the host pool and the Redis and file stores.",
          args=("-m", "kvroute.benchmarks.tiers", "links", "--out", "{out}"), out="tier-links.json"),
    Entry(name="tier-ttft", title="TTFT of a returning session by tier", full_only=True,
          about="A torch engine whose device pool cannot keep the session; where its K/V comes back from.",
          args=("-m", "kvroute.benchmarks.tiers", "ttft", "--out", "{out}"), out="tier-ttft.json"),
    Entry(name="tier-storm", title="Session-recovery storm at scale (simulator)", full_only=True,
          about="64 simulated A100-class instances (the a100-llama2-7b cost model, from published A100 figures: "
                "not measured on a GPU); 1,024 sessions return within 2 s, per tier setup.",
          args=("-m", "kvroute.benchmarks.sim_storm", "--out", "{out}"), out="sim-storm.json"),
    Entry(name="fleet", title="A fleet that changes: join, kill, drain", full_only=True,
          about="Sim engines on loopback with a real redis-server registry.",
          args=("-m", "kvroute.benchmarks.fleet", "--repeats", "3", "--out", "{out}"), out="fleet.json"),
    Entry(name="planner", title="The planner against static splits (simulator)", full_only=True,
          about="64 simulated A100-class instances (the a100-llama2-7b cost model, from published A100 figures: "
                "not measured on a GPU) on a workload whose first half is prompt-heavy and second decode-heavy.",
          args=("-m", "kvroute.benchmarks.planner", "sim", "--instances", "64", "--rate", "200", "--requests", "48000",
                "--num-blocks", "16384", "--step", "8", "--out", "{out}"), out="planner.json"),
    Entry(name="foreign-accuracy", title="Prediction accuracy from ZeroMQ events", full_only=True,
          about="8 sim engines publishing vLLM's format; the router's predicted cached tokens against the engine's.",
          args=("-m", "kvroute.benchmarks.foreign", "--accuracy-only", "--out", "{out}"), out="foreign",
          result="accuracy.json"),
    Entry(name="router-latency", title="Added latency and throughput of the router", full_only=True,
          about="4 sim engines with near-zero model time; each router measured right after the engine direct.",
          args=("-m", "kvroute.benchmarks.router", "latency", "--out", "{out}"), out="latency.json",
          render=render.latency),
    Entry(name="router-instructions", title="The router's user-space instructions per request", full_only=True,
          about="One sim engine; each kvroute variant, the no-routing floor (raw asyncio server + kvroute's upstream "
                "client) and the Rust routers (where installed) under valgrind's callgrind, 300 requests at "
                "concurrency 8 after a warm-up: a count that other load on the machine does not move (wall-clock "
                "CPU does); user space only, so the syscalls every router makes are not in it.",
          args=("-m", "kvroute.benchmarks.router", "instructions", "--out", "{out}"), out="instructions.json",
          render=render.instructions),
    Entry(name="gateway", title="Gateway: Envoy + endpoint picker against the proxy", full_only=True,
          about="4 sim engines with near-zero model time; whole answers (1 KB prompt, 16 tokens) and 256-token "
                "streams; each router started fresh, added p50 at c=1 against one engine direct, then c=32 for "
                "10 s with the CPU of each of its processes (Envoy and kvroute apart) per request served, also "
                "less what each burns idle (load and event polls, which weigh most on the slow stream runs). "
                "Envoy's request body FULL_DUPLEX_STREAMED (GIE's) and BUFFERED (a message less per request); the "
                "floors serve the picker's messages with no routing on each of its gRPC servers "
                "(`--ext-proc-server lean`, the default, and `grpcio`).",
          args=("-m", "kvroute.benchmarks.gateway", "--out", "{out}"), out="gateway.json", render=render.gateway),
    Entry(name="decision-scale", title="Decision time against fleet size (simulator)", full_only=True,
          about="Index lookup + candidates + kv_aware score with every pool full, all candidates and fast path.",
          args=("-m", "kvroute.benchmarks.sim_scale", "--out", "{out}"), out="sim-scale-decisions.json"),
    Entry(name="adapters", title="LoRA adapters: cached share with three adapters, four engines", full_only=True,
          about="Three adapters served by four engines (--lora-modules, all three in slots), a shared-prefix workload, "
                "kv_aware and round_robin, in the simulator and over HTTP on sim and torch engines. Setups: none (no "
                "adapters); group (each prefix group under one adapter, as a fine-tuned task keeps its own system "
                "prompt: as many distinct prefixes as without adapters); request (round-robin per request, so every "
                "group is asked under every adapter: three times the distinct prefixes, since an adapter's K/V is its "
                "own); none, 3x groups (the simulator only: no adapters and three times the groups, the fair "
                "comparison for request). cached / none is the cached share over the same part and policy's without "
                "adapters; issue 41 asks at least 0.9 of kv_aware under group (kvroute/benchmarks/adapters.py).",
          args=("-m", "kvroute.benchmarks.adapters", "--out", "{out}"), out="adapters.json", render=render.adapters),
)

BY_NAME = {e.name: e for e in ENTRIES}
