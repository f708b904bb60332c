"""`kvroute engine`: run one engine server."""

from __future__ import annotations

import argparse
import sys

from engine.config import BACKENDS, ROLES, EngineConfig
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
    p.add_argument("--kv-events-zmq", default=d.kv_events_zmq, metavar="ENDPOINT",
                   help="also publish KV events in vLLM's ZeroMQ format, binding this endpoint")
    p.add_argument("--kv-events-replay", default=d.kv_events_replay, metavar="ENDPOINT",
                   help="bind a replay socket for missed batches (vLLM's replay_endpoint)")
    p.add_argument("--kv-events-encoding", choices=("map", "array", "map-batch"), default=d.kv_events_encoding,
                   help="map: vLLM 0.26 (maps in a positional batch); array: older vLLM, SGLang; "
                        "map-batch: maps throughout (newer vLLM)")
    p.add_argument("--kv-events-topic", default=d.kv_events_topic)
    p.add_argument("--kv-events-buffer-steps", type=int, default=d.kv_events_buffer_steps)
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
    except ValueError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 2
    from engine.server import create_app
    from router.serve import run_app

    return run_app(create_app(config), config.host, config.port)


if __name__ == "__main__":
    sys.exit(main())
