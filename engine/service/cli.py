"""`kvroute engine`: run one engine server."""

from __future__ import annotations

import argparse
import os
import sys

from kvroute.engine.config import BACKENDS, ROLES, EngineConfig
from kvroute.engine.kv.links import LINKS
from kvroute.engine.kv.tiers import STORE_WRITE_MODES
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.router.contract.cli_help import HelpFormatter
from kvroute.router.contract.kv_encode import ENCODINGS
from kvroute.router.contract.serve import bind_socket, config_values, run_app, setup_logging


def build_parser() -> argparse.ArgumentParser:
    d = EngineConfig()
    p = argparse.ArgumentParser(prog="kvroute engine", description="Run a kvroute engine server.",
                                formatter_class=HelpFormatter)
    p.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=d.port, help="port to listen on (checked before the model loads)")
    p.add_argument("--instance-id", default=d.instance_id,
                   help="id in KV events and metrics (default: <hostname>:<port>)")
    p.add_argument("--cluster-id", default=d.cluster_id, help="KV transfer link id (default: the instance id)")
    p.add_argument("--backend", choices=BACKENDS, default=d.backend,
                   help="torch: real forward; sim: step times from a cost model")
    p.add_argument("--role", choices=ROLES, default=d.role, help="prefill/decode disaggregation role")
    p.add_argument("--model", default=d.model,
                   help="local Hugging Face Llama-family checkpoint dir (default: the built-in tiny model)")
    p.add_argument("--served-model-name", default=d.served_model_name,
                   help="model id in the API (default: the checkpoint's name)")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument("--num-blocks", type=int, default=d.num_blocks, help="KV blocks in the pool")
    p.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens, help="token budget of one step")
    p.add_argument("--max-running", type=int, default=d.max_running, help="sequences in the running batch")
    p.add_argument("--max-waiting", type=int, default=d.max_waiting, help="queued requests before 503s")
    p.add_argument("--redis", default=d.redis, help="also append KV events to this Redis's stream (redis://...)")
    p.add_argument("--cost-model", default=d.cost_model, help=f"sim backend: one of {', '.join(COST_MODELS)}")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="sim backend: multiply step times")
    p.add_argument("--seed", type=int, default=d.seed, help="random weights and unseeded sampling")
    p.add_argument("--num-threads", type=int, default=d.num_threads,
                   help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--device", default=d.device, help="torch backend: cpu, cuda, cuda:N or mps")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=d.cuda_graphs,
                   help="torch on CUDA: replay decode steps from CUDA graphs captured at start-up, per batch "
                        "and context bucket; --no-cuda-graphs: every step eager (default: on)")
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16", "float16"),
                   help="override the checkpoint's dtype (bf16 is slow on most CPUs)")
    p.add_argument("--kv-pin-ttl-s", type=float, default=d.kv_pin_ttl_s,
                   help="prefill role: seconds pinned blocks wait to be pulled")
    p.add_argument("--kv-admit-timeout-s", type=float, default=d.kv_admit_timeout_s,
                   help="decode role: seconds a remote-prefilled request may wait for free blocks")
    p.add_argument("--kv-link", default=d.kv_link, help=f"sim backend: modelled KV link, one of {', '.join(LINKS)}")
    p.add_argument("--kv-secret", default=None,
                   help="shared secret for prefill/decode transfer grants and handles (default: $KVROUTE_KV_SECRET)")
    p.add_argument("--kv-peers", type=lambda v: tuple(h.strip() for h in v.split(",") if h.strip()), default=(),
                   help="comma-separated hosts/IPs trusted for unsigned KV transfers (default: none)")
    p.add_argument("--registry", default=d.registry,
                   help="register in this Redis fleet registry (redis://...) so routers find this engine")
    p.add_argument("--advertise-url", default=d.advertise_url,
                   help="URL routers use to reach this engine (default: http://<host>:<port>)")
    p.add_argument("--registry-refresh-s", type=float, default=d.registry_refresh_s,
                   help="seconds between registry refreshes")
    p.add_argument("--registry-ttl-s", type=float, default=d.registry_ttl_s,
                   help="an engine that stops refreshing lapses from the registry after this long")
    p.add_argument("--admin-key", default=os.environ.get("KVROUTE_ADMIN_KEY") or d.admin_key,
                   help="require 'Authorization: Bearer KEY' on /admin/drain and /admin/role, off without one "
                        "(default: $KVROUTE_ADMIN_KEY)")
    p.add_argument("--drain-timeout-s", type=float, default=d.drain_timeout_s,
                   help="on SIGTERM or /admin/drain: seconds running requests get to finish")
    p.add_argument("--stall-timeout-s", type=float, default=d.stall_timeout_s,
                   help="/health answers 503 once one model step has run this long (a hung engine)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="largest request body; 0 = 32 bytes per token of the model's context, at least 1 MiB")
    p.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars,
                   help="longest prompt in characters, checked before tokenizing; 0 = 8 per token of context")
    p.add_argument("--tokenize-workers", type=int, default=d.tokenize_workers,
                   help="threads that tokenize long prompts off the event loop")
    p.add_argument("--tokenize-queue", type=int, default=d.tokenize_queue,
                   help="long prompts that may wait for a tokenizer thread; beyond it, 503 + Retry-After")
    p.add_argument("--kv-events-zmq", default=d.kv_events_zmq, metavar="ENDPOINT",
                   help="also publish KV events in vLLM's ZeroMQ format, binding this endpoint")
    p.add_argument("--kv-events-replay", default=d.kv_events_replay, metavar="ENDPOINT",
                   help="bind a replay socket for missed batches (vLLM's replay_endpoint)")
    p.add_argument("--kv-events-encoding", choices=ENCODINGS, default=d.kv_events_encoding,
                   help="map: vLLM 0.26 (maps in a positional batch); array: older vLLM, SGLang; "
                        "map-batch: maps throughout (newer vLLM)")
    p.add_argument("--kv-events-topic", default=d.kv_events_topic, help="topic frame of the ZeroMQ messages")
    p.add_argument("--kv-events-buffer-steps", type=int, default=d.kv_events_buffer_steps,
                   help="event batches kept for replay")
    p.add_argument("--host-blocks", type=int, default=d.host_blocks,
                   help="KV blocks in a host-memory pool that keeps blocks evicted from the device (0 = off)")
    p.add_argument("--kv-store", default=d.kv_store, help="shared K/V store: redis://host:port/db or file:///dir")
    p.add_argument("--kv-store-id", default=d.kv_store_id,
                   help="engines with the same id share the store's blocks (default: the URL without credentials)")
    p.add_argument("--kv-store-write", choices=STORE_WRITE_MODES, default=d.kv_store_write,
                   help="through: a prompt's blocks after its prefill; evict: blocks leaving the last local tier")
    p.add_argument("--kv-store-timeout-s", type=float, default=d.kv_store_timeout_s,
                   help="a store lookup or read waits at most this long before the engine recomputes")
    p.add_argument("--kv-load-budget-bytes", type=int, default=d.kv_load_budget_bytes,
                   help="K/V bytes loaded into the device per step (0 = what the host link moves in 20 ms)")
    p.add_argument("--kv-host-link", default=d.kv_host_link,
                   help="host link figures to start from (sim backend: to model): pcie4, pcie5, cpu-memcpy, ...")
    p.add_argument("--kv-store-link", default=d.kv_store_link,
                   help="store link figures to start from (sim backend: to model): infiniband, nvme, cpu-redis, ...")
    p.add_argument("--calibrate", action="store_true",
                   help="with --backend sim: measure the torch runner here and print fitted cost coefficients")
    p.add_argument("--calibrate-out", default=None, help="write the calibration JSON here")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level)
        config = EngineConfig(**config_values(EngineConfig, args))
        if args.calibrate:
            from kvroute.engine.runners.calibrate import run_calibration

            return run_calibration(config, args.calibrate_out)
        from kvroute.engine.runners.model.config import ModelConfig  # validate --model before binding a port
        from kvroute.router.contract.tokenizer import load_tokenizer

        if config.model:
            ModelConfig.from_hf_dir(config.model)
        load_tokenizer(config.model)
        if config.backend == "torch":
            from kvroute.engine.runners.devices import check_device_available

            check_device_available(config.device)
        if config.kv_store:
            from kvroute.engine.kv.store import check_reachable

            check_reachable(config.kv_store)
    except ValueError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(config.host, config.port)  # before the model loads: a busy port fails at once
    except OSError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 1
    from kvroute.engine.service.server import DRAIN, create_app

    app = create_app(config)
    return run_app(app, sock, "engine " + config.instance, on_sigterm=lambda: app[DRAIN].start("SIGTERM"))


if __name__ == "__main__":
    sys.exit(main())
