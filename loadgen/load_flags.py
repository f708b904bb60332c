"""The flags of a load: the workload, arrivals, SLOs and requests, shared by `kvroute loadgen` and
`kvroute bench` (router/contract/settings.py). Defaults are the load runner's own (LoadConfig,
ArrivalConfig): check_load_args in loadgen/cli.py makes those from these."""

from __future__ import annotations

import dataclasses

from kvroute.loadgen.adapters import ASSIGNMENTS
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.client import APIS, PROMPT_FORMATS
from kvroute.loadgen.runner import LoadConfig
from kvroute.loadgen.workloads import workload_names
from kvroute.router.contract.constraints import POSITIVE, at_least
from kvroute.router.contract.settings import setting

_LOAD = {f.name: f.default for f in dataclasses.fields(LoadConfig)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadFlags:
    """workload and load"""

    workload: str | None = setting(None, f"one of {workload_names()}")
    rate: float | None = setting(None, "open loop: requests/s (session starts for multi-turn)", check=POSITIVE)
    burstiness: float = setting(ArrivalConfig().burstiness, "gamma shape of arrival gaps; 1.0 = Poisson",
                                check=POSITIVE)
    concurrency: int | None = setting(None, "closed loop: requests in flight", check=at_least(1))
    duration: float | None = setting(None, "stop sending after this many seconds", check=POSITIVE)
    num_requests: int | None = setting(None, "requests to generate (trace: the first N lines)", check=at_least(1),
                                       default_text="the workload's")
    seed: int = setting(_LOAD["seed"], "seed of the workload and the arrival process")
    slo_ttft: float | None = setting(None, "goodput SLO on TTFT, seconds", check=POSITIVE)
    slo_tpot: float | None = setting(None, "goodput SLO on TPOT, seconds", check=POSITIVE)
    model: str | None = setting(None, "model name to send", default_text="the first one /v1/models lists")
    api: str = setting(_LOAD["api"], "which OpenAI endpoint to call", choices=tuple(APIS))
    prompt_format: str = setting(_LOAD["prompt_format"], "tokens: token-id lists (exact sharing); text: decoded "
                                                         "text (re-tokenization may shift a few boundary tokens)",
                                 choices=PROMPT_FORMATS)
    request_timeout: float = setting(_LOAD["request_timeout_s"], "seconds per request", check=POSITIVE)
    temperature: float | None = setting(None, "sampling temperature to send (0 = greedy: outputs comparable across "
                                              "runs)", default_text="the server's")
    no_progress: bool = setting(False, "no progress bar on stderr")
    adapters: str | None = setting(None, "LoRA adapters to spread the requests over: each request's model names one "
                                         "(loadgen/adapters.py)", metavar="A,B,...")
    adapter_assign: str = setting("group", "with --adapters: group: one adapter per prefix group (seeded); request: "
                                           "round-robin", choices=ASSIGNMENTS)
