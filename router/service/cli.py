"""`kvroute router`: run the KV-cache-aware router."""

from __future__ import annotations

import sys

from kvroute.router.contract.cli_parser import Command, SettingsParser
from kvroute.router.contract.serve import LogConfig, bind_socket, run_app, setup_logging
from kvroute.router.contract.settings_values import build, pick
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.tenant_book import TenantBook

COMMAND = Command(prog="kvroute router", description="Run the KV-cache-aware OpenAI router.",
                  env_prefix="KVROUTE_ROUTER_", sections=(RouterConfig, LogConfig), doc="docs/router.md")


def build_parser() -> SettingsParser:
    return COMMAND.parser()


def _check_gateway_extra() -> None:
    """--ext-proc-port's packages (grpcio, grpcio-health-checking, xds-protos), or a ValueError saying so."""
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
        from grpc_health.v1 import health  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--ext-proc-port needs grpcio, grpcio-health-checking and xds-protos ({e}): "
                         "pip install 'kvroute[gateway]'") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level)
        config = build(RouterConfig, **pick(RouterConfig, vars(args)))
        from kvroute.router.contract.tokenizer import load_tokenizer

        load_tokenizer(config.tokenizer)
        if config.ext_proc_port is not None:
            _check_gateway_extra()
        TenantBook(config.tenants, config.tenant_keys(), config.tenant_header, config.trust_tenant_header)
    except (ValueError, OSError) as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 2
    from kvroute.router.service.workers import bind_reuseport, supervise, worker_socket

    sock = worker_socket()  # one of --workers: the supervisor bound it
    try:
        if sock is None and config.workers > 1:
            return supervise(argv, bind_reuseport(config.host, config.port, config.workers))
        if sock is None:
            sock = bind_socket(config.host, config.port)
    except OSError as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 1
    from kvroute.router.service.app import create_app

    return run_app(create_app(config), sock, "router")


if __name__ == "__main__":
    sys.exit(main())
