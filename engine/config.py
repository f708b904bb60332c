"""Engine configuration: one frozen dataclass, CLI flags map 1:1 onto its fields."""

from __future__ import annotations

import dataclasses
import socket

from kvroute.engine.kv.links import LINKS
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.engine.runners.devices import check_device_syntax
from kvroute.router.contract.kv_encode import ENCODINGS
from kvroute.router.contract.kv_wire import SCHEMES
from kvroute.router.contract.protocol import ROLES

BACKENDS = ("torch", "sim")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    host: str = "127.0.0.1"
    port: int = 8001
    instance_id: str = ""  # default: "<hostname>:<port>"
    cluster_id: str = ""  # default: the instance id
    backend: str = "torch"
    role: str = "both"
    model: str | None = None  # local Hugging Face checkpoint dir; None = built-in tiny model
    served_model_name: str | None = None
    block_size: int = 16
    num_blocks: int = 4096
    max_batched_tokens: int = 2048
    max_running: int = 64
    max_waiting: int = 256
    redis: str | None = None
    cost_model: str = "cpu-tiny"  # sim backend only
    time_scale: float = 1.0  # sim backend only: multiply modelled step times
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    device: str = "cpu"
    cuda_graphs: bool = True  # torch on CUDA: decode steps replayed from graphs captured at start-up
    dtype: str | None = None  # override the checkpoint's dtype (float32, bfloat16, float16)
    event_buffer: int = 10_000
    kv_pin_ttl_s: float = 30.0  # prefill role: how long pinned blocks wait for their pull
    kv_admit_timeout_s: float = 10.0  # decode role: how long a remote-prefilled request waits for blocks
    kv_link: str = "loopback"  # sim backend: modelled KV transfer link (see engine/kv/links.py LINKS)
    kv_secret: str | None = None  # signs/verifies transfer grants and handles; default $KVROUTE_KV_SECRET
    kv_peers: tuple[str, ...] = ()  # hosts/IPs trusted for unsigned transfers (router/contract/kv_auth.py)
    registry: str | None = None  # redis:// URL of the fleet registry (router/contract/registry_record.py)
    advertise_url: str | None = None  # where routers reach this engine; default http://<host>:<port>
    registry_refresh_s: float = 1.0
    registry_ttl_s: float = 3.0
    admin_key: str | None = None  # guards /admin/* (drain, role); without one they are off
    drain_timeout_s: float = 30.0  # how long a drain lets running requests finish
    stall_timeout_s: float = 60.0  # /health answers 503 when a step has run this long with work waiting
    max_body_bytes: int = 0  # 0 = from the context: 32 bytes per token, at least 1 MiB (router/contract/limits.py)
    max_prompt_chars: int = 0  # 0 = 8 characters per token of context, checked before tokenizing
    tokenize_workers: int = 2  # threads tokenizing long prompts off the event loop
    tokenize_queue: int = 64  # long prompts that may wait for them; beyond, 503 + Retry-After
    # KV events in vLLM's ZeroMQ format as well (engine/service/zmq_publisher.py), for other routers.
    kv_events_zmq: str | None = None  # PUB endpoint to bind, e.g. tcp://127.0.0.1:5557
    kv_events_replay: str | None = None  # replay ROUTER endpoint to bind
    kv_events_encoding: str = "map"  # "map" (vLLM 0.26), "array" (older vLLM, SGLang), "map-batch" (newer vLLM)
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = 10_000  # batches kept for replay
    # KV tiers (docs/architecture.md#kv-tiers; engine/kv/tiers.py). 0 host blocks and no store: device pool only.
    host_blocks: int = 0  # second block pool in host memory (pinned on CUDA); 0 = off
    kv_store: str | None = None  # shared store: redis://host:port/db or file:///dir
    kv_store_id: str = ""  # instances with the same id share the store; default: the URL without credentials
    # "through": a prompt's blocks after its prefill; "evict": leaving the last local tier
    kv_store_write: str = "through"
    kv_store_timeout_s: float = 0.1  # a store read (lookup or fetch) waits at most this long, then recomputes
    kv_load_budget_bytes: int = 0  # loads copied into the device per step; 0 = what the H2D link moves in 20 ms
    # prior (sim backend: the modelled) host link figures, engine/kv/links.py LINKS; "" = by device
    kv_host_link: str = ""
    kv_store_link: str = ""  # prior (sim: modelled) store link figures; "" = by store scheme

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.role not in ROLES:
            raise ValueError(f"--role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"--block-size must be between 1 and 1024, got {self.block_size}")
        if self.num_blocks < 2:
            raise ValueError(f"--num-blocks must be at least 2, got {self.num_blocks}")
        if self.max_batched_tokens < self.block_size:
            raise ValueError("--max-batched-tokens must be at least the block size")
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError("--max-running must be >= 1 and --max-waiting >= 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be between 0 and 65535, got {self.port}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_pin_ttl_s <= 0 or self.kv_admit_timeout_s <= 0:
            raise ValueError("--kv-pin-ttl-s and --kv-admit-timeout-s must be positive")
        if not 0 < self.registry_refresh_s < self.registry_ttl_s:
            raise ValueError("--registry-refresh-s must be positive and shorter than --registry-ttl-s")
        if self.drain_timeout_s < 0:
            raise ValueError("--drain-timeout-s must be >= 0")
        if self.advertise_url and not self.advertise_url.startswith(("http://", "https://")):
            raise ValueError(f"--advertise-url must be an http(s) URL, got {self.advertise_url!r}")
        if self.registry and not self.registry.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"--registry must be a redis:// URL, got {self.registry!r}")
        if self.stall_timeout_s <= 0:
            raise ValueError("--stall-timeout-s must be positive")
        if self.time_scale <= 0:
            raise ValueError("--time-scale must be positive")
        if self.max_body_bytes < 0 or self.max_prompt_chars < 0:
            raise ValueError("--max-body-bytes and --max-prompt-chars must be >= 0 (0 = from the model's context)")
        if self.tokenize_workers < 1 or self.tokenize_queue < 1:
            raise ValueError("--tokenize-workers and --tokenize-queue must be >= 1")
        if self.cost_model not in COST_MODELS:
            raise ValueError(f"--cost-model must be one of {', '.join(COST_MODELS)}, got {self.cost_model!r}")
        if self.kv_link not in LINKS:
            raise ValueError(f"--kv-link must be one of {', '.join(LINKS)}, got {self.kv_link!r}")
        check_device_syntax(self.device)

        self._check_kv_events()
        self._check_tiers()

    def _check_kv_events(self) -> None:
        for flag, endpoint in (("--kv-events-zmq", self.kv_events_zmq), ("--kv-events-replay", self.kv_events_replay)):
            if endpoint is not None and not endpoint.startswith(SCHEMES):
                raise ValueError(f"{flag} must be a ZeroMQ endpoint to bind (tcp://127.0.0.1:5557), got {endpoint!r}")
        if self.kv_events_replay and not self.kv_events_zmq:
            raise ValueError("--kv-events-replay needs --kv-events-zmq")
        if self.kv_events_encoding not in ENCODINGS:
            raise ValueError(f"--kv-events-encoding must be map, array or map-batch, got {self.kv_events_encoding!r}")
        if self.kv_events_buffer_steps < 1:
            raise ValueError("--kv-events-buffer-steps must be at least 1")

    @property
    def advertise(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def _check_tiers(self) -> None:
        from kvroute.engine.kv.store import check_url
        from kvroute.engine.kv.tiers import STORE_WRITE_MODES

        if self.host_blocks < 0:
            raise ValueError(f"--host-blocks cannot be negative, got {self.host_blocks}")
        if self.kv_store is not None:
            check_url(self.kv_store)
        if self.kv_store_write not in STORE_WRITE_MODES:
            raise ValueError(f"--kv-store-write must be one of {', '.join(STORE_WRITE_MODES)}, "
                             f"got {self.kv_store_write!r}")
        if self.kv_store_timeout_s <= 0 or self.kv_load_budget_bytes < 0:
            raise ValueError("--kv-store-timeout-s must be positive and --kv-load-budget-bytes >= 0")
        for flag, link in (("--kv-host-link", self.kv_host_link), ("--kv-store-link", self.kv_store_link)):
            if link and link not in LINKS:
                raise ValueError(f"{flag} must be one of {', '.join(LINKS)}, got {link!r}")

    @property
    def instance(self) -> str:
        return self.instance_id or f"{socket.gethostname()}:{self.port}"

    @property
    def cluster(self) -> str:
        return self.cluster_id or self.instance
