"""SGLang engines: discovered from /v1/models (+ /get_server_info), load from /metrics or /get_load.

Load: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (a
fraction) when the engine runs with `--enable-metrics`; otherwise `GET /get_load`
(`num_reqs`, `num_waiting_reqs`, `num_tokens`; one object, or a list of them per
data-parallel rank, summed). The source that answered first is kept per instance.
`/get_server_info` gives `page_size` and `max_total_num_tokens` when served.

Progress (router/fleet/progress.py): `sglang:realtime_tokens_total` (every mode), which the
scheduler counts at each log interval while it runs. Not `sglang:generation_tokens_total`: SGLang
counts that when a request finishes, so it stands still during one long generation. An SGLang
without the realtime counter (or read through /get_load) reports none, and is watched by its
load reports' presence alone.
"""

from __future__ import annotations

from kvroute.router.contract.prometheus_text import metric_max, metric_sum
from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.fleet.kinds.http import EngineHTTP, NotServed, optional
from kvroute.router.fleet.kinds.vllm import discover_foreign, load_record, progress_of

SGLANG_PROGRESS = ("sglang:realtime_tokens_total",)  # counted by the scheduler while it runs, all modes


def _get_load_sum(data, key: str) -> float:
    items = data if isinstance(data, list) else [data]
    total = 0.0
    for item in items:
        value = item.get(key) if isinstance(item, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            total += value
    return total


class SglangKind:
    name = "sglang"
    has_kv_feed = False
    # SGLang keys adapters and salts by its radix tree's `extra_key`, which its events do not carry, and
    # images by pad values in the token ids: the router hashes adapter and salt into the seed, which its
    # plain events never match, and the text before a request's first image
    key_rule = "seeded"

    async def discover(self, http: EngineHTTP, inst, config) -> EngineInfo:
        info = await discover_foreign(http, inst, config)
        server = await optional(http.json(inst.url + "/get_server_info"), {})
        if isinstance(server, dict):
            page, tokens = server.get("page_size"), server.get("max_total_num_tokens")
            if isinstance(page, int) and page > 0:
                inst.kind_state["engine_block_size"] = page
                if isinstance(tokens, int) and tokens > 0:
                    inst.kind_state["num_blocks"] = tokens // page
        return info

    async def load(self, http: EngineHTTP, inst) -> LoadRecord:
        if inst.kind_state.get("load_source") != "/get_load":
            try:
                text = await http.text(inst.url + "/metrics")
            except NotServed:
                text = ""
            running = metric_sum(text, "sglang:num_running_reqs")
            if running is not None:
                inst.kind_state["load_source"] = "/metrics"
                waiting = metric_sum(text, "sglang:num_queue_reqs") or 0.0
                return load_record(inst, running, waiting, metric_max(text, "sglang:token_usage"),
                                   progress=progress_of(text, SGLANG_PROGRESS))
            if inst.kind_state.get("load_source") == "/metrics":
                raise ValueError(f"{inst.url}/metrics has no sglang:num_running_reqs")
        data = await http.json(inst.url + "/get_load")
        inst.kind_state["load_source"] = "/get_load"
        return load_record(inst, _get_load_sum(data, "num_reqs"), _get_load_sum(data, "num_waiting_reqs"), None,
                           int(_get_load_sum(data, "num_tokens")))
