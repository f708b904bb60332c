"""Engine configuration: one frozen dataclass, CLI flags map 1:1 onto its fields."""

from __future__ import annotations

import dataclasses
import socket

BACKENDS = ("torch", "sim")
ROLES = ("both", "prefill", "decode")


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
    dtype: str | None = None  # override the checkpoint's dtype (float32, bfloat16, float16)
    event_buffer: int = 10_000
    kv_pin_ttl_s: float = 30.0  # prefill role: how long pinned blocks wait for their pull
    kv_admit_timeout_s: float = 10.0  # decode role: how long a remote-prefilled request waits for blocks
    kv_link: str = "loopback"  # sim backend: modelled KV transfer link (see engine/sim.py LINKS)
    # KV events in vLLM's ZeroMQ format as well (engine/zmq_publisher.py), for other routers.
    kv_events_zmq: str | None = None  # PUB endpoint to bind, e.g. tcp://127.0.0.1:5557
    kv_events_replay: str | None = None  # replay ROUTER endpoint to bind
    kv_events_encoding: str = "map"  # "map" (vLLM 0.26), "array" (older vLLM, SGLang), "map-batch" (newer vLLM)
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = 10_000  # batches kept for replay

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
        if self.time_scale <= 0:
            raise ValueError("--time-scale must be positive")
        self._check_kv_events()

    def _check_kv_events(self) -> None:
        for flag, endpoint in (("--kv-events-zmq", self.kv_events_zmq), ("--kv-events-replay", self.kv_events_replay)):
            if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"{flag} must be a ZeroMQ endpoint to bind (tcp://127.0.0.1:5557), got {endpoint!r}")
        if self.kv_events_replay and not self.kv_events_zmq:
            raise ValueError("--kv-events-replay needs --kv-events-zmq")
        if self.kv_events_encoding not in ("map", "array", "map-batch"):
            raise ValueError(f"--kv-events-encoding must be map, array or map-batch, got {self.kv_events_encoding!r}")
        if self.kv_events_buffer_steps < 1:
            raise ValueError("--kv-events-buffer-steps must be at least 1")

    @property
    def instance(self) -> str:
        return self.instance_id or f"{socket.gethostname()}:{self.port}"

    @property
    def cluster(self) -> str:
        return self.cluster_id or self.instance
