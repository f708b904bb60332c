"""The engine's settings: one section per part, each declared once (router/contract/settings.py), made
here at the top of the engine and handed to each part alone: the core its batch (engine/core/config.py),
the runner its runner section (engine/runners/config.py), the tiers theirs (engine/kv/config.py); the
server's and the ZeroMQ publisher's sections are here. `kvroute engine`'s flags, environment
variables and docs/engine.md's table come from them.

    build(EngineConfig, backend="sim", num_blocks=64, port=0)  # flat names, each to its section
"""

from __future__ import annotations

import dataclasses
import socket

from kvroute.engine.core.config import BatchConfig
from kvroute.engine.core.work import RunnerInfo
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.tier_setup import TierSite
from kvroute.engine.runners.config import RunnerConfig
from kvroute.router.contract.constraints import HTTP_URL, NOT_NEGATIVE, POSITIVE, Prefix, Range, at_least
from kvroute.router.contract.kv_encode import ENCODINGS
from kvroute.router.contract.kv_wire import SCHEMES
from kvroute.router.contract.limits import RequestLimits
from kvroute.router.contract.protocol import ROLES
from kvroute.router.contract.settings import check_settings, section, setting

ZMQ_ENDPOINT = Prefix(SCHEMES, "a ZeroMQ endpoint to bind (tcp://127.0.0.1:5557)")
REDIS_URL = Prefix(("redis://", "rediss://", "unix://"), "a redis:// URL")


def _hosts(text: str) -> tuple[str, ...]:
    return tuple(h.strip() for h in text.split(",") if h.strip())


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """engine server (engine/service)"""

    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0: all interfaces)")
    port: int = setting(8001, "port to listen on (checked before the model loads)", check=Range(0, 65535))
    instance_id: str = setting("", "id in KV events and metrics", default_text="<hostname>:<port>")
    cluster_id: str = setting("", "KV transfer link id", default_text="the instance id")
    role: str = setting("both", "prefill/decode disaggregation role", choices=ROLES)
    served_model_name: str | None = setting(None, "model id in the API", default_text="the checkpoint's name")
    redis: str | None = setting(None, "also append KV events to this Redis's stream (redis://...)")
    kv_pin_ttl_s: float = setting(30.0, "prefill role: seconds pinned blocks wait to be pulled", check=POSITIVE)
    kv_admit_timeout_s: float = setting(10.0, "decode role: seconds a remote-prefilled request may wait for free "
                                              "blocks", check=POSITIVE)
    kv_secret: str | None = setting(None, "shared secret for prefill/decode transfer grants and handles",
                                    env=("KVROUTE_KV_SECRET",))
    kv_peers: tuple[str, ...] = setting((), "comma-separated hosts/IPs trusted for unsigned KV transfers "
                                            "(router/contract/kv_auth.py)", parse=_hosts, metavar="HOST,HOST")
    registry: str | None = setting(None, "register in this Redis fleet registry (redis://...) so routers find this "
                                         "engine", check=REDIS_URL)
    advertise_url: str | None = setting(None, "URL routers use to reach this engine", check=HTTP_URL,
                                        default_text="http://<host>:<port>")
    registry_refresh_s: float = setting(1.0, "seconds between registry refreshes (less than --registry-ttl-s)",
                                        check=POSITIVE)
    registry_ttl_s: float = setting(3.0, "an engine that stops refreshing lapses from the registry after this long",
                                    check=POSITIVE)
    admin_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /admin/drain and /admin/role, off "
                                          "without one", env=("KVROUTE_ADMIN_KEY",))
    drain_timeout_s: float = setting(30.0, "on SIGTERM or /admin/drain: seconds running requests get to finish",
                                     check=NOT_NEGATIVE)
    stall_timeout_s: float = setting(60.0, "/health answers 503 once one model step has run this long (a hung "
                                           "engine)", check=POSITIVE)
    limits: RequestLimits = section(RequestLimits)

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.registry_refresh_s < self.registry_ttl_s:
            raise ValueError("--registry-refresh-s must be shorter than --registry-ttl-s")

    @property
    def instance(self) -> str:
        return self.instance_id or f"{socket.gethostname()}:{self.port}"

    @property
    def cluster(self) -> str:
        return self.cluster_id or self.instance

    @property
    def advertise(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZmqEventsConfig:
    """KV events in vLLM's ZeroMQ format (engine/service/zmq_publisher.py), for other routers"""

    kv_events_zmq: str | None = setting(None, "also publish KV events in vLLM's ZeroMQ format, binding this endpoint",
                                        check=ZMQ_ENDPOINT, metavar="ENDPOINT", default_text="off")
    kv_events_replay: str | None = setting(None, "bind a replay socket for missed batches (vLLM's replay_endpoint)",
                                           check=ZMQ_ENDPOINT, metavar="ENDPOINT", default_text="off")
    kv_events_encoding: str = setting("map", "map: vLLM 0.26 (maps in a positional batch); array: older vLLM, "
                                             "SGLang; map-batch: maps throughout (newer vLLM)", choices=ENCODINGS)
    kv_events_topic: str = setting("", "topic frame of the ZeroMQ messages", default_text="''")
    kv_events_buffer_steps: int = setting(10_000, "event batches kept for replay", check=at_least(1))

    def __post_init__(self) -> None:
        check_settings(self)
        if self.kv_events_replay and not self.kv_events_zmq:
            raise ValueError("--kv-events-replay needs --kv-events-zmq")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine's sections; each part of the engine is given its own."""

    server: ServerConfig = section(ServerConfig)
    runner: RunnerConfig = section(RunnerConfig)
    batch: BatchConfig = section(BatchConfig)
    tiers: TierConfig = section(TierConfig)
    zmq: ZmqEventsConfig = section(ZmqEventsConfig)

    def __post_init__(self) -> None:
        self.runner.adapters_named(self.server.served_model_name or "")  # no adapter named as the model

    def model_name(self, info: RunnerInfo) -> str:
        """The model's id in the API, the metrics and the store: --served-model-name, else the runner's model's."""
        return self.server.served_model_name or info.model

    def tier_site(self, info: RunnerInfo) -> TierSite:
        """What the tiers need of this engine, once its runner is up (`info`: its model)."""
        return TierSite(model=self.model_name(info), block_size=self.batch.block_size,
                        device=self.runner.device, time_scale=self.runner.time_scale)
