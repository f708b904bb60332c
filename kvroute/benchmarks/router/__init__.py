"""Router benchmarks: decision time, and added latency / throughput over loopback.

    python -m kvroute.benchmarks.router decision --out decision.json
    python -m kvroute.benchmarks.router latency --out latency.json [--requests 2000] [--concurrency 32] [--only kvroute]
    python -m kvroute.benchmarks.router instructions --out instructions.json [--requests 300]

decision (decision.py): the router's own prepare (limits, tokenize, hash) and decide (index lookup,
candidates, kv_aware scoring, on_routed, all before the request is sent: "after the send" is 0 since the
decide stage records its choice itself, router/service/request_path.py), in process: 8k- and 32k-token
chats whose system prompt was seen before, never-seen 8k-token completions, memory and Redis index at 64
instances (alternately tokenized in place, as an idle router does, and through the tokenizer pool, as
with other requests in flight); token-id prompts at 64 and 1,024 instances. For never-seen prompts, the
router's own work is prepare + decide less the time spent inside the tokenizer's encode calls of the
same request (timed around them, reading the ids included), and, as a cross-check, less the same text
encoded alone right before (noisier: two separate timings).

latency (latency.py): 4 sim engines (near-zero model time); 1 KB non-streamed completions from a lean
closed-loop client (kvroute/benchmarks/http_load.py, its own process); per router (kvroute kv_aware,
round_robin, --workers 2; sglang-router and vllm-router from their own venvs when
installed, routers.py): c=1 latency against one engine direct, measured right before in the same run
(added = difference of the p50s and of the p99s), and requests/s at --concurrency.

instructions (instructions.py): one sim engine; each kvroute router variant, the no-routing floor (a
raw asyncio server + router/service/upstream.py, kvroute/benchmarks/proxy_floor.py) and the Rust routers
where installed, under valgrind's callgrind, counting the user-space instructions of --requests requests
(300) at concurrency 8 after a warm-up, startup and load/health polls excluded: a figure that other load
on the machine does not move (kernel time, the syscalls, is not in it). Needs valgrind.
"""
