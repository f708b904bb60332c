"""What the fleet reads of the router's configuration: its section, as a protocol.

The fleet (cluster, engine kinds, feeds' timeouts) never imports the router service; the service's
`RouterConfig` (router/service/config.py) satisfies this, and so does anything else with these fields
(a test's stand-in, another driver's settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvroute.router.contract.limits import RequestLimits


class FleetSettings(Protocol):
    @property
    def engines(self) -> Sequence[str]: ...  # static engine URLs
    @property
    def engine_kinds(self) -> Sequence[str]: ...  # --engine-kind values (router/fleet/kinds)
    @property
    def workers(self) -> int: ...  # router processes sharing the port: each instance counts the others' in flight
    @property
    def tokenizer(self) -> str | None: ...  # the router's tokenizer directory (None: built-in), for vLLM/SGLang
    @property
    def kv_event_block_size(self) -> int: ...  # the router's block size for vLLM/SGLang engines
    @property
    def limits(self) -> RequestLimits: ...  # max_prompt_chars, max_body_bytes (0: from the engines' context)
    @property
    def connect_timeout_s(self) -> float: ...  # each discovery, probe and load poll
    @property
    def health_interval_s(self) -> float: ...
    @property
    def load_interval_s(self) -> float: ...
    @property
    def events_timeout_s(self) -> float: ...  # the /kv/events long poll
    @property
    def first_byte_timeout_s(self) -> float: ...  # the patience of progress (router/fleet/progress.py)
    @property
    def eject_after(self) -> int: ...
    @property
    def ejection_s(self) -> float: ...
    @property
    def readmit_after(self) -> int: ...
    @property
    def index_ttl_s(self) -> float: ...
