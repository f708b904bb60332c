"""vLLM engines: discovered from /v1/models, load from Prometheus /metrics.

Load: `vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc` (a fraction; `vllm:gpu_cache_usage_perc` before vLLM 0.10),
summed over data-parallel engines. `vllm:cache_config_info` gives the engine's block size
and `num_gpu_blocks`, so the usage converts to blocks; vLLM does not export queued
prefill tokens (the router's own count of what it sent covers that). Progress
(router/fleet/progress.py): `vllm:prompt_tokens_total` plus `vllm:generation_tokens_total`,
which vLLM counts at every engine step.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse

from kvroute.router.contract.prometheus_text import latest_labels, metric_labels, metric_max, metric_sum
from kvroute.router.contract.protocol import LoadRecord, hash_seed
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.fleet.kinds.http import EngineHTTP, optional
from kvroute.router.fleet.kinds.probe import router_tokenizer, served_model, tokenizer_fingerprint

USAGE_SCALE_BLOCKS = 10_000  # kv_total_blocks when the engine does not say how many it has
VLLM_PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")  # counted per engine step


def instance_id(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


async def discover_foreign(http: EngineHTTP, inst, config) -> EngineInfo:
    served = await served_model(http, inst.url)
    model = served.model
    fingerprint = await tokenizer_fingerprint(http, inst.url, model, router_tokenizer(config.tokenizer))
    inst.kind_state["max_model_len"] = served.max_model_len
    return EngineInfo(instance_id=instance_id(inst.url), model=model, block_size=config.kv_event_block_size,
                      hash_seed=hash_seed(model), tokenizer=fingerprint, adapters=served.adapters,
                      model_path=served.root)


def load_record(inst, running: float, waiting: float, usage: float | None, queued_tokens: int = 0,
                progress: int = -1) -> LoadRecord:
    total = int(inst.kind_state.get("num_blocks") or USAGE_SCALE_BLOCKS)
    used = round(min(max(usage or 0.0, 0.0), 1.0) * total)
    return LoadRecord(instance=inst.id, running=int(running), waiting=int(waiting), kv_used_blocks=used,
                      kv_total_blocks=total, queued_prefill_tokens=int(queued_tokens), ts=time.time(),
                      progress=progress)


def lora_residency(text: str) -> dict:
    """The adapters a vLLM engine holds now and its slots (`max_loras`), from its latest
    `vllm:lora_requests_info{running_lora_adapters, waiting_lora_adapters, max_lora}`; {} without it."""
    labels = latest_labels(text, "vllm:lora_requests_info")
    if not labels or not str(labels.get("max_lora", "")).isdigit():
        return {}
    names = [n for key in ("running_lora_adapters", "waiting_lora_adapters")
             for n in labels.get(key, "").split(",") if n]
    return {"adapters": tuple(dict.fromkeys(names)), "adapter_slots": int(labels["max_lora"])}


def progress_of(text: str, names: tuple[str, ...]) -> int:
    """The sum of those of the counters `names` that the page has (the load record's `progress`);
    -1 when it has none of them."""
    values = [v for v in (metric_sum(text, name) for name in names) if v is not None and v >= 0]
    return int(sum(values)) if values else -1


class VllmKind:
    name = "vllm"
    has_kv_feed = False
    key_rule = "vllm"  # adapter, images and salt as vLLM's extra keys (router/contract/block_keys.py)

    async def discover(self, http: EngineHTTP, inst, config) -> EngineInfo:
        info = await discover_foreign(http, inst, config)
        cache = metric_labels(await optional(http.text(inst.url + "/metrics"), ""), "vllm:cache_config_info") or {}
        for key, field in (("block_size", "engine_block_size"), ("num_gpu_blocks", "num_blocks")):
            if str(cache.get(key, "")).isdigit():
                inst.kind_state[field] = int(cache[key])
        return info

    async def load(self, http: EngineHTTP, inst) -> LoadRecord:
        text = await http.text(inst.url + "/metrics")
        running = metric_sum(text, "vllm:num_requests_running")
        if running is None:
            raise ValueError(f"{inst.url}/metrics has no vllm:num_requests_running")
        waiting = metric_sum(text, "vllm:num_requests_waiting") or 0.0
        usage = metric_max(text, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        record = load_record(inst, running, waiting, usage, progress=progress_of(text, VLLM_PROGRESS))
        return dataclasses.replace(record, **lora_residency(text))
