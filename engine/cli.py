"""`kvroute engine`: run one engine server."""

from __future__ import annotations

import argparse
import sys

from engine.config import BACKENDS, ROLES, EngineConfig
from engine.tiers import STORE_WRITE_MODES
from router.serve import config_values, setup_logging


def build_parser() -> argparse.ArgumentParser:
    d = EngineConfig()
    p = argparse.ArgumentParser(prog="kvroute engine", description="Run a kvroute engine server.")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--instance-id", default=d.instance_id, help="default: <hostname>:<port>")
    p.add_argument("--cluster-id", default=d.cluster_id, help="default: the instance id")
    p.add_argument("--backend", choices=BACKENDS, default=d.backend)
    p.add_argument("--role", choices=ROLES, default=d.role)
    p.add_argument("--model", default=d.model, help="local Hugging Face Llama-family checkpoint dir")
    p.add_argument("--served-model-name", default=d.served_model_name)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--num-blocks", type=int, default=d.num_blocks)
    p.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens)
    p.add_argument("--max-running", type=int, default=d.max_running)
    p.add_argument("--max-waiting", type=int, default=d.max_waiting)
    p.add_argument("--redis", default=d.redis, help="also append KV events to this Redis's stream")
    p.add_argument("--cost-model", default=d.cost_model, help="sim backend: cost model preset")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="sim backend: scale step times")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--num-threads", type=int, default=d.num_threads)
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16", "float16"),
                   help="override the checkpoint's dtype (bf16 is slow on most CPUs)")
    p.add_argument("--kv-pin-ttl-s", type=float, default=d.kv_pin_ttl_s,
                   help="prefill role: seconds pinned blocks wait to be pulled")
    p.add_argument("--kv-admit-timeout-s", type=float, default=d.kv_admit_timeout_s,
                   help="decode role: seconds a remote-prefilled request may wait for free blocks")
    p.add_argument("--kv-link", default=d.kv_link, help="sim backend: modelled KV link (nvlink, infiniband, loopback)")
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
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        config = EngineConfig(**config_values(EngineConfig, args))
        if args.calibrate:
            from engine.calibrate import run_calibration

            return run_calibration(config, args.calibrate_out)
        from engine.model.config import ModelConfig  # validate --model before binding a port

        from router.tokenizer import load_tokenizer

        if config.model:
            ModelConfig.from_hf_dir(config.model)
        load_tokenizer(config.model)
        if config.kv_store:
            from engine.kvstore import check_reachable

            check_reachable(config.kv_store)
    except ValueError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 2
    from engine.server import create_app
    from router.serve import run_app

    return run_app(create_app(config), config.host, config.port)


if __name__ == "__main__":
    sys.exit(main())
