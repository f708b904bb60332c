"""`kvroute engine`: run one engine server."""

from __future__ import annotations

import sys

from kvroute.engine.config import EngineConfig
from kvroute.engine.runners.config import CalibrateConfig
from kvroute.router.contract.cli_parser import Command, SettingsParser
from kvroute.router.contract.serve import LogConfig, bind_socket, run_app, setup_logging
from kvroute.router.contract.settings_values import build, pick

COMMAND = Command(prog="kvroute engine", description="Run a kvroute engine server.", env_prefix="KVROUTE_ENGINE_",
                  sections=(EngineConfig, CalibrateConfig, LogConfig), doc="docs/engine.md")


def build_parser() -> SettingsParser:
    return COMMAND.parser()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level)
        config = build(EngineConfig, **pick(EngineConfig, vars(args)))
        if args.calibrate:
            from kvroute.engine.runners.calibrate import run_calibration

            return run_calibration(config.runner, config.batch, args.calibrate_out)
        from kvroute.engine.runners.registry import model_config  # validate --model before binding a port
        from kvroute.router.contract.tokenizer import load_tokenizer

        runner = config.runner
        base = model_config(runner)
        load_tokenizer(runner.model)
        from kvroute.engine.runners.lora_config import read_adapters

        runner.adapters_named(config.server.served_model_name or base.name)
        read_adapters(runner.adapter_dirs, runner.max_lora_rank)  # configs checked; tensors when the runner loads
        if runner.backend == "torch":
            from kvroute.engine.runners.devices import check_device_available

            check_device_available(runner.device)
        if config.tiers.kv_store:
            from kvroute.engine.kv.store import check_reachable

            check_reachable(config.tiers.kv_store)
    except ValueError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(config.server.host, config.server.port)  # before the model loads: a busy port fails at once
    except OSError as e:
        print(f"kvroute engine: {e}", file=sys.stderr)
        return 1
    from kvroute.engine.service.server import DRAIN, create_app

    app = create_app(config)
    return run_app(app, sock, "engine " + config.server.instance, on_sigterm=lambda: app[DRAIN].start("SIGTERM"))


if __name__ == "__main__":
    sys.exit(main())
